//===- kernels_nn_test_util.h - Wrappers for the CNN/transformer kernels --===//
//
// Part of pipec. Test-only helpers shared by the kernel tests of the
// convolution, pooling, normalisation, gather and data-movement kernels.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Thin wrappers that assemble each kernel's `ints` / `reals` arrays exactly
/// as documented in pipec_rt.h (the ABI under test), plus the parameter
/// structs the tests draw at random.
///
//===----------------------------------------------------------------------===//

#ifndef PIPEC_RUNTIME_TESTS_KERNELS_NN_TEST_UTIL_H
#define PIPEC_RUNTIME_TESTS_KERNELS_NN_TEST_UTIL_H

#include "kernels_test_util.h"

#include <sstream>

namespace pipec_test {

using Int64s = std::vector<int64_t>;

//===----------------------------------------------------------------------===//
// Elementwise
//===----------------------------------------------------------------------===//

/// pipec_k_unary with both reals (alpha, beta).
inline void unary2(int64_t opcode, const float *x, float *y, int64_t n,
                   double alpha, double beta) {
  void *bufs[] = {const_cast<float *>(x), y};
  int64_t ints[] = {opcode, n};
  double reals[] = {alpha, beta};
  pipec_k_unary(kctx(), bufs, ints, reals);
}

/// pipec_k_unary_grad with both reals (alpha, beta).
inline void unaryGrad2(int64_t opcode, const float *t, const float *dy,
                       float *dx, int64_t n, double alpha, double beta) {
  void *bufs[] = {const_cast<float *>(t), const_cast<float *>(dy), dx};
  int64_t ints[] = {opcode, n};
  double reals[] = {alpha, beta};
  pipec_k_unary_grad(kctx(), bufs, ints, reals);
}

inline void binaryGrad(int64_t opcode, const float *a, const float *b,
                       const float *dy, float *da, float *db, const Dims &dims,
                       const Dims &aStrides, const Dims &bStrides) {
  void *bufs[] = {const_cast<float *>(a), const_cast<float *>(b),
                  const_cast<float *>(dy), da, db};
  Dims ints = {opcode, int64_t(dims.size())};
  ints.insert(ints.end(), dims.begin(), dims.end());
  ints.insert(ints.end(), aStrides.begin(), aStrides.end());
  ints.insert(ints.end(), bStrides.begin(), bStrides.end());
  pipec_k_binary_grad(kctx(), bufs, ints.data(), nullptr);
}

//===----------------------------------------------------------------------===//
// Data movement
//===----------------------------------------------------------------------===//

inline void broadcast(const float *x, float *y, const Dims &yDims,
                      const Dims &xStrides) {
  void *bufs[] = {const_cast<float *>(x), y};
  Dims ints = {int64_t(yDims.size())};
  ints.insert(ints.end(), yDims.begin(), yDims.end());
  ints.insert(ints.end(), xStrides.begin(), xStrides.end());
  pipec_k_broadcast(kctx(), bufs, ints.data(), nullptr);
}

inline void stridedCopy(const float *src, float *dst, const Dims &dims,
                        const Dims &srcStrides, int64_t srcOffset,
                        const Dims &dstStrides, int64_t dstOffset,
                        bool accumulate) {
  void *bufs[] = {const_cast<float *>(src), dst};
  Dims ints = {int64_t(dims.size())};
  ints.insert(ints.end(), dims.begin(), dims.end());
  ints.insert(ints.end(), srcStrides.begin(), srcStrides.end());
  ints.push_back(srcOffset);
  ints.insert(ints.end(), dstStrides.begin(), dstStrides.end());
  ints.push_back(dstOffset);
  ints.push_back(accumulate);
  pipec_k_strided_copy(kctx(), bufs, ints.data(), nullptr);
}

inline void gather(const float *data, const int64_t *indices, float *y,
                   int64_t outer, int64_t axisDim, int64_t inner,
                   int64_t nIndices) {
  void *bufs[] = {const_cast<float *>(data), const_cast<int64_t *>(indices), y};
  int64_t ints[] = {outer, axisDim, inner, nIndices};
  pipec_k_gather(kctx(), bufs, ints, nullptr);
}

inline void gatherGrad(const float *dy, const int64_t *indices, float *dData,
                       int64_t outer, int64_t axisDim, int64_t inner,
                       int64_t nIndices) {
  void *bufs[] = {const_cast<float *>(dy), const_cast<int64_t *>(indices),
                  dData};
  int64_t ints[] = {outer, axisDim, inner, nIndices};
  pipec_k_gather_grad(kctx(), bufs, ints, nullptr);
}

//===----------------------------------------------------------------------===//
// Convolution
//===----------------------------------------------------------------------===//

/// The parameters of pipec_k_conv2d; oH / oW follow ONNX's floor formula
/// from the four pads.
struct ConvParams {
  int64_t n = 1, c = 1, h = 1, w = 1, m = 1, kh = 1, kw = 1;
  int64_t sh = 1, sw = 1, pt = 0, pl = 0, pb = 0, pr = 0, dh = 1, dw = 1;
  int64_t groups = 1;
  bool hasBias = false;

