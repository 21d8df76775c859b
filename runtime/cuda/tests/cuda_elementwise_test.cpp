//===- cuda_elementwise_test.cpp - CUDA elementwise and movement kernels --===//
//
// Part of pipec's GPU tests (ctest label `gpu`). Runs the CUDA twins of
// binary, binary_grad, compare, where, cast, unary, unary_grad, copy, fill,
// broadcast, strided_copy, transpose, reduce_sum, gather and gather_grad
// against the CPU kernels on the same inputs (cuda_test_util.h): every
// opcode and predicate, broadcast operands (stride 0), rank-0 scalars,
// in-place outputs, NaN / signed-zero / saturating inputs, negative strides,
// the kernels' launch variants (tiled transpose, warp and thread
// reductions) and sizes that are not multiples of the block size.
//
//===----------------------------------------------------------------------===//

#include "cuda_test_util.h"

#include "pipec_rt.h"

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <vector>

using namespace pipec::cudatest;

namespace {

using Dims = std::vector<int64_t>;

const float kNaN = std::numeric_limits<float>::quiet_NaN();

int64_t numel(const Dims &dims) {
  int64_t n = 1;
  for (int64_t d : dims)
    n *= d;
  return n;
}

Dims contiguous(const Dims &dims) {
  Dims s(dims.size());
  int64_t stride = 1;
  for (size_t i = dims.size(); i-- > 0;) {
    s[i] = stride;
    stride *= dims[i];
  }
  return s;
}

/// Strides of an operand of shape `shape` (numpy: aligned to the right)
/// read with Y's dims `out`: 0 along broadcast dimensions.
Dims broadcastStrides(const Dims &shape, const Dims &out) {
  Dims own = contiguous(shape), s(out.size(), 0);
  const size_t lead = out.size() - shape.size();
  for (size_t i = 0; i < shape.size(); ++i)
    s[lead + i] = shape[i] == 1 ? 0 : own[i];
  return s;
}

/// Appends the given lists.
Dims cat(std::initializer_list<Dims> parts) {
  Dims all;
  for (const Dims &p : parts)
    all.insert(all.end(), p.begin(), p.end());
  return all;
}

/// [opcode, rank, dims, aStrides, bStrides] of binary / binary_grad.
Dims binaryInts(int64_t opcode, const Dims &out, const Dims &aShape,
                const Dims &bShape) {
  return cat({{opcode, int64_t(out.size())},
              out,
              broadcastStrides(aShape, out),
              broadcastStrides(bShape, out)});
}

/// One broadcast configuration of a binary-like kernel.
struct Shapes {
  Dims out, a, b;
};

const std::vector<Shapes> &binaryShapes() {
  static const std::vector<Shapes> shapes = {
      {{1000}, {1000}, {1000}},
      {{37, 129}, {37, 129}, {129}},   // B is a row
      {{37, 129}, {37, 1}, {37, 129}}, // A is a column
      {{33, 65}, {33, 1}, {1, 65}},    // outer product
      {{}, {}, {}},                    // rank 0
      {{5, 77}, {5, 77}, {}},          // B one scalar
      {{2, 3, 4, 5}, {2, 1, 4, 1}, {3, 1, 5}},
      {{300, 347}, {300, 347}, {300, 347}}, // 104100 elements
      {{7, 1, 9}, {1, 1, 9}, {7, 1, 1}},    // unit dimension
      // Rows of a multiple of 4: the 16-byte path (binaryRows4) for the
      // same shape, a row (bias), a column, a scalar and a [T, T] mask
      // broadcast over [B, H, T, T].
      {{37, 128}, {37, 128}, {37, 128}},
      {{37, 128}, {37, 128}, {128}},
      {{37, 128}, {37, 128}, {37, 1}},
      {{6, 132}, {6, 132}, {}},
      {{2, 3, 16, 16}, {2, 3, 16, 16}, {16, 16}},
  };
  return shapes;
}

/// Random values for operand `which` (0: A, 1: B) of `opcode`, chosen so
/// that no result is infinite (the comparison treats inf as a mismatch).
std::vector<float> binaryValues(int64_t opcode, int which, size_t n,
                                unsigned seed) {
  if (opcode == PIPEC_BIN_POW)
    return which == 0 ? randf(n, 0.1f, 2.f, seed) : randf(n, -2.f, 2.f, seed);
  if (opcode == PIPEC_BIN_DIV && which == 1) {
    std::vector<float> v = randf(n, 0.5f, 2.f, seed);
    for (size_t i = 0; i < n; i += 2)
      v[i] = -v[i];
    return v;
  }
  return randf(n, -2.f, 2.f, seed);
}

//===----------------------------------------------------------------------===//
// Binary
//===----------------------------------------------------------------------===//

TEST(CudaBinary, EveryOpcodeAndBroadcast) {
  PIPEC_REQUIRE_GPU();
  for (int64_t op = PIPEC_BIN_ADD; op <= PIPEC_BIN_MIN; ++op) {
    unsigned seed = 10;
    for (const Shapes &s : binaryShapes()) {
      SCOPED_TRACE(::testing::Message()
                   << "opcode " << op << " rank " << s.out.size() << " numel "
                   << numel(s.out));
      expectSameAsCpu("binary",
                      {in(binaryValues(op, 0, size_t(numel(s.a)), seed)),
                       in(binaryValues(op, 1, size_t(numel(s.b)), seed + 1)),
                       out(size_t(numel(s.out)))},
                      binaryInts(op, s.out, s.a, s.b));
      seed += 2;
    }
  }
}

TEST(CudaBinary, PowSquareAndNegativeBase) {
  PIPEC_REQUIRE_GPU();
  // One broadcast exponent 2 is A * A (negative bases included); an
  // exponent 2 that is not a broadcast scalar goes through pow.
  std::vector<float> a = randf(1001, -3.f, 3.f, 3);
  expectSameAsCpu("binary", {in(a), in({2.f}), out(1001)},
                  binaryInts(PIPEC_BIN_POW, {1001}, {1001}, {}));
  expectSameAsCpu("binary", {in(a), in({2.f}), out(1001)},
                  binaryInts(PIPEC_BIN_POW, {7, 143}, {7, 143}, {1, 1}));
  expectSameAsCpu("binary",
                  {in(a), in(std::vector<float>(1001, 2.f)), out(1001)},
                  binaryInts(PIPEC_BIN_POW, {1001}, {1001}, {1001}));
  // Integer exponents of negative bases, and NaN for fractional ones.
  expectSameAsCpu("binary",
                  {in({-2.f, -2.f, -1.5f, -0.5f, 0.f, 4.f}),
                   in({3.f, 0.5f, 2.f, -1.f, 1.f, 0.5f}), out(6)},
                  binaryInts(PIPEC_BIN_POW, {6}, {6}, {6}));
}

TEST(CudaBinary, MaxMinTiesAndNaN) {
  PIPEC_REQUIRE_GPU();
  const size_t n = 1000;
  std::vector<float> a = randf(n, -1.f, 1.f, 4), b = randf(n, -1.f, 1.f, 5);
  for (size_t i = 0; i < n; ++i) {
    if (i % 7 == 0)
      a[i] = b[i];
    if (i % 11 == 0)
      a[i] = kNaN;
    if (i % 13 == 0)
      b[i] = kNaN;
    if (i % 17 == 0) {
      a[i] = 0.f;
      b[i] = -0.f;
    }
  }
  for (int64_t op : {PIPEC_BIN_MAX, PIPEC_BIN_MIN})
    expectSameAsCpu("binary", {in(a), in(b), out(n)},
                    binaryInts(op, {int64_t(n)}, {int64_t(n)}, {int64_t(n)}));
}

TEST(CudaBinary, OutputAliasesAnOperand) {
  PIPEC_REQUIRE_GPU();
  for (int64_t op = PIPEC_BIN_ADD; op <= PIPEC_BIN_MIN; ++op) {
    // Y aliases A (B broadcast), then Y aliases B (A broadcast).
    expectSameAsCpu("binary",
                    {in(binaryValues(op, 0, 37 * 129, 20)),
                     in(binaryValues(op, 1, 129, 21)), alias(0)},
                    binaryInts(op, {37, 129}, {37, 129}, {129}));
    expectSameAsCpu("binary",
                    {in(binaryValues(op, 0, 37, 22)),
                     in(binaryValues(op, 1, 37 * 129, 23)), alias(1)},
                    binaryInts(op, {37, 129}, {37, 1}, {37, 129}));
    // The 16-byte path in place.
    expectSameAsCpu("binary",
                    {in(binaryValues(op, 0, 37 * 128, 24)),
                     in(binaryValues(op, 1, 128, 25)), alias(0)},
                    binaryInts(op, {37, 128}, {37, 128}, {128}));
  }
}

TEST(CudaBinary, StridedOperandAndUnknownOpcode) {
  PIPEC_REQUIRE_GPU();
  // A read transposed: Y[i, j] = A[j, i] + B[i, j] for a [48, 64] A.
  expectSameAsCpu("binary",
                  {in(randf(48 * 64, -1.f, 1.f, 6)),
                   in(randf(64 * 48, -1.f, 1.f, 7)), out(64 * 48)},
                  cat({{PIPEC_BIN_SUB, 2, 64, 48}, {1, 64}, {48, 1}}));
  // An unknown opcode poisons Y with NaN.
  expectSameAsCpu(
      "binary",
      {in(randf(300, -1.f, 1.f, 8)), in(randf(300, -1.f, 1.f, 9)), out(300)},
      binaryInts(99, {300}, {300}, {300}));
}

//===----------------------------------------------------------------------===//
// Binary gradient
//===----------------------------------------------------------------------===//

TEST(CudaBinaryGrad, EveryOpcodeAndBroadcast) {
  PIPEC_REQUIRE_GPU();
  for (int64_t op = PIPEC_BIN_ADD; op <= PIPEC_BIN_MIN; ++op) {
    unsigned seed = 100;
    for (const Shapes &s : binaryShapes()) {
      SCOPED_TRACE(::testing::Message()
                   << "opcode " << op << " rank " << s.out.size() << " numel "
                   << numel(s.out));
      const size_t n = size_t(numel(s.out));
      expectSameAsCpu("binary_grad",
                      {in(binaryValues(op, 0, size_t(numel(s.a)), seed)),
                       in(binaryValues(op, 1, size_t(numel(s.b)), seed + 1)),
                       in(randf(n, -1.f, 1.f, seed + 2)), out(n), out(n)},
                      binaryInts(op, s.out, s.a, s.b));
      seed += 3;
    }
  }
}

TEST(CudaBinaryGrad, OneSidedAndInPlace) {
  PIPEC_REQUIRE_GPU();
  const size_t n = 37 * 129;
  for (int64_t op = PIPEC_BIN_ADD; op <= PIPEC_BIN_MIN; ++op) {
    const Dims ints = binaryInts(op, {37, 129}, {37, 129}, {129});
    std::vector<float> a = binaryValues(op, 0, n, 30);
    std::vector<float> b = binaryValues(op, 1, 129, 31);
    std::vector<float> dy = randf(n, -1.f, 1.f, 32);
    expectSameAsCpu("binary_grad", {in(a), in(b), in(dy), out(n), null()},
                    ints);
    expectSameAsCpu("binary_grad", {in(a), in(b), in(dy), null(), out(n)},
                    ints);
    // dA, then dB, written over dY.
    expectSameAsCpu("binary_grad", {in(a), in(b), in(dy), alias(2), out(n)},
                    ints);
    expectSameAsCpu("binary_grad", {in(a), in(b), in(dy), out(n), alias(2)},
                    ints);
  }
}

TEST(CudaBinaryGrad, PowAtZeroAndMaxMinTies) {
  PIPEC_REQUIRE_GPU();
  // dA = 0 where B == 0; dB = 0 where A == 0 and B >= 0; a negative base
  // gives NaN through log.
  std::vector<float> a = {0.f, 0.f, 0.f, 0.f, 2.f, -2.f, 0.5f, 1.f};
  std::vector<float> b = {0.f, 1.f, 2.f, 3.f, 0.f, 2.f, 0.f, -1.5f};
  std::vector<float> dy = {1.f, -2.f, 0.5f, 3.f, 1.5f, -1.f, 2.f, 0.25f};
  expectSameAsCpu("binary_grad", {in(a), in(b), in(dy), out(8), out(8)},
                  binaryInts(PIPEC_BIN_POW, {8}, {8}, {8}));
  // Ties go to A; NaN comparisons go to B.
  std::vector<float> ma = {1.f, 2.f, 3.f, kNaN, 0.f, -1.f};
  std::vector<float> mb = {1.f, 3.f, 2.f, 1.f, kNaN, -1.f};
  std::vector<float> mdy = {1.f, 2.f, 3.f, 4.f, 5.f, 6.f};
  for (int64_t op : {PIPEC_BIN_MAX, PIPEC_BIN_MIN})
    expectSameAsCpu("binary_grad", {in(ma), in(mb), in(mdy), out(6), out(6)},
                    binaryInts(op, {6}, {6}, {6}));
  // Unknown opcode: both outputs NaN.
  expectSameAsCpu("binary_grad", {in(a), in(b), in(dy), out(8), out(8)},
                  binaryInts(42, {8}, {8}, {8}));
}

//===----------------------------------------------------------------------===//
// Compare, where, cast
//===----------------------------------------------------------------------===//

TEST(CudaCompare, EveryPredicateFloat) {
  PIPEC_REQUIRE_GPU();
  const size_t n = 1003;
  std::vector<float> a = randf(n, -1.f, 1.f, 40), b = randf(n, -1.f, 1.f, 41);
  for (size_t i = 0; i < n; ++i) {
    if (i % 5 == 0)
      a[i] = b[i];
    if (i % 19 == 0)
      a[i] = kNaN;
    if (i % 23 == 0)
      b[i] = kNaN;
    if (i % 29 == 0) {
      a[i] = 0.f;
      b[i] = -0.f;
    }
  }
  for (int64_t p = PIPEC_CMP_EQ; p <= PIPEC_CMP_GE; ++p) {
    SCOPED_TRACE(::testing::Message() << "predicate " << p);
    const Dims same = {int64_t(n)};
    expectSameAsCpu("compare", {in(a), in(b), outI64(n)},
                    cat({binaryInts(p, same, same, same), {0}}));
    // Broadcast row against column, and rank 0.
    expectSameAsCpu("compare",
                    {in(randf(33, -1.f, 1.f, 42)), in(randf(65, -1.f, 1.f, 43)),
                     outI64(33 * 65)},
                    cat({binaryInts(p, {33, 65}, {33, 1}, {65}), {0}}));
    expectSameAsCpu("compare", {in({0.5f}), in({0.5f}), outI64(1)},
                    cat({binaryInts(p, {}, {}, {}), {0}}));
  }
}

TEST(CudaCompare, EveryPredicateInt64) {
  PIPEC_REQUIRE_GPU();
  std::vector<int64_t> a, b;
  for (int64_t i = 0; i < 7 * 300; ++i)
    a.push_back((i * 37) % 11 - 5);
  for (int64_t i = 0; i < 300; ++i)
    b.push_back((i * 13) % 9 - 4);
  a[3] = std::numeric_limits<int64_t>::min();
  b[5] = std::numeric_limits<int64_t>::max();
  for (int64_t p = PIPEC_CMP_EQ; p <= PIPEC_CMP_GE; ++p)
    expectSameAsCpu("compare", {inI64(a), inI64(b), outI64(7 * 300)},
                    cat({binaryInts(p, {7, 300}, {7, 300}, {300}), {1}}));
  // An unknown predicate writes INT64_MIN.
  expectSameAsCpu("compare", {inI64(a), inI64(b), outI64(7 * 300)},
                  cat({binaryInts(17, {7, 300}, {7, 300}, {300}), {1}}));
}

TEST(CudaWhere, FloatAndInt64WithBroadcast) {
  PIPEC_REQUIRE_GPU();
  const Dims yDims = {6, 35, 17};
  const size_t n = size_t(numel(yDims));
  std::vector<int64_t> c;
  for (int64_t i = 0; i < 35 * 17; ++i)
    c.push_back(i % 3 == 0 ? 0 : (i % 3 == 1 ? 1 : -7));
  const Dims ints = cat({{0, 3},
                         yDims,
                         broadcastStrides({35, 17}, yDims),
                         broadcastStrides({6, 1, 17}, yDims),
                         broadcastStrides({}, yDims)});
  expectSameAsCpu(
      "where", {inI64(c), in(randf(6 * 17, -1.f, 1.f, 50)), in({2.5f}), out(n)},
      ints);
  std::vector<int64_t> xi, yi;
  for (int64_t i = 0; i < 6 * 17; ++i)
    xi.push_back(i * 1000003);
  yi.push_back(-42);
  Dims intInts = ints;
  intInts[0] = 1;
  expectSameAsCpu("where", {inI64(c), inI64(xi), inI64(yi), outI64(n)},
                  intInts);
  // Rank 0, and the same shape everywhere (100k elements).
  expectSameAsCpu("where", {inI64({0}), in({1.f}), in({-1.f}), out(1)}, {0, 0});
  const int64_t big = 100003;
  std::vector<int64_t> cb(static_cast<size_t>(big));
  for (int64_t i = 0; i < big; ++i)
    cb[size_t(i)] = (i * 7) % 5 < 2;
  expectSameAsCpu("where",
                  {inI64(cb), in(randf(size_t(big), -1.f, 1.f, 51)),
                   in(randf(size_t(big), -1.f, 1.f, 52)), out(size_t(big))},
                  {0, 1, big, 1, 1, 1});
}

TEST(CudaCast, BothDirectionsAndOutOfRange) {
  PIPEC_REQUIRE_GPU();
  std::vector<int64_t> ints = {0,
                               1,
                               -1,
                               16777217, // 2^24 + 1 rounds
                               -16777219,
                               (int64_t(1) << 40) + 12345,
                               std::numeric_limits<int64_t>::max(),
                               std::numeric_limits<int64_t>::min(),
                               123456789};
  expectSameAsCpu("cast", {inI64(ints), out(ints.size())},
                  {PIPEC_CAST_I64_TO_F32, int64_t(ints.size())});
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> f = {0.f,    -0.f,          2.7f,           -2.7f,
                          -0.5f,  1e18f,         -1e18f,         1e19f,
                          -1e19f, 9.2233715e18f, -9.2233720e18f, kNaN,
                          inf,    -inf,          16777216.f};
  expectSameAsCpu("cast", {in(f), outI64(f.size())},
                  {PIPEC_CAST_F32_TO_I64, int64_t(f.size())});
  // An unknown direction reads floats and writes INT64_MIN.
  expectSameAsCpu("cast", {in(f), outI64(f.size())}, {7, int64_t(f.size())});
  std::vector<int64_t> many(100003);
  for (size_t i = 0; i < many.size(); ++i)
    many[i] = int64_t(i) * 977 - 50000000;
  expectSameAsCpu("cast", {inI64(many), out(many.size())},
                  {PIPEC_CAST_I64_TO_F32, int64_t(many.size())});
}

/// bfloat16 storage (--activations bf16): float32 to bfloat16 bits, bit
/// for bit as the CPU rounds (nearest, ties to even), and back. The bf16
/// buffers travel as int64 words (four bfloat16 each), compared exactly;
/// widened values compared exactly (a NaN as any NaN). NaNs are only
/// widened here: CUDA's rounding makes every NaN 0x7FFF, the CPU's keeps
/// its sign and payload.
TEST(CudaCast, Bf16BitsAsTheCpu) {
  PIPEC_REQUIRE_GPU();
  std::vector<float> f = randf(4096, -3.f, 3.f, 7);
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {0.f,      -0.f,      1.00390625f, 1.01171875f,
                            inf,      -inf,      3.0e38f,     -3.3e38f,
                            1.0e-40f, -1.0e-41f, 65504.f,     1.0e-38f};
  for (size_t i = 0; i < std::size(specials); ++i)
    f[i] = specials[i];
  expectSameAsCpu("cast", {in(f), outI64(f.size() / 4)},
                  {PIPEC_CAST_F32_TO_BF16, int64_t(f.size())});
  // Every bfloat16 bit pattern widened (NaNs included).
  std::vector<int64_t> words(1 << 14);
  for (size_t w = 0; w < words.size(); ++w) {
    uint64_t v = 0;
    for (int j = 0; j < 4; ++j)
      v |= uint64_t(uint16_t(4 * w + j)) << (16 * j);
    words[w] = int64_t(v);
  }
  expectSameAsCpu("cast", {inI64(words), out(words.size() * 4)},
                  {PIPEC_CAST_BF16_TO_F32, int64_t(words.size() * 4)}, {}, 0,
                  0);
  // An odd count (the vector path's tail; the last word's unwritten
  // half keeps its initial content on both sides).
  std::vector<float> odd = randf(1027, -1.f, 1.f, 9);
  expectSameAsCpu("cast", {in(odd), outI64(257)},
                  {PIPEC_CAST_F32_TO_BF16, 1027});
}

//===----------------------------------------------------------------------===//
// Unary
//===----------------------------------------------------------------------===//

/// Inputs of a forward opcode: a random range where the op is finite, plus
/// special values (NaN, signed zeros, saturating magnitudes) where the
/// result stays finite.
std::vector<float> unaryInput(int64_t op, size_t n, unsigned seed) {
  std::vector<float> v, special;
  switch (op) {
  case PIPEC_UN_SQRT:
    v = randf(n, 0.f, 4.f, seed);
    special = {0.f, -0.f, kNaN, -1.f, 1e-30f};
    break;
  case PIPEC_UN_LOG:
    v = randf(n, 0.01f, 4.f, seed);
    special = {1.f, kNaN, -1.f, 1e-30f};
    break;
  case PIPEC_UN_RECIPROCAL:
    v = randf(n, 0.1f, 3.f, seed);
    for (size_t i = 0; i < n; i += 2)
      v[i] = -v[i];
    special = {kNaN, 1.f, -1.f};
    break;
  case PIPEC_UN_EXP:
    v = randf(n, -10.f, 10.f, seed);
    special = {0.f, -0.f, kNaN, -100.f, 80.f};
    break;
  case PIPEC_UN_POW_SCALAR:
    v = randf(n, 0.1f, 3.f, seed);
    special = {1.f, kNaN};
    break;
  default:
    v = randf(n, -4.f, 4.f, seed);
    special = {0.f,  -0.f,  kNaN,  1e-5f,  -1e-5f, 3e-4f,  -3e-4f, 5e-4f,
               10.f, -10.f, 50.f,  -50.f,  100.f,  -100.f, 7.9f,   -7.9f,
               4.f,  -4.f,  5.66f, -5.66f, 1e30f,  -1e30f};
    break;
  }
  for (size_t i = 0; i < special.size() && i < n; ++i)
    v[i * 7 % n] = special[i];
  return v;
}

/// Every forward opcode and the reals it is tested with.
struct UnaryCase {
  int64_t op;
  std::vector<double> reals;
};

std::vector<UnaryCase> unaryCases() {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  return {
      {PIPEC_UN_COPY, {0, 0}},
      {PIPEC_UN_RELU, {0, 0}},
      {PIPEC_UN_TANH, {0, 0}},
      {PIPEC_UN_SIGMOID, {0, 0}},
      {PIPEC_UN_NEG, {0, 0}},
      {PIPEC_UN_SCALE, {2.5, 0}},
      {PIPEC_UN_SCALE, {}},
      {PIPEC_UN_EXP, {0, 0}},
      {PIPEC_UN_ERF, {0, 0}},
      {PIPEC_UN_GELU, {0, 0}},
      {PIPEC_UN_GELU_TANH, {0, 0}},
      {PIPEC_UN_SQRT, {0, 0}},
      {PIPEC_UN_LOG, {0, 0}},
      {PIPEC_UN_LEAKY_RELU, {0.1, 0}},
      {PIPEC_UN_LEAKY_RELU, {-0.3, 0}},
      {PIPEC_UN_CLIP, {-0.5, 0.7}},
      {PIPEC_UN_CLIP, {nan, 0.7}},
      {PIPEC_UN_CLIP, {-0.5, nan}},
      {PIPEC_UN_CLIP, {1.0, -1.0}},
      {PIPEC_UN_CLIP, {}},
      {PIPEC_UN_POW_SCALAR, {1, 0}},
      {PIPEC_UN_POW_SCALAR, {2, 0}},
      {PIPEC_UN_POW_SCALAR, {3, 0}},
      {PIPEC_UN_POW_SCALAR, {0.5, 0}},
      {PIPEC_UN_POW_SCALAR, {-1.5, 0}},
      {PIPEC_UN_POW_SCALAR, {0, 0}},
      {PIPEC_UN_ABS, {0, 0}},
      {PIPEC_UN_RECIPROCAL, {0, 0}},
  };
}

TEST(CudaUnary, EveryOpcode) {
  PIPEC_REQUIRE_GPU();
  unsigned seed = 200;
  for (const UnaryCase &c : unaryCases())
    for (size_t n : {size_t(1), size_t(1000), size_t(100003)}) {
      SCOPED_TRACE(::testing::Message() << "opcode " << c.op << " n " << n
                                        << " reals " << c.reals.size());
      expectSameAsCpu("unary", {in(unaryInput(c.op, n, seed++)), out(n)},
                      {c.op, int64_t(n)}, c.reals);
    }
}

TEST(CudaUnary, PowScalarOfNegativeBases) {
  PIPEC_REQUIRE_GPU();
  std::vector<float> x = randf(1000, -3.f, 3.f, 250);
  x[0] = -0.f;
  x[1] = kNaN;
  for (double alpha : {2.0, 3.0, 0.5, 1.0})
    expectSameAsCpu("unary", {in(x), out(1000)}, {PIPEC_UN_POW_SCALAR, 1000},
                    {alpha, 0});
}

TEST(CudaUnary, WideActivationInputs) {
  PIPEC_REQUIRE_GPU();
  // tanh / erf / gelu over the whole range of their approximations.
  std::vector<float> x(20001);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = -10.f + 20.f * float(i) / float(x.size() - 1);
  for (int64_t op : {PIPEC_UN_TANH, PIPEC_UN_ERF, PIPEC_UN_GELU,
                     PIPEC_UN_GELU_TANH, PIPEC_UN_SIGMOID})
    expectSameAsCpu("unary", {in(x), out(x.size())}, {op, int64_t(x.size())},
                    {0, 0});
}

TEST(CudaUnary, InPlaceEmptyAndUnknown) {
  PIPEC_REQUIRE_GPU();
  for (const UnaryCase &c : unaryCases())
    expectSameAsCpu("unary", {in(unaryInput(c.op, 777, 300)), alias(0)},
                    {c.op, 777}, c.reals);
  // n == 0 leaves Y alone; an unknown opcode poisons it.
  expectSameAsCpu("unary", {in(randf(10)), out(10)}, {PIPEC_UN_TANH, 0},
                  {0, 0});
  expectSameAsCpu("unary", {in(randf(10)), out(10)}, {77, 10}, {0, 0});
}

//===----------------------------------------------------------------------===//
// Unary gradient
//===----------------------------------------------------------------------===//

/// T of the backward of `op` (the forward output for TANH, SIGMOID, EXP,
/// SQRT and RECIPROCAL, the input otherwise), with the points where a
/// derivative switches (0, the CLIP bounds) and NaN.
std::vector<float> gradInput(int64_t op, const std::vector<double> &reals,
                             size_t n, unsigned seed) {
  std::vector<float> v, special;
  switch (op) {
  case PIPEC_UN_TANH:
    v = randf(n, -1.f, 1.f, seed);
    special = {1.f, -1.f, 0.f, kNaN};
    break;
  case PIPEC_UN_SIGMOID:
    v = randf(n, 0.f, 1.f, seed);
    special = {1.f, 0.f, kNaN};
    break;
  case PIPEC_UN_EXP:
    v = randf(n, 0.f, 5.f, seed);
    special = {0.f, kNaN};
    break;
  case PIPEC_UN_SQRT:
  case PIPEC_UN_LOG:
    v = randf(n, 0.1f, 4.f, seed);
    special = {kNaN, -1.f};
    break;
  case PIPEC_UN_RECIPROCAL:
    v = randf(n, 0.1f, 3.f, seed);
    for (size_t i = 0; i < n; i += 2)
      v[i] = -v[i];
    special = {kNaN, 0.f};
    break;
  case PIPEC_UN_POW_SCALAR:
    v = randf(n, 0.1f, 3.f, seed);
    special = {1.f, kNaN};
    if (!reals.empty() && (reals[0] == 2 || reals[0] == 3))
      special = {0.f, -0.f, -2.f, kNaN};
    break;
  default:
    v = randf(n, -4.f, 4.f, seed);
    special = {0.f, -0.f, kNaN, 1e-5f, -3e-4f, 10.f, -10.f, 100.f, -100.f};
    if (op == PIPEC_UN_CLIP && reals.size() == 2)
      special.insert(special.end(), {float(reals[0]), float(reals[1])});
    break;
  }
  for (size_t i = 0; i < special.size() && i < n; ++i)
    v[i * 7 % n] = special[i];
  return v;
}

TEST(CudaUnaryGrad, EveryOpcode) {
  PIPEC_REQUIRE_GPU();
  unsigned seed = 400;
  std::vector<UnaryCase> cases = unaryCases();
  cases.push_back({PIPEC_UN_POW_SCALAR, {2.5, 0}});
  cases.push_back({PIPEC_UN_POW_SCALAR, {-0.5, 0}});
  for (const UnaryCase &c : cases)
    for (size_t n : {size_t(1), size_t(1000), size_t(100003)}) {
      SCOPED_TRACE(::testing::Message() << "opcode " << c.op << " n " << n
                                        << " reals " << c.reals.size());
      expectSameAsCpu("unary_grad",
                      {in(gradInput(c.op, c.reals, n, seed)),
                       in(randf(n, -1.f, 1.f, seed + 1)), out(n)},
                      {c.op, int64_t(n)}, c.reals);
      seed += 2;
    }
}

TEST(CudaUnaryGrad, InPlaceAndUnknown) {
  PIPEC_REQUIRE_GPU();
  for (const UnaryCase &c : unaryCases())
    expectSameAsCpu("unary_grad",
                    {in(gradInput(c.op, c.reals, 555, 500)),
                     in(randf(555, -1.f, 1.f, 501)), alias(1)},
                    {c.op, 555}, c.reals);
  expectSameAsCpu("unary_grad", {in(randf(10)), in(randf(10)), out(10)},
                  {123, 10}, {0, 0});
}

//===----------------------------------------------------------------------===//
// Copy, fill
//===----------------------------------------------------------------------===//

TEST(CudaCopyFill, BytesAndValues) {
  PIPEC_REQUIRE_GPU();
  std::vector<int64_t> bytes(11);
  for (size_t i = 0; i < bytes.size(); ++i)
    bytes[i] = int64_t(i) * 0x0102030405060708LL;
  // A byte count that ends inside an element.
  expectSameAsCpu("copy", {inI64(bytes), outI64(11)}, {83});
  expectSameAsCpu("copy", {in(randf(100003)), out(100003)}, {4 * 100003});
  expectSameAsCpu("copy", {in(randf(5)), out(5)}, {0});
  expectSameAsCpu("copy", {in(randf(5)), alias(0)}, {20});

  expectSameAsCpu("fill", {out(1000)}, {1000}, {3.25});
  expectSameAsCpu("fill", {out(100003)}, {100003}, {-1e-3});
  expectSameAsCpu("fill", {out(257)}, {257}, {});   // reals NULL: 0
  expectSameAsCpu("fill", {out(10)}, {0}, {1.0});   // nothing written
  expectSameAsCpu("fill", {out(10)}, {7}, {1e-50}); // rounds to 0
}

//===----------------------------------------------------------------------===//
// Broadcast, strided copy
//===----------------------------------------------------------------------===//

TEST(CudaBroadcast, ShapesAndStrides) {
  PIPEC_REQUIRE_GPU();
  auto run = [](const Dims &x, const Dims &y) {
    expectSameAsCpu(
        "broadcast",
        {in(randf(size_t(numel(x)), -1.f, 1.f, 600)), out(size_t(numel(y)))},
        cat({{int64_t(y.size())}, y, broadcastStrides(x, y)}));
  };
  run({}, {});
  run({}, {1000});
  run({3, 1}, {4, 3, 5});
  run({347}, {300, 347});
  run({300, 1}, {300, 347});
  run({2, 1, 4, 1}, {2, 3, 4, 5});
  run({1, 3, 8}, {5, 3, 8}); // rows of 8 repeated: four floats at a time
  run({1, 1, 1}, {1, 1, 1});
  // X read through transposed strides.
  expectSameAsCpu("broadcast", {in(randf(6)), out(6)}, {2, 3, 2, 1, 3});
  // An empty Y.
  expectSameAsCpu("broadcast", {in(randf(3)), out(4)}, {2, 0, 3, 0, 1});
}

/// [rank, dims, srcStrides, srcOffset, dstStrides, dstOffset, accumulate].
Dims copyInts(const Dims &dims, const Dims &src, int64_t srcOffset,
              const Dims &dst, int64_t dstOffset, bool accumulate) {
  return cat({{int64_t(dims.size())},
              dims,
              src,
              {srcOffset},
              dst,
              {dstOffset, accumulate ? 1 : 0}});
}

TEST(CudaStridedCopy, SlicesReversalsAndAccumulate) {
  PIPEC_REQUIRE_GPU();
  std::vector<float> src = randf(200, -1.f, 1.f, 700); // [10, 20]
  for (bool acc : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "accumulate " << acc);
    // Rows 2..7, every other column from 3: dense [6, 7].
    expectSameAsCpu("strided_copy", {in(src), out(42)},
                    copyInts({6, 7}, {20, 2}, 43, {7, 1}, 0, acc));
    // Both dimensions reversed (negative source strides).
    expectSameAsCpu("strided_copy", {in(src), out(200)},
                    copyInts({10, 20}, {-20, -1}, 199, {20, 1}, 0, acc));
    // Reversed columns on the destination side.
    expectSameAsCpu("strided_copy", {in(src), out(200)},
                    copyInts({10, 20}, {20, 1}, 0, {20, -1}, 19, acc));
    // Pad interior: [10, 20] into a [12, 24] at (1, 2); the border stays.
    expectSameAsCpu("strided_copy", {in(src), out(288)},
                    copyInts({10, 20}, {20, 1}, 0, {24, 1}, 26, acc));
    // Several source elements onto one destination element (dst stride 0):
    // the last wins a copy, an accumulation adds them in order.
    expectSameAsCpu("strided_copy", {in(src), out(7)},
                    copyInts({5, 7}, {20, 1}, 0, {0, 1}, 0, acc));
    expectSameAsCpu("strided_copy", {in(src), out(4)},
                    copyInts({4, 50}, {50, 1}, 0, {1, 0}, 0, acc));
    // Rank 0: one element.
    expectSameAsCpu("strided_copy", {in(src), out(3)},
                    copyInts({}, {}, 5, {}, 1, acc));
    // 120000 elements read through permuted strides.
    expectSameAsCpu(
        "strided_copy", {in(randf(120000, -1.f, 1.f, 701)), out(120000)},
        copyInts({40, 50, 60}, {1, 40, 2000}, 0, {3000, 60, 1}, 0, acc));
    // Exactly in place.
    expectSameAsCpu("strided_copy", {in(randf(300, -1.f, 1.f, 702)), alias(0)},
                    copyInts({15, 20}, {20, 1}, 0, {20, 1}, 0, acc));
    // Nothing to copy.
    expectSameAsCpu("strided_copy", {in(src), out(5)},
                    copyInts({0, 5}, {5, 1}, 0, {5, 1}, 0, acc));
    // Four floats at a time (movement.cu, inFours) where rows of a multiple
    // of 4 start 16-byte aligned: rows 2..7, columns 4..15 (offset 44);
    // columns 2..13 (offset 42) one at a time; the middle third of [8, 48]
    // rows, as attention's q/k/v split.
    expectSameAsCpu("strided_copy", {in(src), out(72)},
                    copyInts({6, 12}, {20, 1}, 44, {12, 1}, 0, acc));
    expectSameAsCpu("strided_copy", {in(src), out(72)},
                    copyInts({6, 12}, {20, 1}, 42, {12, 1}, 0, acc));
    expectSameAsCpu("strided_copy", {in(randf(384, -1.f, 1.f, 703)), out(128)},
                    copyInts({8, 16}, {48, 1}, 16, {16, 1}, 0, acc));
    // Into the middle of a wider destination (a concatenation's part).
    expectSameAsCpu("strided_copy", {in(randf(128, -1.f, 1.f, 704)), out(384)},
                    copyInts({8, 16}, {16, 1}, 0, {48, 1}, 32, acc));
  }
}

