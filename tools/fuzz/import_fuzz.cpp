//===- import_fuzz.cpp - libFuzzer target for the ONNX importer -----------===//
//
// Feeds arbitrary bytes to the importer (pipec::importOnnxBytes) with a
// small batch. The importer must either produce a module that verifies or
// return an error message; it must never crash, hang or leak. Built by
// scripts/fuzz.sh importer with clang's -fsanitize=fuzzer,address.
//
//===----------------------------------------------------------------------===//
#include "pipec/Import.h"

#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"

#include <cstdint>
#include <cstdlib>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static mlir::DialectRegistry *registry = [] {
    auto *r = new mlir::DialectRegistry();
    pipec::registerImportDialects(*r);
    return r;
  }();
  mlir::MLIRContext context(*registry, mlir::MLIRContext::Threading::DISABLED);
  context.getDiagEngine().registerHandler([](mlir::Diagnostic &) {
    return mlir::success(); // verification messages are expected for junk
  });
  std::string bytes(reinterpret_cast<const char *>(data), size);
  pipec::ImportOptions options;
  options.batch = 2;
  std::string error;
  auto module =
      pipec::importOnnxBytes(context, bytes, "fuzz.onnx", options, error);
  if (module && mlir::failed(mlir::verify(*module)))
    std::abort(); // an imported module must verify
  if (!module && error.empty())
    std::abort(); // a refusal must say why
  return 0;
}
