// The packed-KV attention rows of `bench kernels` (roofline.h): one decode step's query over N
// positions of a model's KV heads, through store/packed_attention.h's kernels (scores per row
// or per KIVI key group, the engine's softmax, weighted value sums), for f16, q8_0, q4_0, KIVI
// 2-bit and KIVI 4-bit rows laid out as the stores keep them (random codes, finite fp16
// parameters). Heads are split over the threads; as many heads as one step has (layers x KV heads),
// but at least enough to exceed `working_set` bytes, so the rows come from memory. Bytes per head:
// roofline.h's table.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/model/model.h"

namespace vq::eval {

// Channels per q8_0/q4_0 block and per KIVI group (KIVI's default), tokens per KIVI key group.
inline constexpr std::int64_t kAttentionGroup = 32;

struct AttentionPlan {
  engine::ModelConfig config;          // head_dim a multiple of kAttentionGroup
  std::vector<std::int64_t> contexts;  // N, multiples of kAttentionGroup
  int threads = 1;
  int repeats = 1;  // timed steps, best kept (one untimed first)
  std::int64_t working_set = 0;
  std::uint64_t seed = 1;
};

struct AttentionMeasure {
  std::string format;  // f16, q8_0, q4_0, kivi2, kivi4
  std::int64_t positions = 0, head_dim = 0, queries_per_head = 0;
  std::int64_t heads = 0, heads_per_step = 0;  // measured, and in one decode step
  std::int64_t bytes_per_head = 0, bytes = 0;  // read per step: one head, all measured heads
  double time_s = 0;                           // one step over the measured heads
};

// Measures every format at every context, calling `row` after each.
void measure_attention(const AttentionPlan& plan,
                       const std::function<void(const AttentionMeasure&)>& row);

}  // namespace vq::eval
