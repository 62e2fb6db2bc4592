// GGUF: dequantization of one hand-built block per type (expected values worked out by hand
// from the block layouts in engine/quants.h, which follow ggml's definitions), the Q8_0 / BF16
// encoders, writer -> reader round trips for every metadata type and tensor type, and the
// errors malformed files give (hand-assembled bytes and every truncation of a valid file):
// Error(kFileError) naming the file and what was expected, never a crash.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "engine/tokenizers/bpe_merge.h"
#include "engine/formats/gguf.h"
#include "engine/run/gguf_convert.h"
#include "engine/tokenizers/gguf_tokenizer.h"
#include "engine/formats/gguf_writer.h"
#include "engine/tokenizers/pretokenize.h"
#include "engine/compute/quants.h"
#include "engine_test_util.h"
#include "tokenizer_scaling.h"
#include "veloxquant/errors.h"

namespace vq {
namespace {
using engine::dequantize;
using engine::GgmlType;
using engine::GgufFile;
using engine::GgufType;
using engine::GgufValue;
using engine::GgufWriter;

std::vector<float> deq(GgmlType t, const std::vector<std::uint8_t>& block, std::int64_t n) {
  std::vector<float> out(static_cast<std::size_t>(n));
  dequantize(t, block.data(), out.data(), n);
  return out;
}

TEST(GgufDequant, F16AndBf16Values) {
  // binary16: 0x3C00 = 1; 0xC000 = -2; 0x3555 = 2^(13-15) * (1 + 341/1024); 0x0001 = 2^-24.
  const std::vector<std::uint8_t> f16 = {0x00, 0x3C, 0x00, 0xC0, 0x55, 0x35, 0x01, 0x00};
  const auto a = deq(GgmlType::kF16, f16, 4);
  EXPECT_EQ(a[0], 1.0f);
  EXPECT_EQ(a[1], -2.0f);
  EXPECT_EQ(a[2], 0.333251953125f);
  EXPECT_EQ(a[3], std::ldexp(1.0f, -24));
  // bfloat16: 0x3F80 = 1; 0xC0A0 = -(2^2 * 1.25) = -5; 0x4049 = 2 * (1 + 73/128) = 3.140625.
  const std::vector<std::uint8_t> bf16 = {0x80, 0x3F, 0xA0, 0xC0, 0x49, 0x40};
  const auto b = deq(GgmlType::kBF16, bf16, 3);
  EXPECT_EQ(b[0], 1.0f);
  EXPECT_EQ(b[1], -5.0f);
  EXPECT_EQ(b[2], 3.140625f);
}

TEST(GgufDequant, Q8_0Block) {
  // d = f16 0x3800 = 0.5; x = d * q.
  std::vector<std::uint8_t> blk(34, 0);
  blk[0] = 0x00;
  blk[1] = 0x38;
  const std::int8_t q[] = {-128, -1, 0, 1, 127, 2};
  for (int j = 0; j < 6; ++j) blk[2 + j] = static_cast<std::uint8_t>(q[j]);
  const auto x = deq(GgmlType::kQ8_0, blk, 32);
  const float want[] = {-64.0f, -0.5f, 0.0f, 0.5f, 63.5f, 1.0f};
  for (int j = 0; j < 6; ++j) EXPECT_EQ(x[j], want[j]) << j;
  for (int j = 6; j < 32; ++j) EXPECT_EQ(x[j], 0.0f) << j;
}

TEST(GgufDequant, Q4_0Block) {
  // d = f16 0x4000 = 2; x[j] = d * (low nibble - 8), x[j + 16] = d * (high nibble - 8).
  std::vector<std::uint8_t> blk(18, 0x88);  // every nibble 8: zeros
  blk[0] = 0x00;
  blk[1] = 0x40;
  blk[2] = 0x9F;   // qs[0]: low 15 -> x[0] = 14, high 9 -> x[16] = 2
  blk[3] = 0x08;   // qs[1]: low 8 -> x[1] = 0, high 0 -> x[17] = -16
  blk[17] = 0x1E;  // qs[15]: low 14 -> x[15] = 12, high 1 -> x[31] = -14
  const auto x = deq(GgmlType::kQ4_0, blk, 32);
  EXPECT_EQ(x[0], 14.0f);
  EXPECT_EQ(x[16], 2.0f);
  EXPECT_EQ(x[1], 0.0f);
  EXPECT_EQ(x[17], -16.0f);
  EXPECT_EQ(x[15], 12.0f);
  EXPECT_EQ(x[31], -14.0f);
  EXPECT_EQ(x[5], 0.0f);
}

TEST(GgufDequant, Q4_KBlock) {
  // d = 1 (0x3C00), dmin = 0.5 (0x3800). scales[12] at byte 4, qs[128] at byte 16.
  std::vector<std::uint8_t> blk(144, 0);
  blk[1] = 0x3C;
  blk[3] = 0x38;
  std::uint8_t* sc = blk.data() + 4;
  std::uint8_t* qs = blk.data() + 16;
  sc[0] =
      0x43;  // sub-block 0 scale = 0x43 & 63 = 3; its top bits (1) are sub-block 4's scale bits 4-5
  sc[4] = 0x02;   // sub-block 0 min = 2; top bits 0 -> sub-block 4's min bits 4-5 = 0
  sc[1] = 0x05;   // sub-block 1 scale 5
  sc[5] = 0x00;   // sub-block 1 min 0
  sc[8] = 0x21;   // sub-block 4: scale = (1) | 1 << 4 = 17, min = (2) | 0 << 4 = 2
  qs[0] = 0x2A;   // low 10 -> x[0] (sub-block 0), high 2 -> x[32] (sub-block 1)
  qs[64] = 0x07;  // low 7 -> x[128] (sub-block 4), high 0 -> x[160] (sub-block 5: scale 0)
  const auto x = deq(GgmlType::kQ4_K, blk, 256);
  EXPECT_EQ(x[0], 1.0f * 3 * 10 - 0.5f * 2);  // 29
  EXPECT_EQ(x[1], -1.0f);                     // nibble 0: -dmin * m
  EXPECT_EQ(x[32], 5.0f * 2);                 // 10
  EXPECT_EQ(x[33], 0.0f);
  EXPECT_EQ(x[128], 1.0f * 17 * 7 - 0.5f * 2);  // 118
  EXPECT_EQ(x[129], -1.0f);
  EXPECT_EQ(x[160], 0.0f);
  EXPECT_EQ(x[64], 0.0f);  // sub-block 2: scale 0, min 0
}

TEST(GgufDequant, Q6_KBlock) {
  // ql[128] at 0, qh[64] at 128, int8 scales[16] at 192, f16 d at 208 (0x3400 = 0.25).
  std::vector<std::uint8_t> blk(210, 0);
  blk[208] = 0x00;
  blk[209] = 0x34;
  auto* scales = reinterpret_cast<std::int8_t*>(blk.data() + 192);
  scales[0] = 4;
  scales[2] = -2;
  scales[4] = 1;
  scales[6] = 3;
  scales[8] = 10;
  blk[0] = 0x5A;    // ql[0]: low 10 (x[0]), high 5 (x[64])
  blk[32] = 0x0F;   // ql[32]: low 15 (x[32]), high 0 (x[96])
  blk[128] = 0xE6;  // qh[0] = 0b11'10'01'10: x[0] +2<<4, x[32] +1<<4, x[64] +2<<4, x[96] +3<<4
  blk[64] = 0x01;   // second half: ql[64] low 1 -> x[128]
  const auto x = deq(GgmlType::kQ6_K, blk, 256);
  EXPECT_EQ(x[0], 0.25f * 4 * ((10 | 32) - 32));    // 10
  EXPECT_EQ(x[32], 0.25f * -2 * ((15 | 16) - 32));  // 0.5
  EXPECT_EQ(x[64], 0.25f * 1 * ((5 | 32) - 32));    // 1.25
  EXPECT_EQ(x[96], 0.25f * 3 * ((0 | 48) - 32));    // 12
  EXPECT_EQ(x[1], 0.25f * 4 * -32);                 // -32
  EXPECT_EQ(x[16], 0.0f);                           // scales[1] = 0
  EXPECT_EQ(x[128], 0.25f * 10 * (1 - 32));         // -77.5
  EXPECT_EQ(x[10], -32.0f);
}

TEST(GgufQuantize, Q8_0AndBf16Rounding) {
  // max |x| = 63.5 -> d = 0.5 exactly; q = round-half-away(x / d).
  std::vector<float> x(32, 0.0f);
  x[0] = 63.5f;
  x[1] = -31.75f;  // -63.5 -> -64
  x[2] = 0.25f;    // 0.5 -> 1
  x[3] = -0.2f;    // -0.4 -> 0
  std::vector<std::uint8_t> blk(34);
  engine::quantize(GgmlType::kQ8_0, x.data(), blk.data(), 32);
  EXPECT_EQ(blk[0], 0x00);
  EXPECT_EQ(blk[1], 0x38);  // f16 0.5
  EXPECT_EQ(static_cast<std::int8_t>(blk[2]), 127);
  EXPECT_EQ(static_cast<std::int8_t>(blk[3]), -64);
  EXPECT_EQ(static_cast<std::int8_t>(blk[4]), 1);
  EXPECT_EQ(static_cast<std::int8_t>(blk[5]), 0);
  // An all-zero block stores d = 0 and q = 0.
  std::vector<float> zero(32, 0.0f);
  engine::quantize(GgmlType::kQ8_0, zero.data(), blk.data(), 32);
  for (const std::uint8_t b : blk) EXPECT_EQ(b, 0);
  // BF16 keeps the top 16 bits, rounding to nearest even: 1 + 2^-8 is halfway between 1 and
  // 1 + 2^-7 (even: 1); 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6 (even: the latter).
  EXPECT_EQ(engine::float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);
  EXPECT_EQ(engine::float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);
  EXPECT_EQ(engine::float_to_bf16(-5.0f), 0xC0A0);
  EXPECT_THROW(engine::quantize(GgmlType::kQ4_K, x.data(), blk.data(), 32), Error);
}

// Little-endian byte assembly for hand-made files.
struct Bytes {
  std::string s;
  Bytes& u32(std::uint32_t v) { return put(v); }
  Bytes& u64(std::uint64_t v) { return put(v); }
  Bytes& str(const std::string& v) {
    u64(v.size());
    s += v;
    return *this;
  }
  template <typename T>
  Bytes& put(T v) {
    s.append(reinterpret_cast<const char*>(&v), sizeof(T));
    return *this;
  }
  Bytes& header(std::uint32_t version, std::uint64_t n_tensors, std::uint64_t n_kv) {
    s += "GGUF";
    return u32(version).u64(n_tensors).u64(n_kv);
  }
};

GgufFile parse(const std::string& bytes, const std::string& name = "mem.gguf") {
  return GgufFile::parse(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size(), name);
}

// The message of the kFileError parsing `bytes` gives ("" when it parses).
std::string parse_error(const std::string& bytes) {
  try {
    parse(bytes, "bad.gguf");
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kFileError) << e.what();
    EXPECT_NE(std::string(e.what()).find("bad.gguf"), std::string::npos) << e.what();
    return e.what();
  }
  return "";
}

TEST(GgufReader, HandAssembledFile) {
  // Version 2 file: two metadata pairs, one F32 tensor [2, 3] at offset 0, alignment 32.
  Bytes b;
  b.header(2, 1, 2);
  b.str("general.architecture").u32(8).str("llama");
  b.str("n").u32(10).u64(7);
  b.str("w").u32(2).u64(2).u64(3).u32(0).u64(0);
  while (b.s.size() % 32 != 0) b.s += '\0';
  const std::size_t data_at = b.s.size();
  for (int i = 0; i < 6; ++i) b.put(static_cast<float>(i) + 0.5f);
  const GgufFile g = parse(b.s);
  EXPECT_EQ(g.version(), 2u);
  EXPECT_EQ(g.data_offset(), data_at);
  EXPECT_EQ(g.get_string("general.architecture"), "llama");
  EXPECT_EQ(g.get_int("n"), 7);
  ASSERT_EQ(g.tensors().size(), 1u);
  const engine::GgufTensor& t = g.tensors()[0];
  EXPECT_EQ(t.dims, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(t.n_bytes, 24);
  float v[6];
  std::memcpy(v, t.data, 24);
  EXPECT_EQ(v[5], 5.5f);
  EXPECT_THROW(g.get_string("n"), Error);
  EXPECT_THROW(g.get_int("missing"), Error);
}

TEST(GgufReader, WriterRoundTripEveryValueAndTensorType) {
  GgufWriter w;
  auto scalar = [](GgufType t, std::int64_t i, double f) {
    GgufValue v;
    v.type = t;
    v.i = i;
    v.u = static_cast<std::uint64_t>(i);
    v.f = f;
    return v;
  };
  w.set("u8", scalar(GgufType::kU8, 200, 0));
  w.set("i8", scalar(GgufType::kI8, -100, 0));
  w.set("u16", scalar(GgufType::kU16, 60000, 0));
  w.set("i16", scalar(GgufType::kI16, -30000, 0));
  w.set("u32", GgufValue::u32(4000000000u));
  w.set("i32", GgufValue::i32(-2000000000));
  w.set("u64", scalar(GgufType::kU64, std::int64_t{1} << 40, 0));
  w.set("i64", scalar(GgufType::kI64, -(std::int64_t{1} << 40), 0));
  w.set("f32", GgufValue::f32(0.125f));
  w.set("f64", scalar(GgufType::kF64, 0, 1e-300));
  w.set("bool", GgufValue::boolean(true));
  w.set("str", GgufValue::str("h\xC3\xA9llo"));
  w.set("strs", GgufValue::string_array({"a", "",
                                         "\xE2\x96\x81"
                                         "b"}));
  w.set("f32s", GgufValue::f32_array({1.5f, -2.0f}));
  w.set("i32s", GgufValue::i32_array({-1, 7}));
  GgufValue nested;
  nested.type = GgufType::kArray;
  nested.elem = GgufType::kArray;
  nested.items = {GgufValue::i32_array({1, 2}), GgufValue::string_array({"x"})};
  w.set("nested", nested);
  std::vector<float> vals(64);
  for (std::size_t i = 0; i < vals.size(); ++i) vals[i] = static_cast<float>(i) * 0.25f - 8.0f;
  for (const GgmlType t : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0}) {
    w.add_tensor(std::string("t_") + engine::type_info(t).name, {32, 2}, t, vals.data());
  }
  // Types the writer cannot encode are stored from raw blocks.
  std::vector<std::uint8_t> q4k(144 * 2), q6k(210), q40(18 * 2);
  for (std::size_t i = 0; i < q4k.size(); ++i) q4k[i] = static_cast<std::uint8_t>(i * 7);
  for (std::size_t i = 0; i < q6k.size(); ++i) q6k[i] = static_cast<std::uint8_t>(i * 5);
  for (std::size_t i = 0; i < q40.size(); ++i) q40[i] = static_cast<std::uint8_t>(i * 3);
  w.add_raw_tensor("q4k", {256, 2}, GgmlType::kQ4_K, q4k);
  w.add_raw_tensor("q6k", {256}, GgmlType::kQ6_K, q6k);
  w.add_raw_tensor("q40", {64}, GgmlType::kQ4_0, q40);
  EXPECT_THROW(w.add_tensor("bad", {16}, GgmlType::kQ8_0, vals.data()), Error);
  EXPECT_THROW(w.add_raw_tensor("q40", {64}, GgmlType::kQ4_0, q40), Error);

  const auto bytes = w.serialize();
  const GgufFile g = GgufFile::parse(bytes.data(), bytes.size(), "rt.gguf");
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.metadata().size(), 16u);
  EXPECT_EQ(g.get_int("u8"), 200);
  EXPECT_EQ(g.get_int("i8"), -100);
  EXPECT_EQ(g.get_int("u16"), 60000);
  EXPECT_EQ(g.get_int("i16"), -30000);
  EXPECT_EQ(g.get_int("u32"), 4000000000LL);
  EXPECT_EQ(g.get_int("i32"), -2000000000LL);
  EXPECT_EQ(g.get_int("u64"), std::int64_t{1} << 40);
  EXPECT_EQ(g.get_int("i64"), -(std::int64_t{1} << 40));
  EXPECT_EQ(g.get_float("f32"), 0.125);
  EXPECT_EQ(g.get_float("f64"), 1e-300);
  EXPECT_TRUE(g.get_bool_or("bool", false));
  EXPECT_EQ(g.get_string("str"), "h\xC3\xA9llo");
  EXPECT_EQ(g.get_array("strs", "string").strings, (std::vector<std::string>{"a", "",
                                                                             "\xE2\x96\x81"
                                                                             "b"}));
  EXPECT_EQ(g.get_array("f32s", "float").floats, (std::vector<double>{1.5, -2.0}));
  EXPECT_EQ(g.get_array("i32s", "integer").ints, (std::vector<std::int64_t>{-1, 7}));
  ASSERT_EQ(g.find("nested")->items.size(), 2u);
  EXPECT_EQ(g.find("nested")->items[1].strings, std::vector<std::string>{"x"});
  EXPECT_THROW(g.get_array("strs", "float"), Error);
  EXPECT_EQ(g.find("u8")->type, GgufType::kU8);
  EXPECT_EQ(g.find("f64")->type, GgufType::kF64);

