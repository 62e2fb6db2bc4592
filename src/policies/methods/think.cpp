// think: every token kept, the prompt's keys pruned to their most important channels (ThinK
// alone, as kvpress's ThinKPress); `full` with think=0.5.
//
// Paper: Xu et al., "ThinK: Thinner Key Cache by Query-Driven Pruning", ICLR 2025
// (arXiv 2407.21018).
//
// Rule (policies/think.cpp, the shared option think= that any method takes): at the first step
// with S > 1 new rows (the prefill), per KV head, channel c scores ||Q_w[:, c]|| x ||K[:, c]||
// (Q_w: the step's last think_window queries of the head's query group, post-RoPE; K: the rows
// held), the head keeps the D - floor(think x D) best channels, and every row held then stores
// only those (store/think_store.cpp: fewer bytes a key row, plus the channel set); attention
// over a pruned row is q . k over the kept channels. Decode rows keep their whole key.
//
// Fields: none of its own; shared: think=0.5 (its default here; 0 elsewhere), think_window=32,
// seed, kv_dtype (f16 or f32).
// Deviations from the paper: no queries passed (update(), the C API without them): the window
// rows' keys stand in for their queries; the channel set is chosen once per cache (a later
// prefill chunk reuses it); values are never pruned (the paper's value pruning is an appendix
// variant).
#include "policies/fields.h"
#include "policies/methods.h"
#include "policies/policy.h"

namespace vq::detail {

// The registry entry (methods.h, method_card): what `veloxquant list` and the README table
// show, the field table and the shared field groups.
constexpr std::string_view kCard = R"(
id: think
prefix: -
summary: ThinK: keeps every token; at prefill each KV head keeps only the key channels the
  observation window's queries weigh most (||Q_w[:, c]|| ||K[:, c]||), decode keys whole
paper: Xu et al., ThinK: Thinner Key Cache by Query-Driven Pruning, ICLR 2025
disposition: prune key channels
score: query-window x key channel norms
budget: none (all tokens, fewer key channels)
deviations: without queries the window's keys stand in for them; one channel set per cache
paper config: `think:think=0.5,think_window=32` (kvpress's ThinKPress(0.5), window 32)
shared defaults: think=0.5
prefill only: yes
)";

MethodInfo think_method() { return method_card(kCard, nullptr, &make_keep_all_policy); }

}  // namespace vq::detail
