//===- kernels_elementwise_test.cpp - New unary and binary opcodes --------===//
//
// Part of pipec. Checks the unary opcodes ERF..RECIPROCAL and the binary
// opcodes POW / MAX / MIN against double-precision references, their
// backward (pipec_k_unary_grad, pipec_k_binary_grad) against closed forms
// and central finite differences, and the documented conventions at kinks
// and for NULL parameters.
//
//===----------------------------------------------------------------------===//

#include "kernels_nn_test_util.h"

#include <functional>
#include <limits>

using namespace pipec_test;

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

//===----------------------------------------------------------------------===//
// Unary forward
//===----------------------------------------------------------------------===//

/// One unary case: opcode, parameters, the input range, and the reference.
struct UnaryCase {
  int64_t op;
  double alpha, beta;
  float lo, hi;
  std::function<double(double)> ref;
  /// Whether the backward reads the forward output (else the input).
  bool gradFromY;
  const char *name;
};

std::vector<UnaryCase> unaryCases() {
  const double pi = 3.14159265358979323846;
  auto gelu = [](double x) {
    return 0.5 * x * (1 + std::erf(x / std::sqrt(2)));
  };
  auto geluTanh = [pi](double x) {
    return 0.5 * x *
           (1 + std::tanh(std::sqrt(2 / pi) * (x + 0.044715 * x * x * x)));
  };
  return {
      {PIPEC_UN_ERF, 0, 0, -3, 3, [](double x) { return std::erf(x); }, false,
       "erf"},
      {PIPEC_UN_GELU, 0, 0, -4, 4, gelu, false, "gelu"},
      {PIPEC_UN_GELU_TANH, 0, 0, -4, 4, geluTanh, false, "gelu_tanh"},
      {PIPEC_UN_SQRT, 0, 0, 0.2f, 4, [](double x) { return std::sqrt(x); },
       true, "sqrt"},
      {PIPEC_UN_LOG, 0, 0, 0.2f, 4, [](double x) { return std::log(x); }, false,
       "log"},
      {PIPEC_UN_LEAKY_RELU, 0.13, 0, -2, 2,
       [](double x) { return x >= 0 ? x : 0.13 * x; }, false, "leaky_relu"},
      {PIPEC_UN_CLIP, -0.5, 0.8, -2, 2,
       [](double x) { return std::min(std::max(x, -0.5), 0.8); }, false,
       "clip"},
      {PIPEC_UN_POW_SCALAR, 2, 0, -2, 2, [](double x) { return x * x; }, false,
       "pow 2"},
      {PIPEC_UN_POW_SCALAR, 3, 0, -2, 2, [](double x) { return x * x * x; },
       false, "pow 3"},
      {PIPEC_UN_POW_SCALAR, 0.5, 0, 0.2f, 3,
       [](double x) { return std::pow(x, 0.5); }, false, "pow 0.5"},
      {PIPEC_UN_POW_SCALAR, -1.5, 0, 0.3f, 3,
       [](double x) { return std::pow(x, -1.5); }, false, "pow -1.5"},
      {PIPEC_UN_POW_SCALAR, 2.7, 0, 0.2f, 2,
       [](double x) { return std::pow(x, 2.7); }, false, "pow 2.7"},
      {PIPEC_UN_POW_SCALAR, 1, 0, -2, 2, [](double x) { return x; }, false,
       "pow 1"},
      {PIPEC_UN_ABS, 0, 0, -2, 2, [](double x) { return std::fabs(x); }, false,
       "abs"},
      {PIPEC_UN_RECIPROCAL, 0, 0, 0.4f, 2.5f, [](double x) { return 1 / x; },
       true, "reciprocal"},
  };
}

TEST(KernelUnaryNew, MatchesDoubleReference) {
  std::mt19937 rng(101);
  for (const UnaryCase &c : unaryCases()) {
    for (bool inPlace : {false, true}) {
      const int64_t n = 203; // odd: exercises vector tails
      Floats x = randomFloats(rng, n, c.lo, c.hi);
      if (c.op == PIPEC_UN_RECIPROCAL) // both signs, away from 0
        for (size_t i = 0; i < x.size(); i += 2)
          x[i] = -x[i];
      Floats y(x.size(), kNaN);
      if (inPlace) {
        y = x;
        unary2(c.op, y.data(), y.data(), n, c.alpha, c.beta);
      } else {
        unary2(c.op, x.data(), y.data(), n, c.alpha, c.beta);
      }
      for (int64_t i = 0; i < n; ++i) {
        double ref = c.ref(x[size_t(i)]);
        EXPECT_NEAR(y[size_t(i)], ref, 1e-6 + 4e-6 * std::fabs(ref))
            << c.name << " x=" << x[size_t(i)] << " inPlace=" << inPlace;
      }
    }
  }
}