//===----------------------------------------------------------------------===//
// Transpose
//===----------------------------------------------------------------------===//

TEST(CudaTranspose, PermutationsOfRank2To4) {
  PIPEC_REQUIRE_GPU();
  struct Case {
    Dims dims, perm;
  };
  const std::vector<Case> cases = {
      {{37, 129}, {1, 0}},
      {{64, 32}, {1, 0}},
      {{300, 347}, {1, 0}},
      {{5, 33, 40}, {0, 2, 1}},
      {{5, 33, 40}, {2, 1, 0}},
      {{5, 33, 40}, {1, 0, 2}},
      {{5, 33, 40}, {2, 0, 1}},
      {{5, 33, 40}, {1, 2, 0}},
      {{5, 33, 40}, {0, 1, 2}},
      {{2, 17, 6, 24}, {0, 2, 1, 3}},
      // Attention's heads (the innermost dimension kept: four floats at a
      // time), and with an innermost extent that is not a multiple of 4.
      {{2, 16, 12, 64}, {0, 2, 1, 3}},
      {{2, 16, 12, 6}, {0, 2, 1, 3}},
      {{2, 17, 6, 24}, {0, 2, 3, 1}},
      {{2, 17, 6, 24}, {3, 2, 1, 0}},
      {{2, 17, 6, 24}, {0, 1, 3, 2}},
      {{2, 17, 6, 24}, {1, 3, 0, 2}},
      {{1, 37, 1, 64}, {3, 2, 1, 0}},
      {{8, 1, 64, 48}, {0, 3, 2, 1}},
      {{}, {}},
      {{7}, {0}},
  };
  unsigned seed = 800;
  for (const Case &c : cases) {
    SCOPED_TRACE(::testing::Message() << "rank " << c.dims.size());
    const size_t n = size_t(numel(c.dims));
    expectSameAsCpu("transpose", {in(randf(n, -1.f, 1.f, seed++)), out(n)},
                    cat({{int64_t(c.dims.size())}, c.dims, c.perm}));
  }
  // Not a permutation: Y is poisoned with NaN.
  expectSameAsCpu("transpose", {in(randf(6)), out(6)}, {2, 2, 3, 0, 0});
}

