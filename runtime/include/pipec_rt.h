/*===- pipec_rt.h - C ABI between generated stage code and libpipec_rt ----===*
 *
 * This header is the only contract between the compiler and the runtime.
 * Generated code (one object per pipeline stage) calls two kinds of entry
 * points:
 *
 *  1. Kernels, all with the uniform signature `pipec_kernel_fn`:
 *       void k(pipec_kctx *kc, void *const *bufs, const int64_t *ints,
 *              const double *reals);
 *     `kc` is the stage's kernel context (below), `bufs` are tensor
 *     pointers (float32 unless noted), `ints` and `reals` the static
 *     parameters the compiler computed. The layout of each kernel's arrays
 *     is documented below and is part of the ABI. Output buffers may alias
 *     an input only where the kernel says so.
 *
 *  2. Program services (communication, data feed, loss, optimizer
 *     hyper-parameters, profiling), taking the opaque `pipec_ctx`.
 *
 * The stage executable's `main` is generated; it calls `pipec_rt_main` with
 * the stage description (a JSON string, see runtime/README.md) and the
 * generated per-step program.
 *
 * No MLIR or LLVM header may be included here or anywhere in runtime/.
 *===----------------------------------------------------------------------===*/
#ifndef PIPEC_RT_H
#define PIPEC_RT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/// Version of this ABI. Bumped on any incompatible change; generated code
/// records the version it was built against and the runtime refuses others.
/// Version 3: kernels take the stage's kernel context as first argument.
#define PIPEC_RT_ABI_VERSION 3

/// The context a stage's kernels run in, owned by the stage's device and
/// valid for the whole run: on the CPU the matrix products' arithmetic
/// (`--precision bf16` rounds their operands) and the kernels' reusable
/// working memory; on CUDA the stream every kernel is queued on, the
/// cuBLAS handle, the arithmetic (TF32, bf16) and the device scratch.
/// Generated code asks the runtime for it once per stage function call
/// (pipec_rt_kernel_context) and passes it to every kernel; in-process
/// callers (profiling executors, tests) make a CPU one with
/// pipec_rt_cpu_kernel_context_new. A kernel never keeps it past its
/// return, and reports a context of another device kind as an error, as it
/// does any other bad parameter.
typedef struct pipec_kctx pipec_kctx;

typedef void (*pipec_kernel_fn)(pipec_kctx *kc, void *const *bufs,
                                const int64_t *ints, const double *reals);

/*===----------------------------------------------------------------------===*
 * Kernels (runtime/cpu). All tensors are dense, row-major, float32 unless
 * stated. "n" is an element count.
 *===----------------------------------------------------------------------===*/

/// Y = alpha * op(A) * op(B) + beta * C.
/// bufs: [A, B, C (may be NULL when hasC == 0), Y]
/// ints: [M, N, K, transA, transB, hasC, cStrideM, cStrideN]
///   op(A) is MxK, op(B) is KxN, Y is MxN. C is read as C[i*cStrideM +
///   j*cStrideN] (strides are 0 along broadcast dimensions).
/// reals: [alpha, beta]
void pipec_k_gemm(pipec_kctx *kc, void *const *bufs, const int64_t *ints,
                  const double *reals);

/// Batched matmul with broadcasting of the batch dimensions:
/// Y[b] = alpha * op(A[b]) * op(B[b]).
/// bufs: [A, B, Y]
/// ints: [nb, batchDims[nb], aBatchStrides[nb], bBatchStrides[nb], M, N, K,
///        transA, transB, lda, ldb]
///   Batch strides are in elements (0 where that operand is broadcast). Y is
///   contiguous [batchDims..., M, N]. lda / ldb: the stride in elements
///   between the rows of A's and B's stored row-major matrices (MxK, or KxM
///   when transposed; the elements of a row are contiguous); 0 means dense
///   (K or M for A, N or K for B). An operand read through a permutation
///   (nn.matmul's perm_a / perm_b) has other strides.
/// reals: [alpha]
void pipec_k_batch_matmul(pipec_kctx *kc, void *const *bufs,
                          const int64_t *ints, const double *reals);

