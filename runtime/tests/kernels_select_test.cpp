//===- kernels_select_test.cpp - compare / where / cast kernels -----------===//
//
// Part of pipec. pipec_k_compare, pipec_k_where and pipec_k_cast against
// direct references over random broadcast shapes (rank 0..4, every operand
// broadcast independently), NaN and integer operands included. The ONNX
// node tests of Equal/Less/Greater/..., Where, And/Or/Xor/Not run through
// the whole compiler in the conformance target.
//
//===----------------------------------------------------------------------===//

#include "kernels_test_util.h"

#include <cstring>
#include <limits>

using namespace pipec_test;

namespace {

struct Case {
  Dims out;
  std::vector<Dims> shapes, strides;
};

Case randomCase(std::mt19937 &rng, int operands) {
  Case c;
  int64_t rank = randomInt(rng, 0, 4);
  for (int64_t i = 0; i < rank; ++i)
    c.out.push_back(randomInt(rng, 1, 5));
  for (int k = 0; k < operands; ++k) {
    c.shapes.push_back(randomBroadcastShape(rng, c.out));
    c.strides.push_back(broadcastStrides(c.shapes.back(), c.out));
  }
  return c;
}

std::vector<int64_t> ints(int64_t head0, int64_t head1, const Case &c) {
  std::vector<int64_t> v = {head0, head1};
  v.insert(v.end(), c.out.begin(), c.out.end());
  for (const Dims &s : c.strides)
    v.insert(v.end(), s.begin(), s.end());
  return v;
}

template <typename T> bool ref(int64_t p, T a, T b) {
  switch (p) {
  case PIPEC_CMP_EQ: return a == b;
  case PIPEC_CMP_NE: return a != b;
  case PIPEC_CMP_LT: return a < b;
  case PIPEC_CMP_GT: return a > b;
  case PIPEC_CMP_LE: return a <= b;
  default: return a >= b;
  }
}

} // namespace

TEST(KernelCompare, FloatAndIntWithBroadcastingAndNaN) {
  std::mt19937 rng(211);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t p = PIPEC_CMP_EQ; p <= PIPEC_CMP_GE; ++p)
    for (int trial = 0; trial < 40; ++trial) {
      Case c = randomCase(rng, 2);
      SCOPED_TRACE(::testing::Message() << "predicate " << p << " out "
                                        << dimsToString(c.out));
      // Small integer-valued floats make ties frequent; one NaN.
      Floats a = randomFloats(rng, numel(c.shapes[0]), -2, 2);
      Floats b = randomFloats(rng, numel(c.shapes[1]), -2, 2);
      for (float &x : a)
        x = std::round(x);
      for (float &x : b)
        x = std::round(x);
      if (trial % 5 == 0)
        a[0] = nan;
      std::vector<int64_t> ia(a.size()), ib(b.size());
      for (size_t i = 0; i < a.size(); ++i)
        ia[i] = std::isnan(a[i]) ? 7 : int64_t(a[i]);
      for (size_t i = 0; i < b.size(); ++i)
        ib[i] = int64_t(b[i]);
      for (int isInt = 0; isInt < 2; ++isInt) {
        std::vector<int64_t> y(size_t(numel(c.out)), -5);
        std::vector<int64_t> k = ints(p, int64_t(c.out.size()), c);
        k.push_back(isInt);
        void *bufs[3] = {isInt ? (void *)ia.data() : (void *)a.data(),
                         isInt ? (void *)ib.data() : (void *)b.data(),
                         y.data()};
        pipec_k_compare(kctx(), bufs, k.data(), nullptr);
        Dims ys = rowMajorStrides(c.out);
        forEachMultiIndex(c.out, [&](const Dims &idx) {
          size_t ai = size_t(dotIndex(idx, c.strides[0]));
          size_t bi = size_t(dotIndex(idx, c.strides[1]));
          bool want = isInt ? ref(p, ia[ai], ib[bi]) : ref(p, a[ai], b[bi]);
          EXPECT_EQ(y[size_t(dotIndex(idx, ys))], want ? 1 : 0);
        });
      }
    }
}

TEST(KernelWhere, SelectsWithThreeWayBroadcasting) {
  std::mt19937 rng(223);
  for (int trial = 0; trial < 80; ++trial) {
    Case c = randomCase(rng, 3);
    SCOPED_TRACE(::testing::Message() << "out " << dimsToString(c.out));
    std::vector<int64_t> cond(size_t(numel(c.shapes[0])));
    for (int64_t &v : cond)
      v = randomInt(rng, 0, 2) == 0 ? 0 : randomInt(rng, 1, 3); // any non-zero
    Floats x = randomFloats(rng, numel(c.shapes[1]));
    Floats y = randomFloats(rng, numel(c.shapes[2]));
    std::vector<int64_t> xi(x.size()), yi(y.size());
    for (size_t i = 0; i < x.size(); ++i)
      xi[i] = int64_t(1000 * x[i]);
    for (size_t i = 0; i < y.size(); ++i)
      yi[i] = int64_t(1000 * y[i]);
    Dims os = rowMajorStrides(c.out);
    for (int isInt = 0; isInt < 2; ++isInt) {
      Floats out(size_t(numel(c.out)), std::numeric_limits<float>::quiet_NaN());
      std::vector<int64_t> outI(out.size(), -1);
      std::vector<int64_t> k = ints(isInt, int64_t(c.out.size()), c);
      void *bufs[4] = {cond.data(),
                       isInt ? (void *)xi.data() : (void *)x.data(),
                       isInt ? (void *)yi.data() : (void *)y.data(),
                       isInt ? (void *)outI.data() : (void *)out.data()};
      pipec_k_where(kctx(), bufs, k.data(), nullptr);
      forEachMultiIndex(c.out, [&](const Dims &idx) {
        bool pick = cond[size_t(dotIndex(idx, c.strides[0]))] != 0;
        size_t xi0 = size_t(dotIndex(idx, c.strides[1]));
        size_t yi0 = size_t(dotIndex(idx, c.strides[2]));
        size_t o = size_t(dotIndex(idx, os));
        if (isInt)
          EXPECT_EQ(outI[o], pick ? xi[xi0] : yi[yi0]);
        else
          EXPECT_EQ(out[o], pick ? x[xi0] : y[yi0]);
      });
    }
  }
}

