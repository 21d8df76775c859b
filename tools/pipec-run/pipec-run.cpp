//===- pipec-run.cpp - launch a compiled pipeline -------------------------===//
//
//   pipec-run OUT/ [--steps N] [--lr F] [--inputs x.npy] [--labels y.npy] ...
//
// The same as `pipec train`: starts every stage executable of a
// `pipec compile` output folder as one MPMD mpirun job. Links no LLVM and
// no MLIR (tools/pipec/CMakeLists.txt, PipecLaunch).
//
//===----------------------------------------------------------------------===//
#include "Driver.h"

#include <string>
#include <vector>

int main(int argc, char **argv) {
  return pipec::driver::runTrain(std::vector<std::string>(argv + 1, argv + argc),
                                 argv[0]);
}