/// Elementwise binary op with numpy broadcasting, made explicit by strides.
/// bufs: [A, B, Y]; Y may alias A or B when that operand is not broadcast.
/// ints: [opcode, rank, dims[rank], aStrides[rank], bStrides[rank]]
///   dims are Y's dims; strides are in elements, 0 along broadcast dims.
///   rank may be 0 (scalars).
/// opcode: PIPEC_BIN_*.
void pipec_k_binary(pipec_kctx *kc, void *const *bufs, const int64_t *ints,
                    const double *reals);
enum {
  PIPEC_BIN_ADD = 0,
  PIPEC_BIN_SUB = 1,
  PIPEC_BIN_MUL = 2,
  PIPEC_BIN_DIV = 3,
  PIPEC_BIN_POW = 4, ///< A^B (ONNX Pow)
  PIPEC_BIN_MAX = 5,
  PIPEC_BIN_MIN = 6,
};

/// Elementwise comparison with numpy broadcasting (ONNX Equal, Less, ...).
/// bufs: [A, B, Y]; A and B are float32 or int64 (both the same), Y is int64
/// 0/1 (booleans are int64 throughout pipec).
/// ints: [predicate, rank, dims[rank], aStrides[rank], bStrides[rank], isInt]
/// predicate: PIPEC_CMP_*. NaN compares false except for NE.
void pipec_k_compare(pipec_kctx *kc, void *const *bufs, const int64_t *ints,
                     const double *reals);
enum {
  PIPEC_CMP_EQ = 0,
  PIPEC_CMP_NE = 1,
  PIPEC_CMP_LT = 2,
  PIPEC_CMP_GT = 3,
  PIPEC_CMP_LE = 4,
  PIPEC_CMP_GE = 5,
};

/// Elementwise selection Y = C != 0 ? X : Y' with numpy broadcasting (ONNX
/// Where). bufs: [C (int64), X, Y', Y]; X, Y' and Y are float32, or int64
/// when isInt. ints: [isInt, rank, dims[rank], cStrides[rank],
/// xStrides[rank], yStrides[rank]].
void pipec_k_where(pipec_kctx *kc, void *const *bufs, const int64_t *ints,
                   const double *reals);

/// Element type conversion. bufs: [X, Y]. ints: [direction, n].
/// I64_TO_F32 rounds to nearest; F32_TO_I64 truncates toward zero, NaN and
/// values outside int64 give INT64_MIN.
void pipec_k_cast(pipec_kctx *kc, void *const *bufs, const int64_t *ints,
                  const double *reals);
enum {
  PIPEC_CAST_I64_TO_F32 = 0,
  PIPEC_CAST_F32_TO_I64 = 1,
  /* float32 to bfloat16 (uint16 storage): nearest, ties to even; a NaN
   * stays a quiet NaN (the CPU keeps its sign and payload, CUDA writes
   * 0x7FFF). `--activations bf16` only. */
  PIPEC_CAST_F32_TO_BF16 = 2,
  /* bfloat16 to float32: exact. */
  PIPEC_CAST_BF16_TO_F32 = 3,
};

/// Elementwise unary op. bufs: [X, Y] (Y may alias X). ints: [opcode, n].
/// reals: [alpha, beta] (SCALE: Y = alpha X; LEAKY_RELU: slope alpha;
/// CLIP: min alpha, max beta; POW_SCALAR: X^alpha; others ignore them).
void pipec_k_unary(pipec_kctx *kc, void *const *bufs, const int64_t *ints,
                   const double *reals);
enum {
  PIPEC_UN_COPY = 0,
  PIPEC_UN_RELU = 1,
  PIPEC_UN_TANH = 2,
  PIPEC_UN_SIGMOID = 3,
  PIPEC_UN_NEG = 4,
  PIPEC_UN_SCALE = 5,
  PIPEC_UN_EXP = 6,
  PIPEC_UN_ERF = 7,
  PIPEC_UN_GELU = 8,      ///< x/2 (1 + erf(x / sqrt 2))
  PIPEC_UN_GELU_TANH = 9, ///< the tanh approximation
  PIPEC_UN_SQRT = 10,
  PIPEC_UN_LOG = 11,
  PIPEC_UN_LEAKY_RELU = 12,
  PIPEC_UN_CLIP = 13,
  PIPEC_UN_POW_SCALAR = 14,
  PIPEC_UN_ABS = 15,
  PIPEC_UN_RECIPROCAL = 16,
};

