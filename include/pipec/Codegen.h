//===- Codegen.h - LLVM dialect -> stage executables ------------*- C++ -*-===//
#ifndef PIPEC_CODEGEN_H
#define PIPEC_CODEGEN_H

#include "mlir/IR/BuiltinOps.h"

#include <string>
#include <vector>

namespace pipec {

/// Registers the LLVM IR translations of the dialects a lowered stage holds.
void registerCodegenTranslations(mlir::DialectRegistry &registry);

/// Translates an LLVM-dialect module to LLVM IR and writes a
/// position-independent object file for the host at -O2.
bool emitObjectFile(mlir::ModuleOp module, const std::string &path,
                    std::string &error);

/// Links `objects` with libpipec_rt (and MPI, BLAS) into an executable,
/// using the C++ compiler pipec was built with.
bool linkExecutable(const std::vector<std::string> &objects,
                    const std::string &output, std::string &error);

/// The runtime library and link flags used by linkExecutable.
std::vector<std::string> runtimeLinkArgs();

} // namespace pipec

#endif // PIPEC_CODEGEN_H
