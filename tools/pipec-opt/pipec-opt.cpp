//===- pipec-opt.cpp - run pipec passes on MLIR ---------------------------===//
//
// MlirOptMain with the dialects pipec parses (nn, pipe and the upstream
// ones its IR contains) and only the passes pipec uses.
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"

#include "mlir/Conversion/Passes.h"
#include "mlir/Dialect/ControlFlow/IR/ControlFlow.h"
#include "mlir/Target/LLVMIR/Dialect/Builtin/BuiltinToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/LLVMIR/LLVMToLLVMIRTranslation.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/Support/PrettyStackTrace.h"

int main(int argc, char **argv) {
  mlir::DialectRegistry registry;
  registry.insert<pipec::nn::NNDialect, pipec::pipe::PipeDialect,
                  mlir::func::FuncDialect, mlir::ml_program::MLProgramDialect,
                  mlir::arith::ArithDialect, mlir::scf::SCFDialect,
                  mlir::cf::ControlFlowDialect, mlir::LLVM::LLVMDialect>();
  pipec::registerPipecPasses();
  pipec::registerPipecPipelines();
  mlir::registerCanonicalizerPass();
  mlir::registerCSEPass();
  mlir::registerSCFToControlFlowPass();
  mlir::registerArithToLLVMConversionPass();
  mlir::registerConvertControlFlowToLLVMPass();
  mlir::registerConvertFuncToLLVMPass();
  mlir::registerReconcileUnrealizedCastsPass();
  llvm::setBugReportMsg("pipec-opt crashed: please file an issue with the "
                        "input and the command line.\n");
  return mlir::asMainReturnCode(mlir::MlirOptMain(
      argc, argv, "pipec optimizer driver: nn and pipe passes\n", registry));
}
