//===- options.h - Command line of a stage executable -----------*- C++ -*-===//
//
// Part of pipec's runtime core.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The flags every stage executable accepts (runtime/README.md, "Command line
/// of a stage executable"). Both `--flag value` and `--flag=value` work; a
/// repeated flag takes its last value.
///
//===----------------------------------------------------------------------===//

#ifndef PIPEC_RUNTIME_CORE_OPTIONS_H
#define PIPEC_RUNTIME_CORE_OPTIONS_H

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace pipec {
namespace rt {

/// An on/off switch of the environment (unset or empty: `byDefault`); a
/// value other than 0 or 1 is refused (RtError), saying what each means:
/// PIPEC_FEED_PREFETCH, the CUDA communicator's PIPEC_CUDA_IPC,
/// PIPEC_NCCL and PIPEC_NCCL_P2P, and the CUDA kernels' PIPEC_BN_SPLIT and
/// PIPEC_BF16_PAD.
bool switchedOn(const char *name, bool byDefault, const char *on,
                const char *off);

/// A bad command line: unknown flag, missing or malformed value.
class UsageError : public std::runtime_error {
public:
  explicit UsageError(const std::string &message)
      : std::runtime_error(message) {}
};

/// Parsed flags. Empty paths mean "the default", resolved by
/// resolveDefaultPaths once the manifest's location is known.
struct Options {
  std::string manifest;
  int64_t steps = 10;
  double lr = 0.01;
  /// One .npy file per model input, in model-input order.
  std::vector<std::string> inputs;
  std::string labels;
  uint64_t seed = 0;
  std::string metrics;
  std::string checkpointDir;
  int64_t checkpointEvery = 0;
  std::string profileOut;
  int64_t profileWarmup = 1;
  /// Folder of the per-rank status files (core/status.h); empty: none.
  std::string statusDir;
  /// Per-rank Chrome trace of the run ("" = none).
  std::string trace;
  /// Per-rank JSON summary (arena, weight versions, updates); "" = none.
  std::string summaryOut;
  /// Continue from the checkpoint that <checkpointDir>/latest names, up to
  /// step `steps` (synchronous schedules: bit-identical to an
  /// uninterrupted run).
  bool resume = false;
  /// Continue from a checkpoint of another build of the same model (a step
  /// folder, or a checkpoints folder with `latest`): weights and optimizer
  /// state by name, the step count from the checkpoint.
  std::string resumeFrom;
  /// PipeDream ablation: 1f1b backwards read the live weights.
  bool noWeightStashing = false;
  /// Post the step's receives at its start (synchronous schedules).
  bool prefetch = false;
  /// Pin this rank (every thread) to its block of the host's CPUs: the
  /// CPUs this process may use, split among the ranks on the host in rank
  /// order (several ranks on one CPU when they outnumber the CPUs).
  bool bindCores = false;
  /// TF32 tensor-core math for float32 GEMMs on a CUDA device (off: float32
  /// results match the CPU kernels to rounding).
  bool allowTf32 = false;
  /// CUDA stages: every kernel call checked against the CPU kernel
  /// (libpipec_rt_cuda_check.so preloaded; runtime/cuda/shadow_check.cpp).
  bool checkKernels = false;
  /// CUDA stages: each stage function's work captured once as a CUDA graph
  /// and replayed (off while ops are profiled or kernels checked).
  bool cudaGraphs = false;
  /// PipeDream vertical sync for 1f1b.
  bool verticalSync = false;
  bool quiet = false;
  bool help = false;
  /// Seconds without progress after which a rank stops the job naming what
  /// it waits for (core/watchdog.h); 0 = no watchdog.
  double watchdogSeconds = 20;
  /// The first step has no measured step time and includes start-up work
  /// (first touches of the arena, thread pools): it is allowed
  /// max(watchdogSeconds, this); later steps max(watchdogSeconds, 4x the
  /// longest step), so a long operation is not taken for a hang once a step
  /// has been timed.
  double watchdogFirstStepSeconds = 300;
  /// PIPEC_TEARDOWN_TIMEOUT_S: how long the local teardown after the
  /// transport has closed may take before the rank ends itself (core/
  /// watchdog.h, armTeardownDeadline); 0 = no deadline.
  double teardownSeconds = 60;
};

/// Parses argv[1..argc); throws UsageError.
Options parseOptions(int argc, char **argv);

/// Fills the defaults that depend on locations: the manifest beside the
/// executable, metrics.jsonl and checkpoints/ beside the manifest.
void resolveDefaultPaths(Options &options, const char *argv0);

/// The usage text (several lines, ending in a newline).
std::string usageText(const char *argv0);

} // namespace rt
} // namespace pipec

#endif // PIPEC_RUNTIME_CORE_OPTIONS_H