  int64_t oh() const { return (h + pt + pb - (dh * (kh - 1) + 1)) / sh + 1; }
  int64_t ow() const { return (w + pl + pr - (dw * (kw - 1) + 1)) / sw + 1; }
  int64_t xCount() const { return n * c * h * w; }
  int64_t wCount() const { return m * (c / groups) * kh * kw; }
  int64_t yCount() const { return n * m * oh() * ow(); }
  Int64s ints() const {
    return {n,  c,  h,  w,  m,  kh, kw,     oh(),   ow(),
            sh, sw, pt, pl, dh, dw, groups, hasBias};
  }
  std::string str() const {
    std::ostringstream os;
    os << "N=" << n << " C=" << c << " H=" << h << " W=" << w << " M=" << m
       << " k=" << kh << "x" << kw << " s=" << sh << "," << sw << " pads=" << pt
       << "," << pl << "," << pb << "," << pr << " d=" << dh << "," << dw
       << " g=" << groups << " bias=" << hasBias;
    return os.str();
  }
};

inline void conv2d(const ConvParams &p, const float *x, const float *w,
                   const float *b, float *y) {
  void *bufs[] = {const_cast<float *>(x), const_cast<float *>(w),
                  const_cast<float *>(b), y};
  Int64s ints = p.ints();
  pipec_k_conv2d(kctx(), bufs, ints.data(), nullptr);
}

inline void conv2dGradInput(const ConvParams &p, const float *dy,
                            const float *w, float *dx) {
  void *bufs[] = {const_cast<float *>(dy), const_cast<float *>(w), dx};
  Int64s ints = p.ints();
  pipec_k_conv2d_grad_input(kctx(), bufs, ints.data(), nullptr);
}

inline void conv2dGradWeight(const ConvParams &p, const float *dy,
                             const float *x, float *dw) {
  void *bufs[] = {const_cast<float *>(dy), const_cast<float *>(x), dw};
  Int64s ints = p.ints();
  pipec_k_conv2d_grad_weight(kctx(), bufs, ints.data(), nullptr);
}

//===----------------------------------------------------------------------===//
// Pooling
//===----------------------------------------------------------------------===//

/// The parameters of the pooling kernels; oH / oW follow ONNX's floor
/// formula from the four pads. Average pooling has no dilation.
struct PoolParams {
  int64_t n = 1, c = 1, h = 1, w = 1, kh = 1, kw = 1;
  int64_t sh = 1, sw = 1, pt = 0, pl = 0, pb = 0, pr = 0, dh = 1, dw = 1;
  bool countIncludePad = false;