/// Backward of a unary op: dX = dY * f'(.)
/// bufs: [T, dY, dX] where T is the forward output Y for TANH, SIGMOID, EXP,
///   SQRT and RECIPROCAL, and the forward input X for every other opcode
///   (dX may alias dY).
/// ints: [opcode, n]. reals: as pipec_k_unary (alpha, beta).
void pipec_k_unary_grad(pipec_kctx *kc, void *const *bufs, const int64_t *ints,
                        const double *reals);

/// Softmax or log-softmax over one axis of a tensor viewed as
/// [outer, dim, inner]. bufs: [X, Y]. ints: [outer, dim, inner, isLog].
/// Numerically stable (max subtracted).
void pipec_k_softmax(pipec_kctx *kc, void *const *bufs, const int64_t *ints,
                     const double *reals);

/// Backward of softmax / log-softmax from the forward output Y.
/// bufs: [Y, dY, dX]. ints: [outer, dim, inner, isLog].
///   softmax:     dX = Y * (dY - sum_axis(dY * Y))
///   log-softmax: dX = dY - exp(Y) * sum_axis(dY)
void pipec_k_softmax_grad(pipec_kctx *kc, void *const *bufs,
                          const int64_t *ints, const double *reals);

/// Full-shape gradients of a broadcasting binary op, before the compiler's
/// sum onto each operand's shape: dA = dY * d(A op B)/dA, dB likewise, both
/// with Y's dims. bufs: [A, B, dY, dA (or NULL), dB (or NULL)].
/// ints: as pipec_k_binary. Needed for POW, MAX, MIN (ties go to A).
void pipec_k_binary_grad(pipec_kctx *kc, void *const *bufs, const int64_t *ints,
                         const double *reals);

/// Broadcast (ONNX Expand, adjoint of pipec_k_reduce_sum):
/// Y[i] = X[sum_k i_k * xStrides[k]]. bufs: [X, Y].
/// ints: [rank, yDims[rank], xStrides[rank]] (0 along broadcast dims).
void pipec_k_broadcast(pipec_kctx *kc, void *const *bufs, const int64_t *ints,
                       const double *reals);

/// Strided copy (Slice, Split, Concat pieces, Pad interiors and their
/// gradients): for every index i of `dims`,
///   dst[dstOffset + sum i_k dstStrides[k]] (+)= src[srcOffset + sum i_k srcStrides[k]]
/// bufs: [src, dst]. ints: [rank, dims[rank], srcStrides[rank], srcOffset,
/// dstStrides[rank], dstOffset, accumulate]. Strides may be negative
/// (reversed slices). Elements are float32.
void pipec_k_strided_copy(pipec_kctx *kc, void *const *bufs,
                          const int64_t *ints, const double *reals);

/// 2-D convolution (ONNX Conv, NCHW, groups, strides, pads, dilations).
/// bufs: [X, W, B (or NULL), Y]. X [N,C,H,W], W [M, C/groups, kH, kW],
/// Y [N, M, oH, oW]. ints: [N, C, H, W, M, kH, kW, oH, oW, strideH,
/// strideW, padTop, padLeft, dilationH, dilationW, groups, hasBias].
/// (Bottom/right padding is implied by oH/oW.)
void pipec_k_conv2d(pipec_kctx *kc, void *const *bufs, const int64_t *ints,
                    const double *reals);
/// dX of pipec_k_conv2d. bufs: [dY, W, dX] (dX overwritten). ints: as conv2d.
void pipec_k_conv2d_grad_input(pipec_kctx *kc, void *const *bufs,
                               const int64_t *ints, const double *reals);
/// dW of pipec_k_conv2d. bufs: [dY, X, dW] (dW overwritten). ints: as conv2d.
void pipec_k_conv2d_grad_weight(pipec_kctx *kc, void *const *bufs,
                                const int64_t *ints, const double *reals);

/// 2-D max pooling; padding never wins. bufs: [X, Y, Indices (int64 flat
/// index into X per output element, or NULL)]. ints: [N, C, H, W, kH, kW,
/// oH, oW, strideH, strideW, padTop, padLeft, dilationH, dilationW].
void pipec_k_maxpool2d(pipec_kctx *kc, void *const *bufs, const int64_t *ints,
                       const double *reals);
