//===- optimizer.cpp - ONNX training operators Momentum, Adam, Adagrad ----===//
//
// The update formulas of ai.onnx.preview.training (opset 1), one tensor at
// a time, computed in float with the scalar coefficients in double as
// ONNX's reference implementation does. T is the number of updates already
// made (0 on the first). Outputs may alias their inputs (elementwise).
//
//===----------------------------------------------------------------------===//
#include "pipec_rt.h"

#include <cmath>

namespace {
float scalarF(const void *p) { return *static_cast<const float *>(p); }
int64_t scalarI(const void *p) { return *static_cast<const int64_t *>(p); }
} // namespace

extern "C" void pipec_k_momentum(void *const *bufs, const int64_t *ints,
                                 const double *reals) {
  const float r = scalarF(bufs[0]);
  const int64_t t = scalarI(bufs[1]);
  const float *x = static_cast<const float *>(bufs[2]);
  const float *g = static_cast<const float *>(bufs[3]);
  const float *v = static_cast<const float *>(bufs[4]);
  float *xNew = static_cast<float *>(bufs[5]);
  float *vNew = static_cast<float *>(bufs[6]);
  const int64_t n = ints[0];
  const bool nesterov = ints[1] != 0;
  const float alpha = float(reals[0]);
  // beta' = T > 0 ? beta : 1 (the first update takes the whole gradient).
  const float beta = t > 0 ? float(reals[1]) : 1.0f;
  const float norm = float(reals[2]);
  for (int64_t i = 0; i < n; ++i) {
    float gReg = norm * x[i] + g[i];     // G' = norm_coefficient X + G
    float vi = alpha * v[i] + beta * gReg; // V_new = alpha V + beta' G'
    float xi = nesterov ? x[i] - r * (gReg + alpha * vi) : x[i] - r * vi;
    vNew[i] = vi;
    xNew[i] = xi;
  }
}

extern "C" void pipec_k_adam(void *const *bufs, const int64_t *ints,
                             const double *reals) {
  const float r = scalarF(bufs[0]);
  const int64_t t = scalarI(bufs[1]);
  const float *x = static_cast<const float *>(bufs[2]);
  const float *g = static_cast<const float *>(bufs[3]);
  const float *v = static_cast<const float *>(bufs[4]);
  const float *h = static_cast<const float *>(bufs[5]);
  float *xNew = static_cast<float *>(bufs[6]);
  float *vNew = static_cast<float *>(bufs[7]);
  float *hNew = static_cast<float *>(bufs[8]);
  const int64_t n = ints[0];
  const double alpha = reals[0], beta = reals[1];
  const float norm = float(reals[2]), normPost = float(reals[3]);
  const float eps = float(reals[4]);
  // R' = T > 0 ? R sqrt(1 - beta^T) / (1 - alpha^T) : R.
  const float rAdj =
      t > 0 ? float(r * std::sqrt(1 - std::pow(beta, double(t))) /
                    (1 - std::pow(alpha, double(t))))
            : r;
  const float a = float(alpha), b = float(beta);
  for (int64_t i = 0; i < n; ++i) {
    float gReg = norm * x[i] + g[i];
    float vi = a * v[i] + (1 - a) * gReg;
    float hi = b * h[i] + (1 - b) * gReg * gReg;
    float xi = x[i] - rAdj * vi / (std::sqrt(hi) + eps);
    vNew[i] = vi;
    hNew[i] = hi;
    xNew[i] = (1 - normPost) * xi;
  }
}

extern "C" void pipec_k_adagrad(void *const *bufs, const int64_t *ints,
                                const double *reals) {
  const float r = scalarF(bufs[0]);
  const int64_t t = scalarI(bufs[1]);
  const float *x = static_cast<const float *>(bufs[2]);
  const float *g = static_cast<const float *>(bufs[3]);
  const float *h = static_cast<const float *>(bufs[4]);
  float *xNew = static_cast<float *>(bufs[5]);
  float *hNew = static_cast<float *>(bufs[6]);
  const int64_t n = ints[0];
  const float decay = float(reals[0]), eps = float(reals[1]);
  const float norm = float(reals[2]);
  const float rt = r / (1 + float(t) * decay); // r = R / (1 + T decay_factor)
  for (int64_t i = 0; i < n; ++i) {
    float gReg = norm * x[i] + g[i];
    float hi = h[i] + gReg * gReg;
    xNew[i] = x[i] - rt * gReg / (std::sqrt(hi) + eps);
    hNew[i] = hi;
  }
}