  int64_t oh() const { return (h + pt + pb - (dh * (kh - 1) + 1)) / sh + 1; }
  int64_t ow() const { return (w + pl + pr - (dw * (kw - 1) + 1)) / sw + 1; }
  int64_t xCount() const { return n * c * h * w; }
  int64_t yCount() const { return n * c * oh() * ow(); }
  Int64s maxInts() const {
    return {n, c, h, w, kh, kw, oh(), ow(), sh, sw, pt, pl, dh, dw};
  }
  Int64s avgInts() const {
    return {n, c, h, w, kh, kw, oh(), ow(), sh, sw, pt, pl, countIncludePad};
  }
  std::string str() const {
    std::ostringstream os;
    os << "N=" << n << " C=" << c << " H=" << h << " W=" << w << " k=" << kh
       << "x" << kw << " s=" << sh << "," << sw << " pads=" << pt << "," << pl
       << "," << pb << "," << pr << " d=" << dh << "," << dw
       << " countIncludePad=" << countIncludePad;
    return os.str();
  }
};

inline void maxpool2d(const PoolParams &p, const float *x, float *y,
                      int64_t *indices) {
  void *bufs[] = {const_cast<float *>(x), y, indices};
  Int64s ints = p.maxInts();
  pipec_k_maxpool2d(kctx(), bufs, ints.data(), nullptr);
}

inline void maxpool2dGrad(const float *dy, const int64_t *indices, float *dx,
                          int64_t nX, int64_t nY) {
  void *bufs[] = {const_cast<float *>(dy), const_cast<int64_t *>(indices), dx};
  int64_t ints[] = {nX, nY};
  pipec_k_maxpool2d_grad(kctx(), bufs, ints, nullptr);
}

inline void avgpool2d(const PoolParams &p, const float *x, float *y) {
  void *bufs[] = {const_cast<float *>(x), y};
  Int64s ints = p.avgInts();
  pipec_k_avgpool2d(kctx(), bufs, ints.data(), nullptr);
}

inline void avgpool2dGrad(const PoolParams &p, const float *dy, float *dx) {
  void *bufs[] = {const_cast<float *>(dy), dx};
  Int64s ints = p.avgInts();
  pipec_k_avgpool2d_grad(kctx(), bufs, ints.data(), nullptr);
}

//===----------------------------------------------------------------------===//
// Normalisation
//===----------------------------------------------------------------------===//

/// Outputs of pipec_k_batchnorm_train.
struct BatchNormOut {
  Floats y, savedMean, savedInvStd, runMean, runVar;
};

inline BatchNormOut batchnormTrain(const Floats &x, const Floats &scale,
                                   const Floats &bias, const Floats &runMean,
                                   const Floats &runVar, int64_t n, int64_t c,
                                   int64_t s, double eps, double momentum) {
  BatchNormOut out;
  out.y.assign(x.size(), std::nanf(""));
  out.savedMean.assign(size_t(c), std::nanf(""));
  out.savedInvStd.assign(size_t(c), std::nanf(""));
  out.runMean.assign(size_t(c), std::nanf(""));
  out.runVar.assign(size_t(c), std::nanf(""));
  void *bufs[] = {const_cast<float *>(x.data()),
                  const_cast<float *>(scale.data()),
                  const_cast<float *>(bias.data()),
                  const_cast<float *>(runMean.data()),
                  const_cast<float *>(runVar.data()),
                  out.y.data(),
                  out.savedMean.data(),
                  out.savedInvStd.data(),
                  out.runMean.data(),
                  out.runVar.data()};
  int64_t ints[] = {n, c, s};
  double reals[] = {eps, momentum};
  pipec_k_batchnorm_train(kctx(), bufs, ints, reals);
  return out;
}

inline void batchnormGrad(const Floats &x, const Floats &scale,
                          const Floats &savedMean, const Floats &savedInvStd,
                          const Floats &dy, float *dx, float *dScale,
                          float *dBias, int64_t n, int64_t c, int64_t s) {
  void *bufs[] = {const_cast<float *>(x.data()),
                  const_cast<float *>(scale.data()),
                  const_cast<float *>(savedMean.data()),
                  const_cast<float *>(savedInvStd.data()),
                  const_cast<float *>(dy.data()),
                  dx,
                  dScale,
                  dBias};
  int64_t ints[] = {n, c, s};
  pipec_k_batchnorm_grad(kctx(), bufs, ints, nullptr);
}

inline void layernorm(const float *x, const float *scale, const float *bias,
                      float *y, float *mean, float *invStd, int64_t outer,
                      int64_t inner, double eps) {
  void *bufs[] = {const_cast<float *>(x),
                  const_cast<float *>(scale),
                  const_cast<float *>(bias),
                  y,
                  mean,
                  invStd};
  int64_t ints[] = {outer, inner};
  double reals[] = {eps};
  pipec_k_layernorm(kctx(), bufs, ints, reals);
}

inline void layernormGrad(const float *x, const float *scale, const float *mean,
                          const float *invStd, const float *dy, float *dx,
                          float *dScale, float *dBias, int64_t outer,
                          int64_t inner) {
  void *bufs[] = {const_cast<float *>(x),
                  const_cast<float *>(scale),
                  const_cast<float *>(mean),
                  const_cast<float *>(invStd),
                  const_cast<float *>(dy),
                  dx,
                  dScale,
                  dBias};
  int64_t ints[] = {outer, inner};
  pipec_k_layernorm_grad(kctx(), bufs, ints, nullptr);
}

} // namespace pipec_test

#endif // PIPEC_RUNTIME_TESTS_KERNELS_NN_TEST_UTIL_H
