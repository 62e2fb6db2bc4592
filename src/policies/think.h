// ThinK's key-channel pruning (think=, the `think` group of shared options): a policy that wraps
// any method's policy. See think.cpp for the rule.
#pragma once

#include <memory>

#include "policies/policy.h"

namespace vq::detail {

// `inner` as it is when the config's think is 0 (or the method has no think field); otherwise
// a policy that runs `inner` and then prunes the key channels of the rows held after every step
// with S > 1 new rows (policies/decision.h, kPruneKeys).
std::unique_ptr<Policy> with_key_pruning(const PolicyContext& context,
                                         std::unique_ptr<Policy> inner);

}  // namespace vq::detail
