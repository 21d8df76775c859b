//===- cudnn_conv.h - Convolutions on cuDNN, when it is there ---*- C++ -*-===//
//
// Part of pipec's CUDA runtime. Used by conv.cu; never by generated code.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The three convolution passes of pipec_k_conv2d* on cuDNN 9's
/// convolution API, with conv.cu's im2col + cuBLAS as the fallback. cuDNN
/// is loaded at run time (dlopen of libcudnn.so.9), so a machine without it
/// runs every convolution on the fallback, and the runtime library does not
/// depend on it. cudnn_conv.cpp says how an algorithm is chosen.
///
//===----------------------------------------------------------------------===//

#ifndef PIPEC_RUNTIME_CUDA_CUDNN_CONV_H
#define PIPEC_RUNTIME_CUDA_CUDNN_CONV_H

#include "core/conv_shape.h"
#include "cuda_rt.h"

#include <cstdint>

namespace pipec {
namespace cuda {

using rt::ConvShape;

enum class ConvPass { Forward, GradInput, GradWeight };

/// Runs one pass on `ctx`'s stream, in its arithmetic, and overwrites
/// `out`:
///   Forward:    a = X,  b = W, out = Y (without the bias);
///   GradInput:  a = dY, b = W, out = dX;
///   GradWeight: a = dY, b = X, out = dW;
/// `s` is the conv2d parameter block (include/pipec_rt.h). Returns false,
/// having written nothing, when cuDNN is not loaded or turned off
/// (PIPEC_CUDNN=0), cannot start on this GPU, cannot express the
/// convolution (asymmetric padding, empty or beyond-32-bit dimensions) or
/// has no deterministic algorithm for it in the context's arithmetic: the
/// caller then runs the fallback.
/// Throws RtError when a chosen algorithm fails.
bool cudnnConvolution(Context &ctx, ConvPass pass, const ConvShape &s,
                      const float *a, const float *b, float *out);

/// Turns the cuDNN path on or off for this process (the GPU tests run the
/// convolutions both ways); returns the previous setting.
bool setCudnnEnabled(bool enabled);

/// How many convolution passes cuDNN ran in this process.
int64_t cudnnCallsRun();
/// Of those, the ones on bfloat16 tensors (PIPEC_CUDNN_BF16=1).
int64_t cudnnBf16CallsRun();

/// The loaded cuDNN's version (e.g. 91900), or 0 when none is loaded.
int cudnnVersionLoaded();

/// Releases the cuDNN handle and forgets the chosen algorithms (the CUDA
/// context is going away).
void releaseCudnn();

} // namespace cuda
} // namespace pipec

#endif // PIPEC_RUNTIME_CUDA_CUDNN_CONV_H