/// The float32 value of bfloat16 bits, and the bits of a float32.
static float bitsToFloat(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}
static uint32_t floatToBits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

TEST(KernelCast, Bf16NearestTiesToEvenAndBack) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1); 1 +
  // 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: ties to even (up);
  // just above a tie rounds up; the largest float rounds to infinity; a
  // subnormal keeps its top bits; a signalling NaN comes back quiet.
  Floats x = {1.0f,
              bitsToFloat(0x3F808000u),
              bitsToFloat(0x3F818000u),
              bitsToFloat(0x3F808001u),
              -0.0f,
              -2.5f,
              std::numeric_limits<float>::max(),
              -inf,
              bitsToFloat(0x00012345u),
              bitsToFloat(0x7F800001u),
              nan};
  std::vector<uint16_t> b(x.size());
  int64_t k[2] = {PIPEC_CAST_F32_TO_BF16, int64_t(x.size())};
  void *bufs[2] = {x.data(), b.data()};
  pipec_k_cast(kctx(), bufs, k, nullptr);
  std::vector<uint16_t> want = {0x3F80, 0x3F80, 0x3F82, 0x3F81, 0x8000, 0xC020,
                                0x7F80, 0xFF80, 0x0001, 0x7FC0, 0x7FC0};
  EXPECT_EQ(b, want);

  Floats back(b.size());
  int64_t k2[2] = {PIPEC_CAST_BF16_TO_F32, int64_t(b.size())};
  void *bufs2[2] = {b.data(), back.data()};
  pipec_k_cast(kctx(), bufs2, k2, nullptr);
  for (size_t i = 0; i < b.size(); ++i)
    EXPECT_EQ(floatToBits(back[i]), uint32_t(b[i]) << 16) << "element " << i;
  // Every bfloat16 widens exactly and rounds back to itself.
  std::vector<uint16_t> all(1 << 16);
  for (size_t i = 0; i < all.size(); ++i)
    all[i] = uint16_t(i);
  Floats wide(all.size());
  void *bufs3[2] = {all.data(), wide.data()};
  int64_t k3[2] = {PIPEC_CAST_BF16_TO_F32, int64_t(all.size())};
  pipec_k_cast(kctx(), bufs3, k3, nullptr);
  std::vector<uint16_t> again(all.size());
  void *bufs4[2] = {wide.data(), again.data()};
  int64_t k4[2] = {PIPEC_CAST_F32_TO_BF16, int64_t(all.size())};
  pipec_k_cast(kctx(), bufs4, k4, nullptr);
  for (size_t i = 0; i < all.size(); ++i) {
    bool nanBits = (i & 0x7F80) == 0x7F80 && (i & 0x7F) != 0;
    if (nanBits) // quiet NaNs stay themselves; signalling ones get quiet
      EXPECT_EQ(again[i], uint16_t(i | 0x40)) << "bits " << i;
    else
      EXPECT_EQ(again[i], all[i]) << "bits " << i;
  }
}

TEST(KernelCast, RoundTripsTruncationAndOutOfRange) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Floats x = {0.0f, 1.9f, -1.9f, -0.5f, 3e18f, -9.2233720e18f, 1e19f, nan};
  std::vector<int64_t> y(x.size());
  int64_t k[2] = {PIPEC_CAST_F32_TO_I64, int64_t(x.size())};
  void *bufs[2] = {x.data(), y.data()};
  pipec_k_cast(kctx(), bufs, k, nullptr);
  const int64_t bad = std::numeric_limits<int64_t>::min();
  std::vector<int64_t> want = {0, 1, -1, 0, int64_t(3e18f),
                               int64_t(-9.2233720e18f), bad, bad};
  EXPECT_EQ(y, want);

  std::vector<int64_t> i = {0, 1, -7, int64_t(1) << 40, 16777217};
  Floats f(i.size());
  int64_t k2[2] = {PIPEC_CAST_I64_TO_F32, int64_t(i.size())};
  void *bufs2[2] = {i.data(), f.data()};
  pipec_k_cast(kctx(), bufs2, k2, nullptr);
  EXPECT_EQ(f, (Floats{0.0f, 1.0f, -7.0f, 1099511627776.0f, 16777216.0f}));
}