  ASSERT_EQ(g.tensors().size(), 7u);
  for (const engine::GgufTensor& t : g.tensors()) {
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.data - bytes.data() - g.data_offset()) % 32, 0u);
  }
  auto values = [&](const char* name) {
    const engine::GgufTensor* t = g.find_tensor(name);
    EXPECT_NE(t, nullptr) << name;
    std::vector<float> out(static_cast<std::size_t>(t->n_values));
    dequantize(t->type, t->data, out.data(), t->n_values);
    return out;
  };
  // Every value is a multiple of 0.25 in [-8, 7.75]: exact in F16 and BF16; in Q8_0 each block
  // has d = 8/127, so the error is at most d / 2.
  EXPECT_EQ(values("t_F32"), vals);
  EXPECT_EQ(values("t_F16"), vals);
  EXPECT_EQ(values("t_BF16"), vals);
  const auto q8 = values("t_Q8_0");
  for (std::size_t i = 0; i < vals.size(); ++i) EXPECT_NEAR(q8[i], vals[i], 8.0 / 127 / 2 + 1e-6);
  EXPECT_EQ(std::memcmp(g.find_tensor("q4k")->data, q4k.data(), q4k.size()), 0);
  EXPECT_EQ(std::memcmp(g.find_tensor("q6k")->data, q6k.data(), q6k.size()), 0);
  EXPECT_EQ(g.find_tensor("q40")->type, GgmlType::kQ4_0);

  // Every truncation that cuts into the header or a tensor's data is an error naming the file,
  // never a crash (the padding after the last tensor is optional).
  const std::string whole(bytes.begin(), bytes.end());
  std::size_t end = 0;
  for (const engine::GgufTensor& t : g.tensors()) {
    end = std::max(end, static_cast<std::size_t>(t.data - bytes.data() + t.n_bytes));
  }
  EXPECT_GT(end, whole.size() - 32);
  for (std::size_t n = 0; n < end; n += (n < 600 ? 1 : 29)) {
    SCOPED_TRACE(n);
    EXPECT_NE(parse_error(whole.substr(0, n)), "");
  }
}