TEST(KernelUnaryNew, ParameterDefaultsAndSpecialValues) {
  Floats x = {-2.0f, -0.5f, 0.0f, 0.5f, 3.0f, kNaN};
  const int64_t n = int64_t(x.size());
  Floats y(x.size());
  auto run = [&](int64_t op, const double *reals) {
    void *bufs[] = {x.data(), y.data()};
    int64_t ints[] = {op, n};
    pipec_k_unary(kctx(), bufs, ints, reals);
  };
  // NULL reals: CLIP has no bounds, LEAKY_RELU slope 0, POW_SCALAR x^0.
  run(PIPEC_UN_CLIP, nullptr);
  for (size_t i = 0; i + 1 < x.size(); ++i)
    EXPECT_EQ(y[i], x[i]);
  EXPECT_TRUE(std::isnan(y.back())); // NaN propagates through CLIP.
  run(PIPEC_UN_LEAKY_RELU, nullptr);
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(y[4], 3.0f);
  EXPECT_TRUE(std::isnan(y.back()));
  run(PIPEC_UN_POW_SCALAR, nullptr);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[2], 1.0f); // pow(0, 0) == 1
  // A NaN bound is an absent bound.
  const double lowOnly[] = {-0.5, std::nan("")};
  run(PIPEC_UN_CLIP, lowOnly);
  EXPECT_EQ(y[0], -0.5f);
  EXPECT_EQ(y[4], 3.0f);
  const double highOnly[] = {std::nan(""), 0.25};
  run(PIPEC_UN_CLIP, highOnly);
  EXPECT_EQ(y[0], -2.0f);
  EXPECT_EQ(y[4], 0.25f);
  // min > max gives max (numpy.clip).
  const double crossed[] = {1.0, -1.0};
  run(PIPEC_UN_CLIP, crossed);
  for (size_t i = 0; i + 1 < x.size(); ++i)
    EXPECT_EQ(y[i], -1.0f);
  // IEEE edge values.
  run(PIPEC_UN_LOG, nullptr);
  EXPECT_EQ(y[2], -kInf);
  EXPECT_TRUE(std::isnan(y[0]));
  run(PIPEC_UN_SQRT, nullptr);
  EXPECT_TRUE(std::isnan(y[0]));
  EXPECT_EQ(y[2], 0.0f);
  run(PIPEC_UN_RECIPROCAL, nullptr);
  EXPECT_EQ(y[2], kInf);
  EXPECT_EQ(y[4], 1.0f / 3.0f);
  run(PIPEC_UN_ABS, nullptr);
  EXPECT_EQ(y[0], 2.0f);
  EXPECT_TRUE(std::isnan(y.back()));
  // GELU of large |x| saturates to x and 0, without NaN.
  Floats big = {-30.0f, 30.0f}, out(2);
  unary2(PIPEC_UN_GELU, big.data(), out.data(), 2, 0, 0);
  EXPECT_EQ(out[0], -0.0f);
  EXPECT_EQ(out[1], 30.0f);
  unary2(PIPEC_UN_GELU_TANH, big.data(), out.data(), 2, 0, 0);
  EXPECT_NEAR(out[0], 0.0f, 1e-5);
  EXPECT_NEAR(out[1], 30.0f, 1e-5);
}

//===----------------------------------------------------------------------===//
// Unary backward
//===----------------------------------------------------------------------===//

