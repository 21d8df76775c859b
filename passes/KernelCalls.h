//===- KernelCalls.h - nn op -> runtime kernel call -------------*- C++ -*-===//
//
// The single place that knows how an nn op maps onto a kernel of the
// runtime C ABI (runtime/include/pipec_rt.h): which kernel, which buffers in
// which order, and the integer/real parameter arrays. Used by
// --pipe-lower-to-runtime (generated calls) and by the in-process executor
// (pipec profile's op table, conformance tests).
//
//===----------------------------------------------------------------------===//
#ifndef PIPEC_PASSES_KERNELCALLS_H
#define PIPEC_PASSES_KERNELCALLS_H

#include "mlir/IR/Operation.h"
#include "mlir/IR/Value.h"

#include <string>

namespace pipec {

struct KernelCall {
  std::string kernel;                  ///< symbol, e.g. "pipec_k_gemm"
  llvm::SmallVector<mlir::Value> buffers; ///< ABI order; null = NULL pointer
  llvm::SmallVector<int64_t> ints;
  llvm::SmallVector<double> reals;
};

/// True for ops whose result is the operand's bytes reinterpreted (reshape,
/// flatten, identity): the result may share the operand's buffer.
bool isViewOp(mlir::Operation *op);

/// Whether `kernel` ("pipec_k_binary") also exists as `kernel_bf16`, which
/// reads and writes bfloat16 tensors (PIPEC_KERNEL_BF16 in
/// runtime/include/pipec_kernels.def).
bool hasBf16Variant(llvm::StringRef kernel);

/// The kernel calls computing `op`, in order (most ops need one; concat
/// one per input, slice_grad a fill and a copy); failure (with an error on
/// `op`) for an op no kernel implements. A call with a float64 tensor goes
/// to the kernel's `_f64` twin, one with a bfloat16 tensor to its `_bf16`
/// variant.
mlir::FailureOr<llvm::SmallVector<KernelCall, 1>>
getKernelCalls(mlir::Operation *op);

} // namespace pipec

#endif // PIPEC_PASSES_KERNELCALLS_H
