//===- GradientCheck.h - VJPs against finite differences --------*- C++ -*-===//
//
// Part of pipec-conformance (--gradients); see GradientCheck.cpp.
//
//===----------------------------------------------------------------------===//
#ifndef PIPEC_CONFORMANCE_GRADIENTCHECK_H
#define PIPEC_CONFORMANCE_GRADIENTCHECK_H

#include "pipec/Exec.h"

#include "mlir/IR/BuiltinOps.h"

#include <string>
#include <vector>

namespace pipec {

/// The outcome of one case: `error` empty and `skipped` empty is a pass.
struct GradientCheck {
  std::string error;   ///< why the check failed
  std::string skipped; ///< why nothing could be checked
  double error64 = 0;  ///< |<J^T w, v> - FD| / max(||J^T w|| ||v||, |FD|)
};

/// Checks the VJPs of `module`'s @main in float64 mode on `inputs` (the
/// case's float32 / int64 inputs) against central finite differences.
GradientCheck checkGradients(mlir::ModuleOp module,
                             const std::vector<HostTensor> &inputs);

} // namespace pipec

#endif // PIPEC_CONFORMANCE_GRADIENTCHECK_H