/// dX of max pooling from the saved indices. bufs: [dY, Indices, dX]
/// (dX overwritten). ints: [nX (elements of X), nY (elements of Y)].
void pipec_k_maxpool2d_grad(pipec_kctx *kc, void *const *bufs,
                            const int64_t *ints, const double *reals);
/// 2-D average pooling. bufs: [X, Y]. ints: [N, C, H, W, kH, kW, oH, oW,
/// strideH, strideW, padTop, padLeft, countIncludePad].
void pipec_k_avgpool2d(pipec_kctx *kc, void *const *bufs, const int64_t *ints,
                       const double *reals);
/// dX of average pooling. bufs: [dY, dX] (dX overwritten). ints: as avgpool2d.
void pipec_k_avgpool2d_grad(pipec_kctx *kc, void *const *bufs,
                            const int64_t *ints, const double *reals);

/// Coordinate transformations of pipec_k_resize_linear (ONNX Resize's
/// coordinate_transformation_mode).
enum {
  PIPEC_RESIZE_HALF_PIXEL = 0,
  PIPEC_RESIZE_PYTORCH_HALF_PIXEL = 1,
  PIPEC_RESIZE_ALIGN_CORNERS = 2,
  PIPEC_RESIZE_ASYMMETRIC = 3
};
/// ONNX Resize, linear mode, over H and W of NCHW (bilinear). bufs: [X, Y].
/// ints: [N, C, H, W, oH, oW, mode (PIPEC_RESIZE_*)]. reals: [scaleH,
/// scaleW] (ONNX's scales; oH/H and oW/W when the model gives sizes).
void pipec_k_resize_linear(pipec_kctx *kc, void *const *bufs,
                           const int64_t *ints, const double *reals);
/// dX of pipec_k_resize_linear. bufs: [dY, dX] (dX overwritten). ints and
/// reals: as pipec_k_resize_linear.
void pipec_k_resize_linear_grad(pipec_kctx *kc, void *const *bufs,
                                const int64_t *ints, const double *reals);

/// BatchNormalization in training mode (ONNX opset 15): batch statistics
/// over N and the spatial dims, biased variance.
/// bufs: [X, scale, bias, runMean, runVar, Y, savedMean, savedInvStd,
///        runMeanOut, runVarOut] (runMeanOut/runVarOut may alias runMean/runVar;
///        savedMean/savedInvStd are [C]).
/// ints: [N, C, S] (S = product of spatial dims). reals: [epsilon, momentum]
///   runMeanOut = momentum runMean + (1 - momentum) mean (same for var).
void pipec_k_batchnorm_train(pipec_kctx *kc, void *const *bufs,
                             const int64_t *ints, const double *reals);
/// BatchNormalization with given statistics (inference mode).
/// bufs: [X, scale, bias, mean, var, Y]. ints: [N, C, S]. reals: [epsilon].
void pipec_k_batchnorm_infer(pipec_kctx *kc, void *const *bufs,
                             const int64_t *ints, const double *reals);
/// Gradients of training-mode batch normalization.
/// bufs: [X, scale, savedMean, savedInvStd, dY, dX, dScale, dBias].
/// ints: [N, C, S].
void pipec_k_batchnorm_grad(pipec_kctx *kc, void *const *bufs,
                            const int64_t *ints, const double *reals);

/// LayerNormalization over the trailing `inner` elements of each of `outer`
/// rows. bufs: [X, scale [inner], bias [inner] (or NULL), Y, mean [outer],
/// invStd [outer]]. ints: [outer, inner]. reals: [epsilon].
void pipec_k_layernorm(pipec_kctx *kc, void *const *bufs, const int64_t *ints,
                       const double *reals);
/// Gradients of layer normalization. bufs: [X, scale, mean, invStd, dY, dX,
/// dScale, dBias (or NULL)]. ints: [outer, inner].
void pipec_k_layernorm_grad(pipec_kctx *kc, void *const *bufs,
                            const int64_t *ints, const double *reals);