TEST(KernelUnaryGradNew, MatchesFiniteDifferences) {
  std::mt19937 rng(102);
  for (const UnaryCase &c : unaryCases()) {
    for (bool inPlace : {false, true}) {
      const int64_t n = 61;
      Floats x = randomFloats(rng, n, c.lo, c.hi);
      if (c.op == PIPEC_UN_RECIPROCAL)
        for (size_t i = 0; i < x.size(); i += 2)
          x[i] = -x[i];
      // Keep every point 5 steps away from the kinks (0 for ABS and
      // LEAKY_RELU, the bounds for CLIP).
      std::vector<double> kinks;
      if (c.op == PIPEC_UN_ABS || c.op == PIPEC_UN_LEAKY_RELU)
        kinks = {0.0};
      else if (c.op == PIPEC_UN_CLIP)
        kinks = {c.alpha, c.beta};
      for (float &v : x)
        for (double kink : kinks)
          if (std::fabs(v - kink) < 0.05)
            v = float(kink + (v < kink ? -0.1 : 0.1));
      Floats r = randomFloats(rng, n);
      Floats y(x.size());
      unary2(c.op, x.data(), y.data(), n, c.alpha, c.beta);
      const Floats &t = c.gradFromY ? y : x;
      Floats dy = r, dx(x.size(), kNaN);
      float *out = inPlace ? dy.data() : dx.data(); // dX may alias dY
      unaryGrad2(c.op, t.data(), dy.data(), out, n, c.alpha, c.beta);
      Floats grad(out, out + n);
      auto loss = [&](const Floats &xs) {
        Floats ys(xs.size());
        unary2(c.op, xs.data(), ys.data(), n, c.alpha, c.beta);
        return dot(r, ys);
      };
      expectGradMatchesFiniteDifferences(x, grad, loss, 1e-2, 2e-3, 2e-3,
                                         std::string(c.name) +
                                             (inPlace ? " in place" : ""));
    }
  }
}

TEST(KernelUnaryGradNew, ConventionsAtKinks) {
  // x on the kinks: 0 for ABS / LEAKY_RELU, the bounds for CLIP.
  Floats x = {-1.0f, 0.0f, 0.5f, 1.0f, 2.0f}, dy = {1, 1, 1, 1, 1}, dx(5);
  unaryGrad2(PIPEC_UN_ABS, x.data(), dy.data(), dx.data(), 5, 0, 0);
  EXPECT_EQ(dx, (Floats{-1, 0, 1, 1, 1}));
  unaryGrad2(PIPEC_UN_LEAKY_RELU, x.data(), dy.data(), dx.data(), 5, 0.25, 0);
  EXPECT_EQ(dx, (Floats{0.25f, 0.25f, 1, 1, 1}));
  // CLIP passes strictly inside (min, max) only.
  unaryGrad2(PIPEC_UN_CLIP, x.data(), dy.data(), dx.data(), 5, 0.0, 1.0);
  EXPECT_EQ(dx, (Floats{0, 0, 1, 0, 0}));
  unaryGrad2(PIPEC_UN_CLIP, x.data(), dy.data(), dx.data(), 5, 0.5, 0.5);
  EXPECT_EQ(dx, (Floats{0, 0, 0, 0, 0}));
  {
    // NULL reals: CLIP without bounds passes everything.
    void *bufs[] = {x.data(), dy.data(), dx.data()};
    int64_t ints[] = {PIPEC_UN_CLIP, 5};
    pipec_k_unary_grad(kctx(), bufs, ints, nullptr);
    EXPECT_EQ(dx, dy);
  }
  // POW_SCALAR with exponent 0 has a zero gradient, also at x == 0.
  unaryGrad2(PIPEC_UN_POW_SCALAR, x.data(), dy.data(), dx.data(), 5, 0, 0);
  EXPECT_EQ(dx, (Floats{0, 0, 0, 0, 0}));
  // POW_SCALAR 1 at 0 is 1 (not 0 * inf).
  unaryGrad2(PIPEC_UN_POW_SCALAR, x.data(), dy.data(), dx.data(), 5, 1, 0);
  EXPECT_EQ(dx, dy);
  // Unknown opcodes poison.
  unaryGrad2(99, x.data(), dy.data(), dx.data(), 5, 0, 0);
  for (float v : dx)
    EXPECT_TRUE(std::isnan(v));
}

//===----------------------------------------------------------------------===//
// Binary forward
//===----------------------------------------------------------------------===//

double binaryRef(int64_t op, double a, double b) {
  switch (op) {
  case PIPEC_BIN_ADD:
    return a + b;
  case PIPEC_BIN_SUB:
    return a - b;
  case PIPEC_BIN_MUL:
    return a * b;
  case PIPEC_BIN_DIV:
    return a / b;
  case PIPEC_BIN_POW:
    return std::pow(a, b);
  case PIPEC_BIN_MAX:
    return a >= b ? a : b;
  case PIPEC_BIN_MIN:
    return a <= b ? a : b;
  }
  return std::nan("");
}

