//===- conv_shape.h - The conv2d parameter block ----------------*- C++ -*-===//
//
// Part of pipec's runtime: the `ints` of pipec_k_conv2d and its gradients
// (include/pipec_rt.h), read by the CPU kernels (cpu/conv.cpp) and the CUDA
// ones (cuda/conv.cu, im2col + cuBLAS; cuda/cudnn_conv.cpp, cuDNN).
//
//===----------------------------------------------------------------------===//

#ifndef PIPEC_RUNTIME_CORE_CONV_SHAPE_H
#define PIPEC_RUNTIME_CORE_CONV_SHAPE_H

#include <climits>
#include <cstdint>

namespace pipec {
namespace rt {

/// The parameter block shared by the three kernels, with derived sizes.
struct ConvShape {
  int64_t n, c, h, w, m, kh, kw, oh, ow, sh, sw, pt, pl, dh, dw, groups;
  bool hasBias;
  int64_t cg = 0, mg = 0; ///< Channels per group (input, output).
  int64_t k = 0;          ///< Patch length Cg * kH * kW.
  int64_t p = 0;          ///< Output pixels oH * oW.

  explicit ConvShape(const int64_t *ints)
      : n(ints[0]), c(ints[1]), h(ints[2]), w(ints[3]), m(ints[4]), kh(ints[5]),
        kw(ints[6]), oh(ints[7]), ow(ints[8]), sh(ints[9]), sw(ints[10]),
        pt(ints[11]), pl(ints[12]), dh(ints[13]), dw(ints[14]),
        groups(ints[15]), hasBias(ints[16] != 0) {
    if (groups > 0) {
      cg = c / groups;
      mg = m / groups;
    }
    k = cg * kh * kw;
    p = oh * ow;
  }

  /// Every size fits the BLAS and cuDNN int parameters.
  bool valid() const {
    if (n < 0 || c < 0 || h < 0 || w < 0 || m < 0 || oh < 0 || ow < 0)
      return false;
    if (groups <= 0 || c % groups != 0 || m % groups != 0)
      return false;
    if (kh <= 0 || kw <= 0 || sh <= 0 || sw <= 0 || dh <= 0 || dw <= 0)
      return false;
    const int64_t limit = INT_MAX;
    return mg <= limit && k <= limit && p <= limit && h * w <= limit &&
           groups <= limit;
  }

  /// 1x1, stride 1, unpadded: col(X) == X.
  bool pointwise() const {
    return kh == 1 && kw == 1 && sh == 1 && sw == 1 && pt == 0 && pl == 0 &&
           oh == h && ow == w;
  }

  int64_t xCount() const { return n * c * h * w; }
  int64_t yCount() const { return n * m * p; }
  int64_t wCount() const { return m * k; }
  /// Rows of a chunk's col: C * kH * kW (groups * K).
  int64_t colRows() const { return c * kh * kw; }
};

} // namespace rt
} // namespace pipec

#endif // PIPEC_RUNTIME_CORE_CONV_SHAPE_H
