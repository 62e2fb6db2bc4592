// The plain (fp32 / fp16) row store against a reference model of what it must hold: a list of
// rows in order. Random appends and keep() cuts of every shape (one row from the front, just
// after a few sinks, from the end, runs, scattered rows, large cuts) must leave exactly the
// reference's rows, in order, with their positions, whichever side of a cut the store moves;
// rows() must stay contiguous; written rows must land on the right row.
#include <cstring>
#include <random>
#include <vector>

#include "store/store.h"
#include "test_util.h"

namespace vq {
namespace {

struct RefRow {
  std::vector<float> k, v;
  std::int32_t pos;
};

void expect_same(const detail::RowStore& s, const std::vector<RefRow>& ref, std::int64_t D,
                 DType dtype, const std::string& what) {
  ASSERT_EQ(s.size(), static_cast<std::int64_t>(ref.size())) << what;
  const HeadRows rows = s.rows();
  ASSERT_EQ(rows.n_rows, static_cast<std::int64_t>(ref.size())) << what;
  std::vector<float> k(static_cast<std::size_t>(D)), v(k.size());
  for (std::size_t r = 0; r < ref.size(); ++r) {
    ASSERT_EQ(rows.positions[r], ref[r].pos) << what << " row " << r;
    s.read_key(static_cast<std::int64_t>(r), k.data());
    s.read_value(static_cast<std::int64_t>(r), v.data());
    // The view's memory is the same rows, contiguous at the row stride.
    std::vector<float> vk(k.size());
    rows.load_key(static_cast<std::int64_t>(r), vk.data());
    for (std::int64_t d = 0; d < D; ++d) {
      const std::size_t i = static_cast<std::size_t>(d);
      // fp16 storage rounds the input once: the reference rows are fp16-exact values.
      ASSERT_EQ(k[i], ref[r].k[i]) << what << " key row " << r << " channel " << d;
      ASSERT_EQ(v[i], ref[r].v[i]) << what << " value row " << r << " channel " << d;
      ASSERT_EQ(vk[i], ref[r].k[i]) << what << " view key row " << r;
    }
  }
  (void)dtype;
}

TEST(PlainStore, KeepsExactlyTheRowsAskedInOrderWhicheverSideMoves) {
  std::mt19937 rng(7);
  for (const DType dtype : {DType::kF32, DType::kF16}) {
    for (const std::int64_t D : {1, 8, 64}) {
      auto s = detail::make_plain_store(dtype, D);
      std::vector<RefRow> ref;
      std::int32_t pos = 0;
      for (int step = 0; step < 600; ++step) {
        // Append 1 row (mostly) or a chunk; values are small integers over 8, exact in fp16.
        const std::int64_t S = step % 50 == 0 ? 40 : 1;
        std::vector<float> k(static_cast<std::size_t>(S * D)), v(k.size());
        for (auto& x : k) x = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 8.0f;
        for (auto& x : v) x = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 8.0f;
        s->append(TensorRef::f32(k.data(), 1, 1, S, D), TensorRef::f32(v.data(), 1, 1, S, D), 0,
                  0, pos);
        for (std::int64_t t = 0; t < S; ++t) {
          RefRow row;
          row.k.assign(k.begin() + t * D, k.begin() + (t + 1) * D);
          row.v.assign(v.begin() + t * D, v.begin() + (t + 1) * D);
          row.pos = pos + static_cast<std::int32_t>(t);
          ref.push_back(row);
        }
        pos += static_cast<std::int32_t>(S);
        // A cut of one of several shapes once the store holds more than 100 rows.
        const std::int64_t n = static_cast<std::int64_t>(ref.size());
        std::vector<std::int64_t> keep;
        if (n > 100) {
          const int shape = static_cast<int>(rng() % 6);
          for (std::int64_t i = 0; i < n; ++i) {
            bool drop = false;
            if (shape == 0) drop = i == 4;                      // just after four sinks
            if (shape == 1) drop = i == 0;                      // the oldest
            if (shape == 2) drop = i == n - 2;                  // near the end
            if (shape == 3) drop = i == static_cast<std::int64_t>(rng() % n);  // anywhere
            if (shape == 4) drop = i >= 10 && i < 40;           // a run
            if (shape == 5) drop = rng() % 3 == 0;              // scattered, a large cut
            if (!drop) keep.push_back(i);
          }
          if (static_cast<std::int64_t>(keep.size()) < n) {
            s->keep(keep.data(), static_cast<std::int64_t>(keep.size()));
            std::vector<RefRow> next;
            for (const std::int64_t i : keep) next.push_back(ref[static_cast<std::size_t>(i)]);
            ref = std::move(next);
          }
        }
        const std::string what = std::string(dtype == DType::kF32 ? "f32" : "f16") + " D " +
                                 std::to_string(D) + " step " + std::to_string(step);
        expect_same(*s, ref, D, dtype, what);
        if (HasFatalFailure()) return;
        // A write lands on its row (the store's row index, not its slot).
        if (!ref.empty()) {
          const std::size_t r = rng() % ref.size();
          std::vector<float> w(static_cast<std::size_t>(D), static_cast<float>(step % 7));
          s->write_key(static_cast<std::int64_t>(r), w.data());
          s->set_position(static_cast<std::int64_t>(r), ref[r].pos + 1000000);
          ref[r].k = w;
          ref[r].pos += 1000000;
          expect_same(*s, ref, D, dtype, what + " after a write");
          if (HasFatalFailure()) return;
        }
        // Bytes held: the payload is the rows kept; what is allocated covers them.
        EXPECT_EQ(s->bytes(), static_cast<std::int64_t>(ref.size()) * D * 2 *
                                  (dtype == DType::kF32 ? 4 : 2));
        EXPECT_GE(s->allocated_bytes(), s->bytes());
      }
    }
  }
}

}  // namespace
}  // namespace vq