/// A random output shape of rank 0..4 with extents 1..5, and random
/// broadcast shapes of A and B.
struct BroadcastCase {
  Dims out, aShape, bShape, as, bs;
};

BroadcastCase randomBroadcastCase(std::mt19937 &rng, int64_t minExtent = 1) {
  BroadcastCase c;
  int64_t rank = randomInt(rng, 0, 4);
  for (int64_t i = 0; i < rank; ++i)
    c.out.push_back(randomInt(rng, minExtent, 5));
  c.aShape = randomBroadcastShape(rng, c.out);
  c.bShape = randomBroadcastShape(rng, c.out);
  c.as = broadcastStrides(c.aShape, c.out);
  c.bs = broadcastStrides(c.bShape, c.out);
  return c;
}

TEST(KernelBinaryNew, PowMaxMinMatchReferenceWithBroadcasting) {
  std::mt19937 rng(103);
  for (int64_t op : {PIPEC_BIN_POW, PIPEC_BIN_MAX, PIPEC_BIN_MIN}) {
    for (int trial = 0; trial < 60; ++trial) {
      BroadcastCase c = randomBroadcastCase(rng);
      SCOPED_TRACE(::testing::Message()
                   << "op=" << op << " out=" << dimsToString(c.out)
                   << " a=" << dimsToString(c.aShape)
                   << " b=" << dimsToString(c.bShape));
      bool pow = op == PIPEC_BIN_POW;
      Floats a = randomFloats(rng, numel(c.aShape), pow ? 0.1f : -2.0f, 2.0f);
      Floats b = randomFloats(rng, numel(c.bShape), -2.0f, 2.0f);
      // Some exact ties for MAX / MIN.
      if (!pow && !a.empty() && !b.empty())
        b[0] = a[0];
      Floats y(size_t(numel(c.out)), kNaN);
      binary(op, a.data(), b.data(), y.data(), c.out, c.as, c.bs);
      Dims ys = rowMajorStrides(c.out);
      forEachMultiIndex(c.out, [&](const Dims &idx) {
        double ref = binaryRef(op, a[size_t(dotIndex(idx, c.as))],
                               b[size_t(dotIndex(idx, c.bs))]);
        EXPECT_NEAR(y[size_t(dotIndex(idx, ys))], ref,
                    1e-6 + 4e-6 * std::fabs(ref));
      });
    }
  }
}

TEST(KernelBinaryNew, PowScalarExponentsAndNegativeBases) {
  // A broadcast scalar exponent 2 takes the exact a * a path; 3 and -1 take
  // std::pow, which is exact for integer exponents of negative bases too.
  Floats a = {-3.0f, -0.5f, 0.0f, 1.5f, 2.0f};
  Dims dims = {5}, as = {1}, bs = {0};
  for (float e : {2.0f, 3.0f, -1.0f, 0.0f}) {
    Floats b = {e}, y(5);
    binary(PIPEC_BIN_POW, a.data(), b.data(), y.data(), dims, as, bs);
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_FLOAT_EQ(y[i], float(std::pow(double(a[i]), double(e))))
          << "exponent " << e << " base " << a[i];
  }
  // A non-integer exponent of a negative base is NaN (ONNX / numpy).
  Floats b = {0.5f}, y(5);
  binary(PIPEC_BIN_POW, a.data(), b.data(), y.data(), dims, as, bs);
  EXPECT_TRUE(std::isnan(y[0]));
}

TEST(KernelBinaryNew, MaxMinPropagateNaNAndTiesGoToA) {
  Floats a = {kNaN, 1.0f, 0.0f, -0.0f, 2.0f};
  Floats b = {1.0f, kNaN, -0.0f, 0.0f, 3.0f};
  Dims dims = {5}, s = {1};
  Floats y(5);
  for (int64_t op : {PIPEC_BIN_MAX, PIPEC_BIN_MIN}) {
    binary(op, a.data(), b.data(), y.data(), dims, s, s);
    EXPECT_TRUE(std::isnan(y[0])) << op;
    EXPECT_TRUE(std::isnan(y[1])) << op;
    // +0 == -0: a tie, and ties return A (visible through the sign).
    EXPECT_FALSE(std::signbit(y[2])) << op;
    EXPECT_TRUE(std::signbit(y[3])) << op;
    EXPECT_EQ(y[4], op == PIPEC_BIN_MAX ? 3.0f : 2.0f);
  }
}