//===----------------------------------------------------------------------===//
// Reduce sum
//===----------------------------------------------------------------------===//

/// [rank, xDims, yStrides] reducing the dims flagged in `reduced`.
Dims reduceInts(const Dims &x, const std::vector<bool> &reduced) {
  Dims yDims = x;
  for (size_t i = 0; i < x.size(); ++i)
    if (reduced[i])
      yDims[i] = 1;
  Dims ys = contiguous(yDims);
  for (size_t i = 0; i < x.size(); ++i)
    if (reduced[i] || x[i] == 1)
      ys[i] = 0;
  return cat({{int64_t(x.size())}, x, ys});
}

int64_t keptCount(const Dims &x, const std::vector<bool> &reduced) {
  int64_t n = 1;
  for (size_t i = 0; i < x.size(); ++i)
    if (!reduced[i])
      n *= x[i];
  return n;
}

TEST(CudaReduceSum, LeadingTrailingMiddleAndScale) {
  PIPEC_REQUIRE_GPU();
  struct Case {
    Dims x;
    std::vector<bool> reduced;
    std::vector<double> reals;
  };
  const std::vector<Case> cases = {
      {{64, 37}, {true, false}, {1}},          // leading (bias gradient)
      {{37, 64}, {false, true}, {0.5}},        // trailing, warp per row
      {{500, 7}, {false, true}, {1}},          // trailing, thread per row
      {{6, 50, 7}, {false, true, false}, {2}}, // middle
      {{6, 50, 7}, {true, false, true}, {1}},  // leading and trailing
      {{4, 5, 6, 7}, {false, true, false, true}, {-1.5}},
      {{4, 5, 6, 7}, {true, false, true, false}, {1}},
      {{100003}, {true}, {0.25}},      // everything, one warp
      {{4096, 7}, {true, false}, {1}}, // long float chains
      {{7, 4096}, {false, true}, {1}},
      {{3, 1, 5}, {false, true, true}, {1}}, // a reduced unit dimension
      {{13, 17}, {false, false}, {1}},       // nothing reduced
      {{13, 17}, {false, false}, {3}},
      {{300, 347}, {true, false}, {1}},
      {{300, 347}, {false, true}, {1}},
      {{8, 16}, {true, true}, {}}, // reals NULL: scale 1
      // Rows summed by blocks, then chained over the outer rows.
      {{64, 16, 100}, {true, false, true}, {1}},
      // Few long rows split into chunks, then chained (300 outer rows).
      {{300, 3, 5000}, {true, false, true}, {0.5}},
      // A long chain over an outer dimension and a strided run.
      {{20, 8, 30, 9}, {true, false, true, false}, {1}},
      {{1000, 33}, {true, false}, {1}},
      // Bias gradients of a [B, T, C] activation: the chunked order.
      {{8192, 96}, {true, false}, {0.5}},
      {{2, 4096, 96}, {true, true, false}, {1}},
  };
  unsigned seed = 900;
  for (const Case &c : cases) {
    SCOPED_TRACE(::testing::Message()
                 << "rank " << c.x.size() << " numel " << numel(c.x));
    expectSameAsCpu("reduce_sum",
                    {in(randf(size_t(numel(c.x)), -1.f, 1.f, seed++)),
                     out(size_t(keptCount(c.x, c.reduced)))},
                    reduceInts(c.x, c.reduced), c.reals);
  }
}

