// One function per method file, returning that method's registry entry.
#pragma once

#include <memory>

#include "veloxquant/registry.h"

namespace vq::detail {

class Policy;
// The policy of `full` (and `kivi`): keeps every row.
std::unique_ptr<Policy> make_keep_all_policy();

MethodInfo full_method();
MethodInfo streaming_llm_method();
MethodInfo h2o_method();
MethodInfo tova_method();
MethodInfo snapkv_method();
MethodInfo pyramidkv_method();
MethodInfo squeeze_method();
MethodInfo chunkkv_method();
MethodInfo keyformer_method();
MethodInfo morphkv_method();
MethodInfo cam_method();
MethodInfo kivi_method();
MethodInfo knorm_method();
MethodInfo keydiff_method();

}  // namespace vq::detail