TEST(GgufReader, MalformedFilesNameWhatIsWrong) {
  auto expect = [](const std::string& bytes, const std::string& needle) {
    const std::string msg = parse_error(bytes);
    EXPECT_NE(msg.find(needle), std::string::npos) << "message: " << msg;
  };
  expect("GGML", "expected the magic 'GGUF'");
  expect("GG", "2 bytes");
  expect(Bytes().header(1, 0, 0).s, "version 1 is not supported");
  expect(Bytes().header(4, 0, 0).s, "expected 2 or 3, found 4");
  expect(Bytes().header(3, 0, 1).s, "declares 1 metadata pairs");
  // A key whose length runs past the end.
  expect(Bytes().header(3, 0, 1).u64(1000).s + std::string(12, 'k'), "past the end");
  // Unknown value type.
  expect(Bytes().header(3, 0, 1).str("k").u32(13).u32(0).s, "unknown value type 13");
  // An array declaring more elements than bytes follow.
  expect(Bytes().header(3, 0, 1).str("a").u32(9).u32(4).u64(1ULL << 60).s, "past the end");
  expect(Bytes().header(3, 0, 1).str("a").u32(9).u32(77).u64(0).s, "unknown array element type");
  // A bool that is neither 0 nor 1.
  expect(Bytes().header(3, 0, 1).str("b").u32(7).put<std::uint8_t>(2).s, "expected 0 or 1");
  // Duplicate keys.
  expect(Bytes().header(3, 0, 2).str("k").u32(4).u32(1).str("k").u32(4).u32(2).s,
         "duplicate metadata key 'k'");
  // Alignment not a power of two.
  expect(Bytes().header(3, 0, 1).str("general.alignment").u32(4).u32(24).s, "power of two");
  // Tensor infos: too many dimensions, zero dimension, overflowing element count, unknown type,
  // a row that does not fill whole blocks, misaligned and out-of-range offsets, overlaps.
  auto one_tensor = [](std::uint32_t n_dims, std::vector<std::uint64_t> dims, std::uint32_t type,
                       std::uint64_t offset, std::size_t data_bytes) {
    Bytes b;
    b.header(3, 1, 0).str("t").u32(n_dims);
    for (const auto d : dims) b.u64(d);
    b.u32(type).u64(offset);
    while (b.s.size() % 32 != 0) b.s += '\0';
    b.s += std::string(data_bytes, '\0');
    return b.s;
  };
  expect(one_tensor(5, {1, 1, 1, 1, 1}, 0, 0, 4), "1 to 4 dimensions, found 5");
  expect(one_tensor(2, {4, 0}, 0, 0, 16), "must be positive");
  expect(one_tensor(2, {1ULL << 40, 1ULL << 40}, 0, 0, 16), "overflows");
  expect(one_tensor(1, {32}, 13, 0, 256), "has type Q5_K");
  expect(one_tensor(1, {32}, 99, 0, 256), "has type type 99");
  expect(one_tensor(1, {48}, 8, 0, 256), "not a multiple");
  expect(one_tensor(1, {4}, 0, 8, 64), "not a multiple of the alignment 32");
  expect(one_tensor(1, {64}, 0, 0, 100), "ends past the end of the file");
  expect(one_tensor(1, {4}, 0, 1ULL << 62, 64), "ends past the end of the file");
  {
    Bytes b;
    b.header(3, 2, 0);
    b.str("a").u32(1).u64(16).u32(0).u64(0);  // 64 bytes at 0
    b.str("b").u32(1).u64(8).u32(0).u64(32);  // from 32: overlaps a
    while (b.s.size() % 32 != 0) b.s += '\0';
    b.s += std::string(128, '\0');
    expect(b.s, "overlap");
  }
  {
    Bytes b;
    b.header(3, 2, 0);
    b.str("a").u32(1).u64(8).u32(0).u64(0);
    b.str("a").u32(1).u64(8).u32(0).u64(32);
    while (b.s.size() % 32 != 0) b.s += '\0';
    b.s += std::string(64, '\0');
    expect(b.s, "duplicate tensor name 'a'");
  }
  // A tensor whose data section start lies past the end.
  expect(Bytes().header(3, 1, 0).str("t").u32(1).u64(4).u32(0).u64(0).s, "truncated");
}

