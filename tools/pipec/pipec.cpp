//===- pipec.cpp - the pipec driver ---------------------------------------===//
//
// Strings the passes and tools together (DESIGN.md §1):
//
//   pipec import  MODEL.onnx [-o model.mlir] [--batch N] [--input-shape N=DIMS]
//   pipec profile MODEL.onnx [--microbatch B] [--steps N] -o profile.json
//   pipec compile MODEL.onnx --stages P --microbatches M --schedule S -o OUT/
//   pipec train   OUT/ [--steps N] [--lr F] [--inputs x.npy] [--labels y.npy]
//   pipec plan    --profile P.json --topology T.json [--algorithm auto] -o plan.json
//   pipec simulate plan.json --profile P.json --topology T.json [--trace t.json]
//
// Every step can also be run alone (pipec-translate, pipec-opt, the stage
// executables under mpirun); `pipec train --dry-run` prints the mpirun line.
//
//===----------------------------------------------------------------------===//
#include "Driver.h"

#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/raw_ostream.h"

#include <cstring>

using namespace pipec::driver;

static void printUsage(llvm::raw_ostream &os) {
  os << R"(pipec - compile ONNX models into pipeline-parallel training executables

usage: pipec <command> [options]

commands:
  import   MODEL.onnx          import into the nn dialect and print it (MLIR)
  profile  MODEL.onnx          measure per-op forward/backward times on this
                               machine and write profile.json
  compile  MODEL.onnx -o OUT   plan stages, differentiate, schedule and build
                               one executable per stage, weights and manifest
  train    OUT                 run the stage executables with mpirun
  plan     --profile P --topology T
                               choose stages, replicas and placement with the
                               planners of the papers (no ONNX needed)
  simulate PLAN --profile P --topology T
                               predict time, bubble and memory of a plan
  calibrate PROFILE --device D fit a device model's efficiencies to a
                               profile measured on the device
  topology --measure -o T      time messages between processes here and
                               write the topology (link, cores) for plan
                               and simulate
  help [command]               show the options of a command

a first run (in the source tree: the example MLP and a learnable dataset):
  /usr/bin/python3 examples/mlp/make_mlp.py --data-steps 8
  pipec compile examples/mlp/mlp.onnx --stages 4 --microbatches 8 -o out/
  pipec train out/ --steps 100 --lr 0.5 --inputs examples/mlp/x.npy \
      --labels examples/mlp/y.npy

Run `pipec <command> --help` for the options of each command.
)";
}

int main(int argc, char **argv) {
  llvm::InitLLVM y(argc, argv);
  if (argc < 2) {
    printUsage(llvm::errs());
    return 2;
  }
  std::string cmd = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (cmd == "-h" || cmd == "--help") {
    printUsage(llvm::outs());
    return 0;
  }
  if (cmd == "help") {
    if (args.empty()) {
      printUsage(llvm::outs());
      return 0;
    }
    cmd = args[0];
    args = {"--help"};
  }
  if (cmd == "import")
    return runImport(args);
  if (cmd == "profile")
    return runProfile(args, argv[0]);
  if (cmd == "compile")
    return runCompile(args);
  if (cmd == "train")
    return runTrain(args, argv[0]);
  if (cmd == "plan")
    return runPlan(args);
  if (cmd == "simulate")
    return runSimulate(args);
  if (cmd == "calibrate")
    return runCalibrate(args);
  if (cmd == "topology")
    return runTopology(args, argv[0]);
  llvm::errs() << "pipec: error: unknown command '" << cmd << "'\n\n";
  printUsage(llvm::errs());
  return 2;
}
