// One rule for a method spec that meets a --budget-like flag, shared by every command
// (bench decode, demo, eval, ...):
//
//   - a budget written in the spec (budget=B, or the method's own budget field such as
//     h2o_budget=B, or streaming_llm's window_size) wins over the flag's default;
//   - an explicit flag applies to a spec that writes no budget;
//   - an explicit flag that contradicts a budget written in the spec is an error naming both.
//
// "Written" is textual: the spec's keys, not whether the value differs from the method's
// default (h2o:budget=256 writes 256 even though 256 is h2o's default).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "veloxquant/config.h"

namespace vq {

// Whether `spec` writes its method's token budget: a key "budget", or a key naming a field that
// with_token_budget() changes (h2o_budget, stream_window_size, ...). False for methods without a
// budget. Throws what CacheConfig::parse throws for a bad spec.
bool spec_writes_budget(std::string_view spec);

// The config a command runs for `spec` and a budget flag `flag_name` (e.g. "--budget"):
//   flag_value: the flag's value when the user gave the flag (explicit), else nullopt;
//   flag_default: the flag's default, used when the flag was not given and the spec writes no
//                 budget (nullopt: keep the method's own default).
// Methods without a token budget (full) get neither. Throws Error(kInvalidArgument) when an
// explicit flag contradicts the spec: "--budget 32 contradicts budget 16 written in the spec
// 'h2o:budget=16'; drop one of them", and what with_token_budget throws for a budget the method
// cannot take (naming the flag).
CacheConfig config_with_flag_budget(std::string_view spec, std::optional<std::int64_t> flag_value,
                                    std::optional<std::int64_t> flag_default,
                                    std::string_view flag_name = "--budget");

}  // namespace vq