/// Gather along one axis (ONNX Gather; embedding lookup): data viewed as
/// [outer, axisDim, inner], indices (int64, negative wraps) of count
/// nIndices, Y viewed as [outer, nIndices, inner]. bufs: [data, indices, Y].
/// ints: [outer, axisDim, inner, nIndices]. Out-of-range indices give 0.
void pipec_k_gather(pipec_kctx *kc, void *const *bufs, const int64_t *ints,
                    const double *reals);
/// dData of pipec_k_gather: zero, then scatter-add dY. bufs: [dY, indices,
/// dData]. ints: as pipec_k_gather.
void pipec_k_gather_grad(pipec_kctx *kc, void *const *bufs, const int64_t *ints,
                         const double *reals);

/// Sum-reduction of X onto a broadcast-compatible shape (the adjoint of
/// broadcasting), times a scale: Y = scale * sum over reduced dims of X.
/// bufs: [X, Y]. ints: [rank, xDims[rank], yStrides[rank]] where yStrides
///   are Y's element strides for each X dimension, 0 along reduced dims.
///   Y's element count is implied; Y is overwritten (not accumulated).
/// reals: [scale]
void pipec_k_reduce_sum(pipec_kctx *kc, void *const *bufs, const int64_t *ints,
                        const double *reals);

/// General transpose. bufs: [X, Y]. ints: [rank, xDims[rank], perm[rank]]
/// (ONNX semantics: Y.dims[i] = X.dims[perm[i]]).
void pipec_k_transpose(pipec_kctx *kc, void *const *bufs, const int64_t *ints,
                       const double *reals);

/// Byte copy. bufs: [src, dst]. ints: [nbytes].
void pipec_k_copy(pipec_kctx *kc, void *const *bufs, const int64_t *ints,
                  const double *reals);

/// Fill. bufs: [Y]. ints: [n]. reals: [value].
void pipec_k_fill(pipec_kctx *kc, void *const *bufs, const int64_t *ints,
                  const double *reals);

/// ONNX SoftmaxCrossEntropyLoss (opset 13 semantics).
/// bufs: [scores, labels (int64), weights (C floats, or NULL), loss,
///        logProb (or NULL)]
///   scores: [N, C, D] viewed (D = product of the extra dims d1..dk, 1 if
///   none); labels: [N, D]; loss: scalar for mean/sum, [N, D] for none;
///   logProb: same shape as scores.
/// ints: [N, C, D, reduction, hasWeights, hasIgnoreIndex, ignoreIndex]
///   reduction: 0 none, 1 mean, 2 sum. Mean divides by the sum of the
///   weights of the non-ignored targets (by their count without weights).
void pipec_k_sce_loss(pipec_kctx *kc, void *const *bufs, const int64_t *ints,
                      const double *reals);

/// Gradient of pipec_k_sce_loss with respect to the scores.
/// bufs: [scores, labels (int64), weights (or NULL), dLoss, dScores]
///   dLoss has the shape of the forward loss output (scalar or [N, D]).
/// ints: as pipec_k_sce_loss.
void pipec_k_sce_loss_grad(pipec_kctx *kc, void *const *bufs,
                           const int64_t *ints, const double *reals);

/// Plain SGD: Wout = W - lr * G. bufs: [W, G, lr (one float), Wout];
/// Wout may alias W. ints: [n].
void pipec_k_sgd(pipec_kctx *kc, void *const *bufs, const int64_t *ints,
                 const double *reals);

/// ONNX Momentum (ai.onnx.preview.training), one tensor of n elements.
/// bufs: [R (f32 scalar), T (i64 scalar), X, G, V, Xnew, Vnew]; Xnew may
/// alias X and Vnew V. ints: [n, nesterov]. reals: [alpha, beta,
/// norm_coefficient].
void pipec_k_momentum(pipec_kctx *kc, void *const *bufs, const int64_t *ints,
                      const double *reals);

/// ONNX Adam. bufs: [R, T, X, G, V, H, Xnew, Vnew, Hnew] (outputs may alias
/// their inputs). ints: [n]. reals: [alpha, beta, norm_coefficient,
/// norm_coefficient_post, epsilon].
void pipec_k_adam(pipec_kctx *kc, void *const *bufs, const int64_t *ints,
                  const double *reals);

