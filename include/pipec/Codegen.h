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
/// `target` "cuda" links libpipec_rt_cuda, the CUDA runtime and cuBLAS.
bool linkExecutable(const std::vector<std::string> &objects,
                    const std::string &output, std::string &error,
                    const std::string &target = "cpu");

/// The runtime library and link flags used by linkExecutable.
std::vector<std::string> runtimeLinkArgs(const std::string &target = "cpu");

/// True when this compiler was built with the CUDA runtime (the toolkit was
/// found at build time).
bool haveCudaRuntime();

} // namespace pipec

#endif // PIPEC_CODEGEN_H
