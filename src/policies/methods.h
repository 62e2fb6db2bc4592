// One function per method file, returning that method's registry entry.
#pragma once

#include "veloxquant/registry.h"

namespace vq::detail {

MethodInfo full_method();
MethodInfo streaming_llm_method();
MethodInfo h2o_method();
MethodInfo tova_method();
MethodInfo morphkv_method();
MethodInfo cam_method();

}  // namespace vq::detail
