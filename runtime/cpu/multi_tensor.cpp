//===- multi_tensor.cpp - Kernels run on many tensors at once -------------===//
//
// Part of pipec's CPU runtime. pipec_k_NAME_multi for each line of
// include/pipec_multi_tensor.def (include/pipec_rt.h, "Multi-tensor
// kernels"): the CPU runs pipec_k_NAME on each tensor in turn, so every
// result is the single kernel's, bit for bit. (On a GPU the point is one
// launch instead of K; here it saves nothing but the calls.)
//
//===----------------------------------------------------------------------===//

#include "pipec_rt.h"

#include <cstdint>

namespace {

template <int Bufs, int Ints>
void eachTensor(pipec_kernel_fn single, pipec_kctx *kc, void *const *bufs,
                const int64_t *ints, const double *reals) {
  const int64_t tensors = ints[0];
  for (int64_t t = 0; t < tensors; ++t)
    single(kc, bufs + t * Bufs, ints + 1 + t * Ints, reals);
}

} // namespace

#define PIPEC_MULTI_TENSOR(name, bufs, ints, firstOutput, shared)              \
  extern "C" void pipec_k_##name##_multi(pipec_kctx *kc, void *const *b,       \
                                         const int64_t *i, const double *r) {  \
    eachTensor<bufs, ints>(&pipec_k_##name, kc, b, i, r);                      \
  }                                                                            \
  extern "C" void pipec_k_##name##_multi_f64(                                  \
      pipec_kctx *kc, void *const *b, const int64_t *i, const double *r) {     \
    eachTensor<bufs, ints>(&pipec_k_##name##_f64, kc, b, i, r);                \
  }
#include "pipec_multi_tensor.def"
