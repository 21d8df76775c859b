//===- kernels_test_util.h - Helpers for the CPU kernel tests ---*- C++ -*-===//
//
// Part of pipec. Test-only helpers shared by runtime/tests/kernels_*_test.cpp.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Random data, shape/stride helpers, thin wrappers that assemble each
/// kernel's `ints` / `reals` arrays exactly as documented in pipec_rt.h, and
/// a central finite-difference checker for vector-Jacobian products.
///
//===----------------------------------------------------------------------===//

#ifndef PIPEC_RUNTIME_TESTS_KERNELS_TEST_UTIL_H
#define PIPEC_RUNTIME_TESTS_KERNELS_TEST_UTIL_H

#include "cpu/kernel_context.h"
#include "pipec_rt.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace pipec_test {

using Floats = std::vector<float>;
using Dims = std::vector<int64_t>;

/// The kernel context the tests call the CPU kernels with (float32
/// arithmetic unless a test turns matmulBf16 on for a while).
inline pipec::cpu::KernelContext *kctx() {
  static pipec::cpu::KernelContext context;
  return &context;
}

//===----------------------------------------------------------------------===//
// Data and shapes
//===----------------------------------------------------------------------===//

/// n floats uniform in [lo, hi).
inline Floats randomFloats(std::mt19937 &rng, int64_t n, float lo = -1.0f,
                           float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  Floats v(size_t(std::max<int64_t>(n, 0)));
  for (float &x : v)
    x = dist(rng);
  return v;
}

/// Uniform integer in [lo, hi].
inline int64_t randomInt(std::mt19937 &rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

inline int64_t numel(const Dims &dims) {
  int64_t n = 1;
  for (int64_t d : dims)
    n *= d;
  return n;
}

/// Row-major strides of a dense tensor.
inline Dims rowMajorStrides(const Dims &dims) {
  Dims s(dims.size());
  int64_t acc = 1;
  for (size_t i = dims.size(); i-- > 0;) {
    s[i] = acc;
    acc *= dims[i];
  }
  return s;
}

/// Element strides, per dimension of `out`, of a dense tensor of shape
/// `shape` broadcast to `out` with numpy rules (right-aligned; 0 along
/// broadcast and missing leading dimensions).
inline Dims broadcastStrides(const Dims &shape, const Dims &out) {
  Dims own = rowMajorStrides(shape);
  Dims s(out.size(), 0);
  size_t offset = out.size() - shape.size();
  for (size_t i = 0; i < shape.size(); ++i)
    s[offset + i] = shape[i] == 1 ? 0 : own[i];
  return s;
}

/// A random shape that broadcasts to `out`: some dims set to 1 and, with
/// probability 1/3, some leading dims dropped.
inline Dims randomBroadcastShape(std::mt19937 &rng, const Dims &out) {
  size_t drop = 0;
  if (!out.empty() && randomInt(rng, 0, 2) == 0)
    drop = size_t(randomInt(rng, 0, int64_t(out.size())));
  Dims shape(out.begin() + drop, out.end());
  for (int64_t &d : shape)
    if (randomInt(rng, 0, 2) == 0)
      d = 1;
  return shape;
}

/// Visits every multi-index of `dims` in row-major order.
template <typename Fn> void forEachMultiIndex(const Dims &dims, Fn &&fn) {
  if (numel(dims) == 0)
    return;
  Dims idx(dims.size(), 0);
  while (true) {
    fn(static_cast<const Dims &>(idx));
    size_t d = dims.size();
    while (d > 0) {
      --d;
      if (++idx[d] < dims[d])
        break;
      idx[d] = 0;
      if (d == 0)
        return;
    }
    if (dims.empty())
      return;
  }
}

inline int64_t dotIndex(const Dims &idx, const Dims &strides) {
  int64_t off = 0;
  for (size_t i = 0; i < idx.size(); ++i)
    off += idx[i] * strides[i];
  return off;
}

/// <a, b> in double.
inline double dot(const Floats &a, const Floats &b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i)
    s += double(a[i]) * double(b[i]);
  return s;
}