//===----------------------------------------------------------------------===//
// Binary backward
//===----------------------------------------------------------------------===//

/// d(a op b)/da and d(a op b)/db in double, with the kernel's conventions.
void binaryGradRef(int64_t op, double a, double b, double &ga, double &gb) {
  switch (op) {
  case PIPEC_BIN_ADD:
    ga = 1, gb = 1;
    return;
  case PIPEC_BIN_SUB:
    ga = 1, gb = -1;
    return;
  case PIPEC_BIN_MUL:
    ga = b, gb = a;
    return;
  case PIPEC_BIN_DIV:
    ga = 1 / b, gb = -a / (b * b);
    return;
  case PIPEC_BIN_POW:
    ga = b == 0 ? 0 : b * std::pow(a, b - 1);
    gb = (a == 0 && b >= 0) ? 0 : std::pow(a, b) * std::log(a);
    return;
  case PIPEC_BIN_MAX:
    ga = a >= b ? 1 : 0, gb = 1 - ga;
    return;
  case PIPEC_BIN_MIN:
    ga = a <= b ? 1 : 0, gb = 1 - ga;
    return;
  }
}

/// Operand values for a binary grad test: POW needs positive bases and
/// DIV a divisor away from 0; MAX / MIN need A and B at least 0.04 apart
/// (no ties, and a finite-difference step of 0.01 never crosses).
void binaryGradOperands(std::mt19937 &rng, int64_t op, int64_t na, int64_t nb,
                        Floats &a, Floats &b) {
  a = randomFloats(rng, na, -2, 2);
  b = randomFloats(rng, nb, -2, 2);
  if (op == PIPEC_BIN_POW) {
    a = randomFloats(rng, na, 0.4f, 2.0f);
    b = randomFloats(rng, nb, -1.5f, 1.5f);
  } else if (op == PIPEC_BIN_DIV) {
    for (float &v : b)
      v = v < 0 ? v - 0.5f : v + 0.5f;
  } else if (op == PIPEC_BIN_MAX || op == PIPEC_BIN_MIN) {
    for (float &v : a)
      v = float(randomInt(rng, -20, 20)) * 0.1f + 0.03f;
    for (float &v : b)
      v = float(randomInt(rng, -20, 20)) * 0.1f + 0.07f;
  }
}

const int64_t kAllBinaryOps[] = {PIPEC_BIN_ADD, PIPEC_BIN_SUB, PIPEC_BIN_MUL,
                                 PIPEC_BIN_DIV, PIPEC_BIN_POW, PIPEC_BIN_MAX,
                                 PIPEC_BIN_MIN};

TEST(KernelBinaryGrad, FullShapeGradientsMatchClosedForm) {
  std::mt19937 rng(104);
  for (int64_t op : kAllBinaryOps) {
    for (int trial = 0; trial < 25; ++trial) {
      BroadcastCase c = randomBroadcastCase(rng);
      SCOPED_TRACE(::testing::Message()
                   << "op=" << op << " out=" << dimsToString(c.out)
                   << " a=" << dimsToString(c.aShape)
                   << " b=" << dimsToString(c.bShape));
      Floats a, b;
      binaryGradOperands(rng, op, numel(c.aShape), numel(c.bShape), a, b);
      size_t ny = size_t(numel(c.out));
      Floats dy = randomFloats(rng, int64_t(ny));
      Floats da(ny, kNaN), db(ny, kNaN);
      // Alternate between separate outputs, NULL outputs and dA == dY.
      int mode = trial % 4;
      Floats dyCopy = dy;
      float *daPtr =
          mode == 2 ? nullptr : (mode == 3 ? dyCopy.data() : da.data());
      float *dbPtr = mode == 1 ? nullptr : db.data();
      binaryGrad(op, a.data(), b.data(), mode == 3 ? dyCopy.data() : dy.data(),
                 daPtr, dbPtr, c.out, c.as, c.bs);
      if (mode == 3)
        da = dyCopy;
      Dims ys = rowMajorStrides(c.out);
      forEachMultiIndex(c.out, [&](const Dims &idx) {
        size_t yi = size_t(dotIndex(idx, ys));
        double ga = 0, gb = 0;
        binaryGradRef(op, a[size_t(dotIndex(idx, c.as))],
                      b[size_t(dotIndex(idx, c.bs))], ga, gb);
        double refA = dy[yi] * ga, refB = dy[yi] * gb;
        if (daPtr)
          EXPECT_NEAR(da[yi], refA, 1e-6 + 4e-6 * std::fabs(refA));
        else
          EXPECT_TRUE(std::isnan(da[yi])); // untouched
        if (dbPtr)
          EXPECT_NEAR(db[yi], refB, 1e-6 + 4e-6 * std::fabs(refB));
        else
          EXPECT_TRUE(std::isnan(db[yi]));
      });
    }
  }
}

