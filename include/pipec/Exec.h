//===- Exec.h - in-process executor of nn functions -------------*- C++ -*-===//
//
// Runs an nn-dialect function in the compiler's process by calling the
// runtime's kernels (the same kernel calls --pipe-lower-to-runtime emits,
// from passes/KernelCalls.h). Used by the ONNX conformance runner and the
// tests; training runs use the generated executables instead.
//
//===----------------------------------------------------------------------===//
#ifndef PIPEC_EXEC_H
#define PIPEC_EXEC_H

#include "mlir/Dialect/Func/IR/FuncOps.h"

#include <string>
#include <vector>

namespace pipec {

/// A dense host tensor: f32, f64 or i64 elements as bytes.
struct HostTensor {
  std::vector<int64_t> shape;
  bool isFloat = true;
  std::vector<char> bytes;
  int64_t numel() const;
};

/// Runs `fn` on `inputs` (one per argument, types must match) and returns
/// its results, or an error message.
bool executeFunction(mlir::func::FuncOp fn,
                     const std::vector<HostTensor> &inputs,
                     std::vector<HostTensor> &outputs, std::string &error);

} // namespace pipec

#endif // PIPEC_EXEC_H