inline std::string dimsToString(const Dims &dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i)
    s += (i ? "," : "") + std::to_string(dims[i]);
  return s + "]";
}

//===----------------------------------------------------------------------===//
// Kernel wrappers (assemble the ABI parameter blocks)
//===----------------------------------------------------------------------===//

inline void gemm(const float *a, const float *b, const float *c, float *y,
                 int64_t m, int64_t n, int64_t k, bool transA, bool transB,
                 bool hasC, int64_t cStrideM, int64_t cStrideN, double alpha,
                 double beta) {
  void *bufs[] = {const_cast<float *>(a), const_cast<float *>(b),
                  const_cast<float *>(c), y};
  int64_t ints[] = {m, n, k, transA, transB, hasC, cStrideM, cStrideN};
  double reals[] = {alpha, beta};
  pipec_k_gemm(kctx(), bufs, ints, reals);
}

/// `lda` / `ldb`: the strides between the stored matrices' rows (0:
/// dense).
inline void batchMatmul(const float *a, const float *b, float *y,
                        const Dims &batch, const Dims &aBatchStrides,
                        const Dims &bBatchStrides, int64_t m, int64_t n,
                        int64_t k, bool transA, bool transB, double alpha,
                        int64_t lda = 0, int64_t ldb = 0) {
  void *bufs[] = {const_cast<float *>(a), const_cast<float *>(b), y};
  Dims ints = {int64_t(batch.size())};
  ints.insert(ints.end(), batch.begin(), batch.end());
  ints.insert(ints.end(), aBatchStrides.begin(), aBatchStrides.end());
  ints.insert(ints.end(), bBatchStrides.begin(), bBatchStrides.end());
  ints.insert(ints.end(), {m, n, k, transA, transB, lda, ldb});
  double reals[] = {alpha};
  pipec_k_batch_matmul(kctx(), bufs, ints.data(), reals);
}

inline void binary(int64_t opcode, const float *a, const float *b, float *y,
                   const Dims &dims, const Dims &aStrides,
                   const Dims &bStrides) {
  void *bufs[] = {const_cast<float *>(a), const_cast<float *>(b), y};
  Dims ints = {opcode, int64_t(dims.size())};
  ints.insert(ints.end(), dims.begin(), dims.end());
  ints.insert(ints.end(), aStrides.begin(), aStrides.end());
  ints.insert(ints.end(), bStrides.begin(), bStrides.end());
  pipec_k_binary(kctx(), bufs, ints.data(), nullptr);
}

inline void unary(int64_t opcode, const float *x, float *y, int64_t n,
                  double alpha = 1.0) {
  void *bufs[] = {const_cast<float *>(x), y};
  int64_t ints[] = {opcode, n};
  double reals[] = {alpha};
  pipec_k_unary(kctx(), bufs, ints, reals);
}

inline void unaryGrad(int64_t opcode, const float *t, const float *dy,
                      float *dx, int64_t n, double alpha = 1.0) {
  void *bufs[] = {const_cast<float *>(t), const_cast<float *>(dy), dx};
  int64_t ints[] = {opcode, n};
  double reals[] = {alpha};
  pipec_k_unary_grad(kctx(), bufs, ints, reals);
}

inline void softmax(const float *x, float *y, int64_t outer, int64_t dim,
                    int64_t inner, bool isLog) {
  void *bufs[] = {const_cast<float *>(x), y};
  int64_t ints[] = {outer, dim, inner, isLog};
  pipec_k_softmax(kctx(), bufs, ints, nullptr);
}

inline void softmaxGrad(const float *y, const float *dy, float *dx,
                        int64_t outer, int64_t dim, int64_t inner, bool isLog) {
  void *bufs[] = {const_cast<float *>(y), const_cast<float *>(dy), dx};
  int64_t ints[] = {outer, dim, inner, isLog};
  pipec_k_softmax_grad(kctx(), bufs, ints, nullptr);
}