TEST(CudaReduceSum, ScalarsPermutedAndEmpty) {
  PIPEC_REQUIRE_GPU();
  // Rank 0 with a scale.
  expectSameAsCpu("reduce_sum", {in({1.5f}), out(1)}, {0}, {2});
  // Y written through transposed strides: [8, 9] onto [9, 8], no reduction,
  // and [8, 9, 5] onto [9, 8] summing the last dimension.
  expectSameAsCpu("reduce_sum", {in(randf(72, -1.f, 1.f, 950)), out(72)},
                  {2, 8, 9, 1, 8}, {1});
  expectSameAsCpu("reduce_sum", {in(randf(360, -1.f, 1.f, 951)), out(72)},
                  {3, 8, 9, 5, 1, 8, 0}, {1});
  // A long chain into transposed Y strides: [100, 8, 9] onto [9, 8].
  expectSameAsCpu("reduce_sum", {in(randf(7200, -1.f, 1.f, 952)), out(72)},
                  {3, 100, 8, 9, 0, 1, 8}, {1});
  // An empty X gives zeros.
  expectSameAsCpu("reduce_sum", {in(randf(1)), out(5)}, {2, 0, 5, 0, 1}, {1});
}

//===----------------------------------------------------------------------===//
// Gather
//===----------------------------------------------------------------------===//