/// ONNX Adagrad. bufs: [R, T, X, G, H, Xnew, Hnew]. ints: [n].
/// reals: [decay_factor, epsilon, norm_coefficient].
void pipec_k_adagrad(pipec_kctx *kc, void *const *bufs, const int64_t *ints,
                     const double *reals);

/// Dropout in training mode with a mask that is a deterministic function of
/// (seed, global sample, element, salt), so it does not depend on how the
/// batch is split into microbatches or stages.
/// bufs: [X, rng (int64[2]: seed, global index of the microbatch's first
/// sample), Y, Mask]; Mask holds 0 or 1/(1-ratio) and is what the backward
/// multiplies dY with. ints: [n, sampleElems, salt]. reals: [ratio].
void pipec_k_dropout(pipec_kctx *kc, void *const *bufs, const int64_t *ints,
                     const double *reals);

/*===----------------------------------------------------------------------===*
 * Multi-tensor kernels. For each kernel NAME of pipec_multi_tensor.def
 * (fill, sgd, momentum, adam, adagrad), pipec_k_NAME_multi runs
 * pipec_k_NAME on K tensors in one call (on a GPU, one launch):
 *   ints:  [K, then tensor 0's ints of pipec_k_NAME, tensor 1's, ...]
 *   bufs:  tensor 0's bufs of pipec_k_NAME, then tensor 1's, ...
 *   reals: pipec_k_NAME's reals, one set for every tensor.
 * The buffers the .def marks shared (the learning rate, the update count)
 * are the same for every tensor of a call. Each tensor's result is
 * pipec_k_NAME's, bit for bit; tensors must not overlap. The compiler
 * groups a step function's updates into these calls.
 *===----------------------------------------------------------------------===*/
#define PIPEC_K_MULTI(name) pipec_k_##name##_multi
#define PIPEC_MULTI_TENSOR(name, bufs, ints, firstOutput, shared)              \
  void PIPEC_K_MULTI(name)(pipec_kctx * kc, void *const *bufs_,                \
                           const int64_t *ints_, const double *reals);
#include "pipec_multi_tensor.def"
#undef PIPEC_K_MULTI

/*===----------------------------------------------------------------------===*
 * Float64 twins. Every kernel above but pipec_k_copy also exists as
 * `<name>_f64` with the same parameter layout, in which every float32
 * tensor is float64 instead (int64 tensors stay int64; pipec_k_cast's
 * F32 side is then float64). `pipec compile --precision f64` links
 * against them. The list is include/pipec_kernels.def.
 *===----------------------------------------------------------------------===*/
#define PIPEC_KERNEL(sym)                                                      \
  void sym##_f64(pipec_kctx *kc, void *const *bufs, const int64_t *ints,       \
                 const double *reals);
#define PIPEC_KERNEL_BYTES(sym)
#include "pipec_kernels.def"

/*===----------------------------------------------------------------------===*
 * Bfloat16 storage. The kernels include/pipec_kernels.def lists with
 * PIPEC_KERNEL_BF16 also exist as `<name>_bf16`, which reads and writes
 * some of its tensors as bfloat16 (uint16 bit patterns; `pipec compile
 * --activations bf16`). Its ints are a prefix describing the buffers,
 * then `<name>`'s own ints:
 *   ints: [nbufs, s[nbufs], <name>'s ints...]
 *   s[i] = 0: buffer i is as `<name>` has it (float32, or int64);
 *   s[i] = n > 0: buffer i is an input of n bfloat16 values;
 *   s[i] = -n < 0: buffer i is an output of n bfloat16 values.
 * The result is, bit for bit, `<name>` run on the bfloat16 inputs widened
 * to float32 (exactly) with every bfloat16 output rounded once to the
 * nearest bfloat16 (ties to even; pipec_k_cast's PIPEC_CAST_F32_TO_BF16):
 * the kernel between casts, without the casts' float32 tensors. A
 * bfloat16 output never aliases a buffer of another element type.
 *===----------------------------------------------------------------------===*/
#define PIPEC_KERNEL(sym)
#define PIPEC_KERNEL_BF16(sym)                                                 \
  void sym##_bf16(pipec_kctx *kc, void *const *bufs, const int64_t *ints,      \
                  const double *reals);
#include "pipec_kernels.def"