inline void reduceSum(const float *x, float *y, const Dims &xDims,
                      const Dims &yStrides, double scale) {
  void *bufs[] = {const_cast<float *>(x), y};
  Dims ints = {int64_t(xDims.size())};
  ints.insert(ints.end(), xDims.begin(), xDims.end());
  ints.insert(ints.end(), yStrides.begin(), yStrides.end());
  double reals[] = {scale};
  pipec_k_reduce_sum(kctx(), bufs, ints.data(), reals);
}

inline void transpose(const float *x, float *y, const Dims &xDims,
                      const Dims &perm) {
  void *bufs[] = {const_cast<float *>(x), y};
  Dims ints = {int64_t(xDims.size())};
  ints.insert(ints.end(), xDims.begin(), xDims.end());
  ints.insert(ints.end(), perm.begin(), perm.end());
  pipec_k_transpose(kctx(), bufs, ints.data(), nullptr);
}

/// Parameters of SoftmaxCrossEntropyLoss; reduction 0 none, 1 mean, 2 sum.
struct SceConfig {
  int64_t n, c, d;
  int64_t reduction;
  bool hasIgnore = false;
  int64_t ignoreIndex = -100;
};

inline void sceLoss(const SceConfig &cfg, const float *scores,
                    const int64_t *labels, const float *weights, float *loss,
                    float *logProb) {
  void *bufs[] = {const_cast<float *>(scores), const_cast<int64_t *>(labels),
                  const_cast<float *>(weights), loss, logProb};
  int64_t ints[] = {
      cfg.n,         cfg.c,          cfg.d, cfg.reduction, weights != nullptr,
      cfg.hasIgnore, cfg.ignoreIndex};
  pipec_k_sce_loss(kctx(), bufs, ints, nullptr);
}

inline void sceLossGrad(const SceConfig &cfg, const float *scores,
                        const int64_t *labels, const float *weights,
                        const float *dLoss, float *dScores) {
  void *bufs[] = {const_cast<float *>(scores), const_cast<int64_t *>(labels),
                  const_cast<float *>(weights), const_cast<float *>(dLoss),
                  dScores};
  int64_t ints[] = {
      cfg.n,         cfg.c,          cfg.d, cfg.reduction, weights != nullptr,
      cfg.hasIgnore, cfg.ignoreIndex};
  pipec_k_sce_loss_grad(kctx(), bufs, ints, nullptr);
}

//===----------------------------------------------------------------------===//
// Finite differences
//===----------------------------------------------------------------------===//

/// Checks an analytic gradient `grad` of the scalar function `loss` at `x`
/// against central differences (L(x + h e_i) - L(x - h e_i)) / 2h, element
/// by element, with |grad - fd| <= atol + rtol |fd|. `loss` must evaluate L
/// in double from the kernel's float outputs. The step actually taken is
/// measured after rounding x +- eps to float. Unless `minLargest` is 0, also
/// requires the gradient to be non-trivial (some |fd| > minLargest) so that
/// a kernel writing zeros cannot pass by accident. Returns max |fd|.
template <typename LossFn>
double expectGradMatchesFiniteDifferences(Floats x, const Floats &grad,
                                          LossFn &&loss, double eps = 1e-2,
                                          double atol = 2e-3,
                                          double rtol = 2e-3,
                                          const std::string &what = "",
                                          double minLargest = 1e-3) {
  EXPECT_EQ(x.size(), grad.size()) << what;
  if (x.size() != grad.size())
    return 0;
  double largest = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const float xi = x[i];
    const float hi = float(xi + eps), lo = float(xi - eps);
    x[i] = hi;
    double lHi = loss(x);
    x[i] = lo;
    double lLo = loss(x);
    x[i] = xi;
    double fd = (lHi - lLo) / (double(hi) - double(lo));
    largest = std::max(largest, std::fabs(fd));
    EXPECT_NEAR(grad[i], fd, atol + rtol * std::fabs(fd))
        << what << " element " << i << " of " << x.size();
  }
  if (minLargest > 0) {
    EXPECT_GT(largest, minLargest) << what << ": degenerate gradient";
  }
  return largest;
}

} // namespace pipec_test

#endif // PIPEC_RUNTIME_TESTS_KERNELS_TEST_UTIL_H