TEST(KernelBinaryGrad, ReducedGradientsMatchFiniteDifferences) {
  // What the compiler emits: binary_grad, then reduce_sum onto each
  // operand's shape.
  std::mt19937 rng(105);
  for (int64_t op : kAllBinaryOps) {
    double largest = 0;
    for (int trial = 0; trial < 12; ++trial) {
      BroadcastCase c = randomBroadcastCase(rng, 2);
      Floats a, b;
      binaryGradOperands(rng, op, numel(c.aShape), numel(c.bShape), a, b);
      Floats r = randomFloats(rng, numel(c.out));
      Floats daFull(r.size()), dbFull(r.size());
      binaryGrad(op, a.data(), b.data(), r.data(), daFull.data(), dbFull.data(),
                 c.out, c.as, c.bs);
      Floats da(a.size()), db(b.size());
      reduceSum(daFull.data(), da.data(), c.out, c.as, 1.0);
      reduceSum(dbFull.data(), db.data(), c.out, c.bs, 1.0);
      auto lossA = [&](const Floats &av) {
        Floats y(r.size());
        binary(op, av.data(), b.data(), y.data(), c.out, c.as, c.bs);
        return dot(r, y);
      };
      auto lossB = [&](const Floats &bv) {
        Floats y(r.size());
        binary(op, a.data(), bv.data(), y.data(), c.out, c.as, c.bs);
        return dot(r, y);
      };
      std::string what =
          "op=" + std::to_string(op) + " out=" + dimsToString(c.out) +
          " a=" + dimsToString(c.aShape) + " b=" + dimsToString(c.bShape);
      largest = std::max(
          largest, expectGradMatchesFiniteDifferences(a, da, lossA, 1e-2, 3e-3,
                                                      3e-3, "dA " + what, 0));
      largest = std::max(
          largest, expectGradMatchesFiniteDifferences(b, db, lossB, 1e-2, 3e-3,
                                                      3e-3, "dB " + what, 0));
    }
    EXPECT_GT(largest, 0.1) << "op " << op;
  }
}

TEST(KernelBinaryGrad, TiesAndPowConventions) {
  Dims dims = {4}, s = {1};
  // MAX / MIN ties send the whole gradient to A.
  Floats a = {1, 2, 3, 4}, b = {1, 1, 3, 5}, dy = {10, 20, 30, 40};
  Floats da(4), db(4);
  binaryGrad(PIPEC_BIN_MAX, a.data(), b.data(), dy.data(), da.data(), db.data(),
             dims, s, s);
  EXPECT_EQ(da, (Floats{10, 20, 30, 0}));
  EXPECT_EQ(db, (Floats{0, 0, 0, 40}));
  binaryGrad(PIPEC_BIN_MIN, a.data(), b.data(), dy.data(), da.data(), db.data(),
             dims, s, s);
  EXPECT_EQ(da, (Floats{10, 0, 30, 40}));
  EXPECT_EQ(db, (Floats{0, 20, 0, 0}));
  // POW: dB is 0 at a == 0 with b >= 0; dA is 0 where b == 0.
  Floats pa = {0, 0, 2, 0}, pb = {0, 2, 0, 1}, ones = {1, 1, 1, 1};
  binaryGrad(PIPEC_BIN_POW, pa.data(), pb.data(), ones.data(), da.data(),
             db.data(), dims, s, s);
  EXPECT_EQ(da, (Floats{0, 0, 0, 1}));
  EXPECT_EQ(db[0], 0.0f);
  EXPECT_EQ(db[1], 0.0f);
  EXPECT_FLOAT_EQ(db[2], float(std::log(2.0)));
  EXPECT_EQ(db[3], 0.0f);
  // Unknown opcodes poison both outputs.
  binaryGrad(99, a.data(), b.data(), dy.data(), da.data(), db.data(), dims, s,
             s);
  for (size_t i = 0; i < 4; ++i)
    EXPECT_TRUE(std::isnan(da[i]) && std::isnan(db[i]));
}

} // namespace