/// Looks a kernel up by its symbol name ("pipec_k_gemm", "pipec_k_gemm_f64");
/// NULL if unknown. Used by in-process executors (profiling, conformance
/// tests).
pipec_kernel_fn pipec_rt_find_kernel(const char *name);

/*===----------------------------------------------------------------------===*
 * Program services (runtime/core).
 *===----------------------------------------------------------------------===*/

typedef struct pipec_ctx pipec_ctx;

/// The stage's kernel context (see pipec_kctx), the same for the whole run.
pipec_kctx *pipec_rt_kernel_context(pipec_ctx *ctx);

/// A new CPU kernel context, for callers outside a stage executable
/// (profiling, tests, the CUDA kernel checker): float32 arithmetic when
/// `like` is NULL, else the arithmetic of `like` (a context of any device;
/// a `--precision bf16` one rounds the matrix products' operands to
/// bfloat16). Freed with pipec_rt_cpu_kernel_context_free.
pipec_kctx *pipec_rt_cpu_kernel_context_new(const pipec_kctx *like);
void pipec_rt_cpu_kernel_context_free(pipec_kctx *kc);

/// One training step of this stage: the generated schedule program.
typedef void (*pipec_program_fn)(pipec_ctx *ctx, char *arena);

/// Entry point of a stage executable. `stage_meta_json` describes the stage
/// (see runtime/README.md: arena size, weights table, feeds, ops for the
/// profiler, build id). Parses argv, initialises MPI, loads the weights,
/// runs `--steps` steps of `program`, writes metrics and checkpoints.
/// Returns the process exit code.
int pipec_rt_main(int argc, char **argv, const char *stage_meta_json,
                  pipec_program_fn program);

/// Entry point of a stage executable compiled with `--target cuda` (defined
/// by libpipec_rt_cuda): pipec_rt_main with the arena in GPU memory and the
/// CUDA kernels (pipec_cuda_k_*) on the rank's GPU.
int pipec_rt_cuda_main(int argc, char **argv, const char *stage_meta_json,
                       pipec_program_fn program);

/// The device copy of a constant tensor of the generated code (`bytes`
/// bytes of host memory that live as long as the process), made once; the
/// host pointer itself where the arena is host memory.
const void *pipec_rt_constant(pipec_ctx *ctx, const void *host, int64_t bytes);

/// Copies microbatch `mb` of feed `feed` (an index into the stage
/// description's "feeds" list: model inputs or labels) into dst.
void pipec_rt_feed(pipec_ctx *ctx, int64_t feed, int64_t mb, void *dst);

/// Non-blocking send of `bytes` bytes to pipeline stage `peer` on `channel`
/// for microbatch `mb`. The data is copied; src may be reused at once.
void pipec_rt_send(pipec_ctx *ctx, int64_t peer, int64_t channel, int64_t mb,
                   const void *src, int64_t bytes);

/// Blocking receive matching pipec_rt_send(…, this stage, channel, mb, …).
/// When the same message was posted by pipec_rt_recv_post, waits for it and
/// copies it from the staging buffer.
void pipec_rt_recv(pipec_ctx *ctx, int64_t peer, int64_t channel, int64_t mb,
                   void *dst, int64_t bytes);

/// Posts the receive of a message that a later pipec_rt_recv of this step
/// takes (MPI_Irecv into a staging buffer), so that it arrives while the
/// rank computes. A no-op unless the run has --prefetch.
void pipec_rt_recv_post(pipec_ctx *ctx, int64_t peer, int64_t channel,
                        int64_t mb, int64_t bytes);

/// Waits until every send of this step has completed.
void pipec_rt_flush(pipec_ctx *ctx);

/// Sums `count` floats at `data` over the replicas of this rank's stage, in
/// place (the gradient accumulators before the update of a replicated
/// stage). A no-op for a stage with one replica.
void pipec_rt_allreduce(pipec_ctx *ctx, void *data, int64_t count);
/// The same, then divided by the replica count: the mean of the replicas'
/// gradients (PipeDream 1F1B-RR, where each replica's microbatch is a
/// minibatch).
void pipec_rt_allreduce_mean(pipec_ctx *ctx, void *data, int64_t count);
/// Sums `count` floats at `data` over every rank of the stages of tie group
/// `group` (the stage description's "tie_groups"): the gradients of
/// weights several stages hold copies of (tied embeddings).
void pipec_rt_allreduce_group(pipec_ctx *ctx, int64_t group, void *data,
                              int64_t count);