// llama.cpp's own tokenizer tests for its Llama SentencePiece vocabulary (shipped under data/,
// see data/PROVENANCE.md): inputs separated by "\n__ggml_vocab_test__\n", one line of expected
// ids (no BOS) per input.
TEST(GgufTokenizer, LlamaSpmMatchesLlamaCppTests) {
  const std::string vocab = test::data("ggml-vocab-llama-spm.gguf");
  const auto tok = engine::load_gguf_tokenizer(vocab);
  EXPECT_EQ(tok->vocab_size(), 32000);
  EXPECT_EQ(tok->bos_id(), 1);
  const std::string inp = test::read_all(vocab + ".inp");
  std::istringstream out(test::read_all(vocab + ".out"));
  const std::string sep = "\n__ggml_vocab_test__\n";
  int n = 0;
  for (std::size_t at = 0; at < inp.size(); ++n) {
    const std::size_t next = inp.find(sep, at);
    const std::size_t end = next == std::string::npos ? inp.size() : next;
    const std::string text = inp.substr(at, end - at);
    std::string line;
    ASSERT_TRUE(std::getline(out, line)) << "fewer expected lines than tests";
    std::istringstream ids_in(line);
    std::vector<std::int32_t> want;
    for (std::int32_t id; ids_in >> id;) want.push_back(id);
    EXPECT_EQ(tok->encode(text, false), want) << "input: '" << text << "'";
    if (next == std::string::npos) break;
    at = next + sep.size();
  }
  EXPECT_GE(n, 40);
  // Decoding gives the text back (SentencePiece's prefix space removed).
  EXPECT_EQ(tok->decode(tok->encode("Hello world, caf\xC3\xA9!", true)),
            "Hello world, caf\xC3\xA9!");
}

}  // namespace
}  // namespace vq

