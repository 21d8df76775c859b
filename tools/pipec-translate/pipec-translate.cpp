//===- pipec-translate.cpp - ONNX <-> MLIR ---------------------------------===//
//
//   pipec-translate --import-onnx model.onnx [--batch N]
//                   [--input-shape NAME=D0xD1...]... [-o out.mlir]
//   pipec-translate --list-ops
//
// Imports an ONNX model into the nn dialect and prints it; --list-ops
// prints the importer's operator registry (a Markdown table, the one in
// the README).
//
//===----------------------------------------------------------------------===//
#include "pipec/Import.h"

#include "mlir/IR/AsmState.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/raw_ostream.h"

using namespace llvm;

static cl::OptionCategory translateCategory("pipec-translate options");

static cl::opt<bool> importOnnx("import-onnx",
                                cl::desc("Import an ONNX model (default)"),
                                cl::init(true), cl::cat(translateCategory));
static cl::opt<std::string> inputFile(cl::Positional, cl::desc("<model.onnx>"),
                                      cl::cat(translateCategory));
static cl::opt<bool> listOps("list-ops",
                             cl::desc("Print the operators the importer "
                                      "converts, with their opset and family"),
                             cl::init(false), cl::cat(translateCategory));
static cl::opt<std::string> outputFile("o", cl::desc("Output file"),
                                       cl::value_desc("file"), cl::init("-"),
                                       cl::cat(translateCategory));
static cl::opt<int64_t> batch("batch",
                              cl::desc("Leading (batch) dimension of every "
                                       "model input"),
                              cl::init(0), cl::cat(translateCategory));
static cl::list<std::string>
    inputShapes("input-shape",
                cl::desc("Static shape of an input: NAME=D0xD1x..."),
                cl::value_desc("NAME=DIMS"), cl::cat(translateCategory));

static cl::list<std::string>
    freeze("freeze",
           cl::desc("Float initializers to import as constants (not trained), "
                    "comma-separated"),
           cl::value_desc("NAME,..."), cl::CommaSeparated,
           cl::cat(translateCategory));

static cl::opt<bool> untieWeights(
    "untie-weights",
    cl::desc("Give every node that reads a shared float initializer its own "
             "copy (exports that merged equal initializers)"),
    cl::init(false), cl::cat(translateCategory));

/// The registry as a Markdown table.
static void printOps(raw_ostream &os) {
  os << "| operator | domain | since opset | family | notes |\n"
     << "|---|---|---|---|---|\n";
  for (const pipec::SupportedOperator &op : pipec::supportedOperators()) {
    std::string note = op.note;
    if (op.foldOnly)
      note = note.empty() ? "folded at import only" : note;
    os << "| " << op.op << " | " << (op.domain.empty() ? "ai.onnx" : op.domain)
       << " | " << op.since << " | " << op.family << " | " << note << " |\n";
  }
}

/// Parses NAME=D0xD1... into `shapes`; false on syntax errors.
static bool parseInputShape(const std::string &spec,
                            std::map<std::string, std::vector<int64_t>> &shapes) {
  size_t eq = spec.rfind('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size())
    return false;
  std::vector<int64_t> dims;
  StringRef rest = StringRef(spec).substr(eq + 1);
  while (!rest.empty()) {
    auto [head, tail] = rest.split('x');
    int64_t d;
    if (head.getAsInteger(10, d) || d <= 0)
      return false;
    dims.push_back(d);
    rest = tail;
  }
  shapes[spec.substr(0, eq)] = dims;
  return true;
}

int main(int argc, char **argv) {
  InitLLVM y(argc, argv);
  mlir::registerAsmPrinterCLOptions();
  mlir::registerMLIRContextCLOptions();
  // --help shows this tool's options; --help-hidden adds LLVM's and MLIR's.
  cl::HideUnrelatedOptions(translateCategory);
  cl::ParseCommandLineOptions(argc, argv, "pipec ONNX -> MLIR translator\n");
  if (listOps) {
    printOps(outs());
    return 0;
  }
  if (inputFile.empty()) {
    errs() << "pipec-translate: error: no input file (give model.onnx, or "
              "--list-ops)\n";
    return 1;
  }

  if (batch.getNumOccurrences() > 0 && batch <= 0) {
    errs() << "pipec-translate: error: --batch must be >= 1, got " << batch
           << "\n";
    return 1;
  }
  pipec::ImportOptions options;
  options.batch = batch;
  options.frozen.insert(freeze.begin(), freeze.end());
  options.untieWeights = untieWeights;
  for (const std::string &spec : inputShapes)
    if (!parseInputShape(spec, options.inputShapes)) {
      errs() << "pipec-translate: error: bad --input-shape '" << spec
             << "' (expected NAME=D0xD1x...)\n";
      return 1;
    }
  mlir::DialectRegistry registry;
  pipec::registerImportDialects(registry);
  mlir::MLIRContext context(registry);
  std::string error;
  auto module = pipec::importOnnxFile(context, inputFile, options, error);
  if (!module) {
    errs() << "pipec-translate: error: " << error << "\n";
    return 1;
  }
  std::string msg;
  auto out = mlir::openOutputFile(outputFile, &msg);
  if (!out) {
    errs() << "pipec-translate: error: " << msg << "\n";
    return 1;
  }
  // Locations carry the ONNX node names (profiles and diagnostics use them).
  module->print(out->os(), mlir::OpPrintingFlags().enableDebugInfo(true, /*prettyForm=*/false));
  out->os() << "\n";
  out->keep();
  return 0;
}