/// Records the (scalar, float) loss of microbatch mb of the current step.
void pipec_rt_loss(pipec_ctx *ctx, int64_t mb, const void *loss);

/// Writes the loss seed dL/dloss_mb (1/microbatches: the step loss is the
/// mean of the microbatch losses) as one float into dst.
void pipec_rt_loss_seed(pipec_ctx *ctx, void *dst);

/// Writes the learning rate of the current step as one float into dst.
void pipec_rt_lr(pipec_ctx *ctx, void *dst);

/// Writes the random-number state of microbatch `mb` as two int64: the run's
/// seed and the global index of the microbatch's first sample (step ·
/// global batch + mb · microbatch). Used by dropout.
void pipec_rt_rng(pipec_ctx *ctx, int64_t mb, void *dst);

/// Writes the number of optimizer updates this stage made before the
/// current one (0 for the first) as one int64 into dst: the T input of
/// ONNX's training operators. One update per step for the synchronous
/// schedules and 2BW, one per microbatch for PipeDream's 1f1b.
void pipec_rt_step(pipec_ctx *ctx, void *dst);

/*
 * Continuous schedules (1f1b, 2bw; see runtime/README.md, "Continuous
 * schedules and weight versions"). Their program is one window of a pipeline
 * that never flushes; microbatch operands are relative to the step.
 */

/// The global index (step · microbatches + rel) of relative microbatch
/// `rel`, or -1 when it lies outside the run (before the first microbatch,
/// or at or after steps · microbatches): such ops are skipped.
int64_t pipec_rt_global_mb(pipec_ctx *ctx, int64_t rel);

/// Base of the weight version that the forward (phase 0) or backward
/// (phase 1) of global microbatch `mb` reads: the live weights at the
/// arena's start, or a stashed copy of the first "versioned_bytes" bytes.
/// PipeDream (1f1b): a forward reads the live version and the backward the
/// same version. 2BW: microbatch k reads version max(floor(k/m) - 1, 0).
void *pipec_rt_weights(pipec_ctx *ctx, int64_t mb, int64_t phase, char *arena);

/// The backward of global microbatch `mb` is done: its weight version may
/// be dropped.
void pipec_rt_release(pipec_ctx *ctx, int64_t mb);

/// Called before every optimizer update (every schedule): counts updates
/// and, for the continuous schedules, copies the live weights aside when a
/// microbatch still needs that version.
void pipec_rt_update(pipec_ctx *ctx);

/// A stage function of the generated code: one forward, backward (or its
/// weight half) or optimizer step of the stage, on the arena, stash slot
/// `slot` and the weights at `wbase`.
typedef void (*pipec_stage_fn)(pipec_ctx *ctx, void *arena, int64_t slot,
                               void *wbase);

/// Runs `fn(ctx, arena, slot, wbase)` (what `--target cuda` code calls
/// instead of calling the stage function itself). With --cuda-graphs the
/// device captures the call as a CUDA graph on its second run with the same
/// (fn, arena, slot, wbase) and replays the graph from then on (the first
/// run grows the scratch buffers, uploads constants and finds algorithms,
/// which a capture cannot). Otherwise, and on the CPU, it calls `fn`.
void pipec_rt_run(pipec_ctx *ctx, pipec_stage_fn fn, void *arena, int64_t slot,
                  void *wbase);

/// Timeline hooks (pipec train --trace) around a forward (kind 0), backward
/// (1) or optimizer update (2) of microbatch `mb` (the program's index; -1
/// for none).
void pipec_rt_span_begin(pipec_ctx *ctx, int64_t kind, int64_t mb);
void pipec_rt_span_end(pipec_ctx *ctx, int64_t kind);

/// Profiler / trace hooks around op `op` (an index into the stage
/// description's "ops" list); phase 0 forward, 1 backward, 2 optimizer.
void pipec_rt_op_begin(pipec_ctx *ctx, int64_t op, int64_t phase);
void pipec_rt_op_end(pipec_ctx *ctx, int64_t op, int64_t phase);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PIPEC_RT_H */
