//===- Codegen.cpp - LLVM dialect -> object -> stage executable -----------===//
//
// In-process code generation: MLIR's LLVM IR export, the default O2
// pipeline and the host TargetMachine (position-independent code, since
// Debian's compilers link PIE by default); then the system C++ compiler
// links the object with libpipec_rt.
//
//===----------------------------------------------------------------------===//
#include "pipec/Codegen.h"
#include "pipec/BuildConfig.h"

#include "mlir/Target/LLVMIR/Dialect/Builtin/BuiltinToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/LLVMIR/LLVMToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Export.h"
#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/LegacyPassManager.h"
#include "llvm/IR/Module.h"
#include "llvm/MC/TargetRegistry.h"
#include "llvm/Passes/PassBuilder.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Program.h"
#include "llvm/Support/TargetSelect.h"
#include "llvm/Support/raw_ostream.h"
#include "llvm/Target/TargetMachine.h"
#include "llvm/Target/TargetOptions.h"
#include "llvm/TargetParser/Host.h"

#include <cstdlib>
#include <mutex>

using namespace mlir;

void pipec::registerCodegenTranslations(DialectRegistry &registry) {
  registerBuiltinDialectTranslation(registry);
  registerLLVMDialectTranslation(registry);
}

static std::unique_ptr<llvm::TargetMachine> hostTargetMachine(std::string &error) {
  static std::once_flag once;
  std::call_once(once, [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
  });
  llvm::Triple triple(llvm::sys::getDefaultTargetTriple());
  const llvm::Target *target = llvm::TargetRegistry::lookupTarget(triple, error);
  if (!target)
    return nullptr;
  llvm::TargetOptions options;
  return std::unique_ptr<llvm::TargetMachine>(target->createTargetMachine(
      triple, llvm::sys::getHostCPUName(), "", options, llvm::Reloc::PIC_));
}

bool pipec::emitObjectFile(ModuleOp module, const std::string &path,
                           std::string &error) {
  llvm::LLVMContext llvmContext;
  std::unique_ptr<llvm::Module> llvmModule =
      translateModuleToLLVMIR(module, llvmContext, "pipec_stage");
  if (!llvmModule) {
    error = "translation of the lowered stage to LLVM IR failed";
    return false;
  }
  auto tm = hostTargetMachine(error);
  if (!tm)
    return false;
  llvmModule->setTargetTriple(tm->getTargetTriple());
  llvmModule->setDataLayout(tm->createDataLayout());

  // -O2 on the generated glue (kernel calls, address arithmetic).
  llvm::LoopAnalysisManager lam;
  llvm::FunctionAnalysisManager fam;
  llvm::CGSCCAnalysisManager cgam;
  llvm::ModuleAnalysisManager mam;
  llvm::PassBuilder pb(tm.get());
  pb.registerModuleAnalyses(mam);
  pb.registerCGSCCAnalyses(cgam);
  pb.registerFunctionAnalyses(fam);
  pb.registerLoopAnalyses(lam);
  pb.crossRegisterProxies(lam, fam, cgam, mam);
  llvm::ModulePassManager mpm =
      pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O2);
  mpm.run(*llvmModule, mam);

  std::error_code ec;
  llvm::raw_fd_ostream out(path, ec, llvm::sys::fs::OF_None);
  if (ec) {
    error = "cannot write '" + path + "': " + ec.message();
    return false;
  }
  llvm::legacy::PassManager codegen;
  if (tm->addPassesToEmitFile(codegen, out, nullptr,
                              llvm::CodeGenFileType::ObjectFile)) {
    error = "the host target cannot emit object files";
    return false;
  }
  codegen.run(*llvmModule);
  out.flush();
  return true;
}

bool pipec::haveCudaRuntime() {
  return !llvm::StringRef(PIPEC_RT_CUDA_LINK_LIBS).empty();
}

std::vector<std::string> pipec::runtimeLinkArgs(const std::string &target) {
  std::vector<std::string> args;
  llvm::StringRef libs =
      target == "cuda" ? PIPEC_RT_CUDA_LINK_LIBS : PIPEC_RT_LINK_LIBS;
  while (!libs.empty()) {
    auto [head, tail] = libs.split(';');
    if (!head.empty())
      args.push_back(head.str());
    libs = tail;
  }
  // An installed or relocated runtime: PIPEC_RT_LIB replaces the build-tree
  // path of libpipec_rt.a.
  if (const char *rt = std::getenv("PIPEC_RT_LIB"))
    for (std::string &a : args)
      if (llvm::StringRef(a).ends_with("libpipec_rt.a"))
        a = rt;
  return args;
}

bool pipec::linkExecutable(const std::vector<std::string> &objects,
                           const std::string &output, std::string &error,
                           const std::string &target) {
  std::string cxx = PIPEC_CXX_COMPILER;
  if (const char *env = std::getenv("PIPEC_CXX"))
    cxx = env;
  std::vector<std::string> args = {cxx, "-o", output};
  args.insert(args.end(), objects.begin(), objects.end());
  for (std::string &a : runtimeLinkArgs(target))
    args.push_back(a);
  args.push_back("-lm");
  args.push_back("-lpthread");
  std::vector<llvm::StringRef> refs(args.begin(), args.end());
  std::string msg;
  int rc = llvm::sys::ExecuteAndWait(cxx, refs, std::nullopt, {}, 0, 0, &msg);
  if (rc != 0) {
    error = "linking '" + output + "' failed (" + cxx + " exited with " +
            std::to_string(rc) + (msg.empty() ? "" : ": " + msg) + ")";
    return false;
  }
  return true;
}