TEST(CudaGather, WrappedAndOutOfRangeIndices) {
  PIPEC_REQUIRE_GPU();
  const std::vector<int64_t> idx = {0, 9, -1, -10, 10, -11, 100,
                                    3, 3, 5,  -3,  2,  7};
  const int64_t nIdx = int64_t(idx.size());
  expectSameAsCpu("gather",
                  {in(randf(3 * 10 * 7, -1.f, 1.f, 1000)), inI64(idx),
                   out(size_t(3 * nIdx * 7))},
                  {3, 10, 7, nIdx});
  // Embedding lookup: outer 1, inner 64.
  std::vector<int64_t> tokens(517);
  for (size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = int64_t((i * 7919) % 1000);
  expectSameAsCpu(
      "gather",
      {in(randf(1000 * 64, -1.f, 1.f, 1001)), inI64(tokens), out(517 * 64)},
      {1, 1000, 64, 517});
  // Inner 1 (a gather along the last axis), and no indices.
  expectSameAsCpu(
      "gather",
      {in(randf(40 * 10, -1.f, 1.f, 1002)), inI64(idx), out(size_t(40 * nIdx))},
      {40, 10, 1, nIdx});
  expectSameAsCpu("gather", {in(randf(10)), inI64({0}), out(4)}, {1, 10, 1, 0});
}

TEST(CudaGatherGrad, RepeatedIndices) {
  PIPEC_REQUIRE_GPU();
  const std::vector<int64_t> idx = {0, 9, -1, -10, 10, -11, 100, 3,
                                    3, 5, -3, 2,   7,  3,   -7};
  const int64_t nIdx = int64_t(idx.size());
  expectSameAsCpu("gather_grad",
                  {in(randf(size_t(2 * nIdx * 7), -1.f, 1.f, 1100)), inI64(idx),
                   out(2 * 10 * 7)},
                  {2, 10, 7, nIdx});
  // Many repeats of few rows (embedding backward with a small vocabulary).
  std::vector<int64_t> tokens(3001);
  for (size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = int64_t((i * i + 3 * i) % 50) - (i % 4 == 0 ? 50 : 0);
  expectSameAsCpu(
      "gather_grad",
      {in(randf(3001 * 33, -1.f, 1.f, 1101)), inI64(tokens), out(50 * 33)},
      {1, 50, 33, 3001});
  // A large vocabulary, mostly untouched rows.
  std::vector<int64_t> sparse(777);
  for (size_t i = 0; i < sparse.size(); ++i)
    sparse[i] = int64_t((i * 104729) % 30000);
  expectSameAsCpu(
      "gather_grad",
      {in(randf(777 * 16, -1.f, 1.f, 1102)), inI64(sparse), out(30000 * 16)},
      {1, 30000, 16, 777});
  // Inner 1 with outer rows, and no indices (dData is just zeroed).
  expectSameAsCpu(
      "gather_grad",
      {in(randf(size_t(40 * nIdx), -1.f, 1.f, 1103)), inI64(idx), out(40 * 10)},
      {40, 10, 1, nIdx});
  expectSameAsCpu("gather_grad", {in(randf(1)), inI64({0}), out(30)},
                  {3, 10, 1, 0});
}

} // namespace
