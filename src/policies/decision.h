// Policies decide, the cache applies. A policy never mutates a row store: everything it decides
// about a head's rows is a Decision, handed to the layer's DecisionSink, which LayerCache
// implements (src/cache/cache.cpp, StoreApplier::apply: the one place where the stores change).
//
// Decisions are applied in the order they are made, as they are made, because a later decision
// of the same step reads the rows as the earlier ones left them: a blend changes a survivor's
// value (and key, with merge_keys) and position, and kSettle quantizes the rows of a quantizing
// store (KIVI), so the next token is scored against the quantized rows exactly as when tokens
// are fed one at a time. Within a step a head's decisions are, in order: for every token (or
// once for a step decided at once) the dispositions of its losers (kBlend, kSpread, kDemote; a
// dropped row needs none) and one kSettle with the rows still alive; then one kKeep with the
// rows kept. A policy that keeps every row sends one kKeepAll instead.
#pragma once

#include <cstdint>

namespace vq::detail {

struct Decision {
  enum class Kind {
    // Row `loser` is merged into row `target`: value_t <- (1 - weight) value_t + weight value_e
    // in fp32 (keys likewise when `keys`), and pos_t <- max(pos_t, pos_e).
    kBlend,
    // Row `loser`'s value is spread over the n_rows rows `rows`: value_t <- value_t + value_e / m
    // (m = n_rows) for each of them. Keys and positions stay.
    kSpread,
    // Row `target` moves to the low-bit tier (demote=) at the next kKeep instead of leaving;
    // `score` ranks it in the tier.
    kDemote,
    // The decisions for one token (or one cut) are complete: `rows` (n_rows of them, strictly
    // increasing physical indices) are still alive. Quantizing stores quantize here.
    kSettle,
    // End of the step (or of a cut outside a step): the store keeps exactly `rows`, in order.
    kKeep,
    // kSettle then kKeep with every row alive (a policy that keeps all rows), without a list.
    kKeepAll,
    // After the step's kKeep (think=, ThinK): the store's first `target` rows keep only the
    // n_rows key channels `channels` (strictly increasing indices; RowStore::prune_keys).
    kPruneKeys,
  };
  Kind kind = Kind::kSettle;
  std::int64_t head = 0;    // b * n_kv_heads + kv head
  std::int64_t target = -1;  // kBlend: the survivor; kDemote: the demoted row; kPruneKeys: the
                             // number of leading rows pruned
  std::int64_t loser = -1;   // kBlend, kSpread: the evicted row
  float weight = 0.0f;       // kBlend
  bool keys = false;         // kBlend
  float score = 0.0f;        // kDemote
  const std::int64_t* rows = nullptr;  // kSpread, kSettle, kKeep (valid during apply only)
  const std::int32_t* channels = nullptr;  // kPruneKeys (valid during apply only)
  std::int64_t n_rows = 0;
};

// Applies decisions to the stores of one layer (implemented by the cache).
class DecisionSink {
 public:
  virtual ~DecisionSink() = default;
  virtual void apply(const Decision& decision) = 0;
};

}  // namespace vq::detail