namespace vq {
namespace {

TEST(Pretokenize, ByteLevelAlphabet) {
  // GPT-2's alphabet: printable ASCII maps to itself; ' ' (0x20) is the 33rd byte mapped away
  // (after 0x00-0x1F), so it becomes U+0100 + 32 = U+0120 "Ġ"; '\n' (0x0A) becomes U+010A "Ċ";
  // 0xAD (soft hyphen, the one gap in 161-255) follows 0x00-0x20 and 0x7F-0xA0 (34 bytes):
  // U+0100 + 33 + 34 = U+0143 "Ń".
  EXPECT_EQ(engine::byte_level_encode("a b\n"),
            "a\xC4\xA0"
            "b\xC4\x8A");
  EXPECT_EQ(engine::byte_level_encode("\xAD"), "\xC5\x83");
  EXPECT_EQ(engine::byte_level_encode("\xC3\xA9"), "\xC3\x83\xC2\xA9");  // é: bytes C3 A9 kept
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  EXPECT_EQ(engine::byte_level_decode(engine::byte_level_encode(all)), all);
}

TEST(Pretokenize, Llama3AndQwen2Regexes) {
  auto split = [](const std::string& pre, const std::string& text) {
    const engine::RegexSplitter s(engine::pre_tokenizer_regex(pre), "test");
    std::vector<std::string> out;
    for (const auto piece : s.split(text)) out.emplace_back(piece);
    return out;
  };
  // Worked out from the alternatives in order: contractions; an optional non-letter/digit
  // then letters; digits (1-3 for Llama 3, 1 for Qwen2); punctuation runs with an optional
  // leading space; newlines; whitespace not followed by non-space; whitespace.
  using V = std::vector<std::string>;
  EXPECT_EQ(split("llama-bpe", "Hello world's 12345!!  ok\n\nx"),
            (V{"Hello", " world", "'s", " ", "123", "45", "!!", " ", " ok", "\n\n", "x"}));
  EXPECT_EQ(split("qwen2", "ab 123"), (V{"ab", " ", "1", "2", "3"}));
  // Unicode letters count as letters (\p{L}), not as punctuation.
  EXPECT_EQ(split("llama-bpe", "caf\xC3\xA9 \xD0\xB4\xD0\xB0"),
            (V{"caf\xC3\xA9", " \xD0\xB4\xD0\xB0"}));
  EXPECT_EQ(engine::pre_tokenizer_regex("falcon"), "");
  EXPECT_THROW(engine::RegexSplitter("(", "bad.json"), Error);
}

// A hand-made "gpt2" vocabulary: single characters a, b, c, Ġ (space), then merges
// "a b" (rank 0), "Ġ a" (1), "ab c" (2), "Ġa b" (3).
std::string tiny_bpe_gguf(const std::string& pre) {
  GgufWriter w;
  w.set("tokenizer.ggml.model", GgufValue::str("gpt2"));
  w.set("tokenizer.ggml.pre", GgufValue::str(pre));
  w.set("tokenizer.ggml.tokens", GgufValue::string_array({"a", "b", "c", "\xC4\xA0", "ab",
                                                          "\xC4\xA0"
                                                          "a",
                                                          "abc",
                                                          "\xC4\xA0"
                                                          "ab",
                                                          "<|bos|>", "<x>"}));
  w.set("tokenizer.ggml.token_type", GgufValue::i32_array({1, 1, 1, 1, 1, 1, 1, 1, 3, 4}));
  w.set("tokenizer.ggml.merges", GgufValue::string_array({"a b", "\xC4\xA0 a", "ab c",
                                                          "\xC4\xA0"
                                                          "a b"}));
  w.set("tokenizer.ggml.bos_token_id", GgufValue::u32(8));
  w.set("tokenizer.ggml.add_bos_token", GgufValue::boolean(true));
  const auto b = w.serialize();
  return std::string(b.begin(), b.end());
}

TEST(GgufTokenizer, ByteLevelBpeIsLinearInTheText) {
  const GgufFile g = parse(tiny_bpe_gguf("llama-bpe"), "tiny.gguf");
  test::expect_linear_encode(*engine::load_gguf_tokenizer(g));
}

TEST(GgufTokenizer, RegexSplitAroundInvalidUtf8) {
  // An invalid byte matches nothing and no match crosses it; it joins the unmatched stretch.
  // "ab\xFFcd ef": letters "ab"; \xFF unmatched; "cd"; " ef" (optional non-letter + letters).
  // "a \xFF": "a"; the space is whitespace not followed by a non-space character (\s+(?!\S):
  // the invalid byte is no character), then \xFF alone.
  const engine::RegexSplitter s(engine::pre_tokenizer_regex("llama-bpe"), "test");
  auto pieces = [&](std::string_view t) {
    std::vector<std::string> out;
    for (const auto p : s.split(t)) out.emplace_back(p);
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces("ab\xFF" "cd ef"), (V{"ab", "\xFF", "cd", " ef"}));
  EXPECT_EQ(pieces("a \xFF"), (V{"a", " ", "\xFF"}));
  EXPECT_EQ(pieces("\xC3"), (V{"\xC3"}));  // a truncated sequence
  EXPECT_EQ(pieces("\xED\xA0\x80x"), (V{"\xED\xA0\x80", "x"}));  // a surrogate is invalid
}

TEST(GgufTokenizer, ByteLevelBpeByMergeRank) {
  const std::string bytes = tiny_bpe_gguf("qwen2");
  const GgufFile g = parse(bytes, "tiny.gguf");
  const auto tok = engine::load_gguf_tokenizer(g);
  EXPECT_EQ(tok->kind(), "gguf-gpt2");
  // "abc ab<x>c": pieces "abc", " ab" (then "<x>" split out first as a user-defined token, and
  // "c"). "abc": a+b (rank 0) -> ab, ab+c (2) -> abc = 6. " ab" = Ġ a b: Ġ+a (1) is the only
  // candidate besides a+b (0): a+b first -> Ġ, ab; "Ġ ab" is not a merge -> 3, 4.
  EXPECT_EQ(tok->encode("abc ab<x>c", true), (std::vector<std::int32_t>{8, 6, 3, 4, 9, 2}));
  // " a b": pieces " a" -> Ġa (5); " b" -> Ġ, b (3, 1).
  EXPECT_EQ(tok->encode(" a b", false), (std::vector<std::int32_t>{5, 3, 1}));
  EXPECT_EQ(tok->decode(tok->encode("abc ab<x>c", true)), "abc ab<x>c");
  // A byte with no token is dropped (as llama.cpp does); "d" is not in the vocabulary.
  EXPECT_EQ(tok->encode("ad", false), (std::vector<std::int32_t>{0}));
  // An unknown pre-tokenizer is an error naming it.
  const std::string other = tiny_bpe_gguf("falcon");
  try {
    engine::load_gguf_tokenizer(parse(other, "tiny.gguf"));
    ADD_FAILURE() << "accepted an unknown pre-tokenizer";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'falcon'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace vq

namespace vq {
namespace {

TEST(GgufReader, RandomByteFlipsNeverCrash) {
  // Mutations of a valid file (a vocabulary and tensors): parsing, reading the tokenizer and
  // encoding either work or throw vq::Error; nothing else (the sanitizer build checks memory).
  const std::string good = tiny_bpe_gguf("llama-bpe");
  GgufWriter w;
  std::vector<float> vals(64, 0.5f);
  w.add_tensor("a", {32, 2}, GgmlType::kQ8_0, vals.data());
  w.add_tensor("b", {64}, GgmlType::kF16, vals.data());
  const auto tb = w.serialize();
  GgufWriter spm;  // stories260K's 512-piece SentencePiece vocabulary
  engine::add_llama2c_vocab(spm, test::data("tok512.bin"), 512);
  const auto sb = spm.serialize();
  const std::vector<std::string> files = {good, std::string(tb.begin(), tb.end()),
                                          std::string(sb.begin(), sb.end())};
  std::uint64_t state = 12345;
  auto next = [&] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  int errors = 0, parsed = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string f = files[static_cast<std::size_t>(iter % 3)];
    const int flips = 1 + static_cast<int>(next() % 4);
    for (int k = 0; k < flips; ++k) {
      f[next() % f.size()] = static_cast<char>(next() & 0xFF);
    }
    try {
      const GgufFile g = parse(f, "fuzz.gguf");
      ++parsed;
      for (const engine::GgufTensor& t : g.tensors()) {
        std::vector<float> out(static_cast<std::size_t>(t.n_values));
        dequantize(t.type, t.data, out.data(), t.n_values);
      }
      if (g.find("tokenizer.ggml.model")) {
        const auto tok = engine::load_gguf_tokenizer(g);
        tok->decode(tok->encode("abc ab<x>c d", true));
        for (std::int32_t id = 0; id < tok->vocab_size(); ++id) tok->piece(id - 1, id);
      }
    } catch (const Error& e) {
      ++errors;
      EXPECT_EQ(e.code(), ErrorCode::kFileError) << e.what();
    }
  }
  EXPECT_GT(errors, 100);
  EXPECT_GT(parsed, 100);
}

// The merge loop both GGUF tokenizers share, on pair tables worked out by hand.
std::vector<std::string> merged(const std::string& text, const std::map<std::string, int>& pairs) {
  const auto syms = engine::bpe_merge<int>(
      text, [&](std::string_view a, std::string_view b) -> std::optional<int> {
        const auto it = pairs.find(std::string(a) + "|" + std::string(b));
        if (it == pairs.end()) return std::nullopt;
        return it->second;
      });
  std::vector<std::string> out;
  for (const auto& s : syms) out.push_back(text.substr(s.start, s.len));
  return out;
}

TEST(BpeMerge, BestPairFirstLeftmostOnTiesStalePairsSkipped) {
  using V = std::vector<std::string>;
  // a|b and b|c tie: the leftmost merges, then nothing joins "ab" and "c".
  EXPECT_EQ(merged("abc", {{"a|b", 1}, {"b|c", 1}}), (V{"ab", "c"}));
  // The higher priority wins wherever it is; the merged symbol can merge again.
  EXPECT_EQ(merged("abc", {{"a|b", 1}, {"b|c", 2}, {"a|bc", 0}}), (V{"abc"}));
  // b|c first; the queued a|b and c|d are stale then (b and c changed) and skipped; a|bc runs.
  EXPECT_EQ(merged("abcd", {{"a|b", 2}, {"b|c", 3}, {"c|d", 2}, {"a|bc", 1}}), (V{"abc", "d"}));
  // Symbols start as UTF-8 characters: "é" (2 bytes) stays whole; a truncated sequence at the
  // end is one symbol of what is left.
  EXPECT_EQ(merged("\xC3\xA9x", {}), (V{"\xC3\xA9", "x"}));
  EXPECT_EQ(merged("x\xE2\x96", {}), (V{"x", "\xE2\x96"}));
  EXPECT_EQ(merged("", {{"a|b", 1}}), V{});
}

}  // namespace
}  // namespace vq
