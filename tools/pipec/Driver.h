//===- Driver.h - pipec subcommands -----------------------------*- C++ -*-===//
#ifndef PIPEC_TOOLS_PIPEC_DRIVER_H
#define PIPEC_TOOLS_PIPEC_DRIVER_H

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace pipec::driver {

/// A tiny option parser: `--name value`, `--name=value`, flags, positionals.
class Args {
public:
  Args(std::string command, std::vector<std::string> args)
      : who("pipec " + command), raw(std::move(args)) {}

  /// The name usage and errors give the program ("pipec train" by default;
  /// "pipec-run" for the launcher without the compiler).
  void callAs(std::string name) { who = std::move(name); }

  /// Declares an option taking a value.
  Args &opt(const std::string &name, const std::string &help,
            const std::string &dflt = "");
  /// Declares a boolean flag.
  Args &flag(const std::string &name, const std::string &help);
  /// Declares the positional argument(s).
  Args &positional(const std::string &name, const std::string &help);

  /// Parses; on error prints one line + usage and returns false. Sets
  /// `helpShown` when --help was given (the caller returns 0).
  bool parse();
  bool helpShown = false;

  std::string get(const std::string &name) const;
  bool has(const std::string &name) const;
  /// An integer in [min, max]; the default max is the largest `int`, as
  /// most counts end up in one (a larger value would wrap around).
  bool getInt(const std::string &name, int64_t &out, int64_t min,
              int64_t max = std::numeric_limits<int>::max()) const;
  bool getDouble(const std::string &name, double &out) const;
  /// Bytes > 0, optionally with K, M or G (KiB, MiB, GiB): "512M".
  bool getBytes(const std::string &name, int64_t &out) const;
  const std::vector<std::string> &positionals() const { return pos; }
  void usage(bool toStdout) const;

private:
  struct Spec {
    std::string help, dflt;
    bool isFlag;
  };
  std::string who;
  std::vector<std::string> raw;
  std::vector<std::pair<std::string, Spec>> specs;
  std::string posName, posHelp;
  std::map<std::string, std::string> values;
  std::vector<std::string> pos;
};

/// --input-shape NAME=D0xD1x...[,...] into `out`; false after one error
/// line of `command` when a piece is malformed.
bool parseInputShapes(const Args &a,
                      std::map<std::string, std::vector<int64_t>> &out,
                      const std::string &command);

/// One error line, "pipec <command>: error: ...".
int fail(const std::string &command, const std::string &message, int rc = 1);

int runImport(const std::vector<std::string> &args);
int runProfile(const std::vector<std::string> &args, const char *argv0);
int runCompile(const std::vector<std::string> &args);
int runTrain(const std::vector<std::string> &args, const char *argv0);
int runPlan(const std::vector<std::string> &args);
int runSimulate(const std::vector<std::string> &args);
int runCalibrate(const std::vector<std::string> &args);
int runTopology(const std::vector<std::string> &args, const char *argv0);

/// Options of `pipec compile` (also used by `pipec profile`).
struct CompileOptions {
  std::string model;
  std::string outDir;
  int stages = 1;
  int microbatches = 1;
  int64_t batch = 0; // 0: the file's
  std::string schedule = "1f1b-flush";
  /// --schedule-csv: the custom schedule's compute-only CSV (schedule
  /// "custom"; stages, chunks and microbatches come from the file).
  std::string scheduleCsv;
  /// --recompute: activation recomputation per stage (none, full,
  /// selective), one for all stages or one per stage.
  std::vector<std::string> recompute;
  /// --memory-limit: bytes a rank's arena may take (0: no limit); with
  /// --recompute auto, the budget recomputation is chosen for.
  int64_t memoryLimit = 0;
  /// --schedule synth: the order of F/B/W per stage comes from the
  /// synthesiser (lib/Sim/Synth.cpp) for this model's stage times and
  /// --memory-limit; `schedule` is then "zb-h1" for the rules and the
  /// memory trial, and the result runs as a custom schedule.
  bool synthesize = false;
  std::string profile;
  std::string device = "cpu";
  std::string loss = "cross-entropy";
  std::string optimizer = "sgd";
  double momentum = 0.9, beta1 = 0.9, beta2 = 0.999, epsilon = 1e-8;
  double weightDecay = 0;
  /// Replicas per stage; empty: one each.
  std::vector<int> replicas;
  /// How replicas share a batch: "rr" (1F1B-RR, PipeDream: whole
  /// microbatches round robin) or "split" (DAPPLE: every replica runs a
  /// slice of every microbatch).
  std::string replicaMode = "rr";
  /// Interleaved: model chunks per device (the plan has stages x chunks
  /// pipeline stages).
  int chunks = 1;
  /// 1f1b-flush warm-up policy (DAPPLE): "A" or "B".
  std::string warmup = "A";
  /// "f32", or "f64": the float64 reference mode (every kernel and buffer
  /// in double; weights widened exactly; checkpoints in F64).
  std::string precision = "f32";
  /// --activations: "f32", or "bf16" / "bf16-casts" (with precision
  /// "bf16").
  std::string activations = "f32";
  /// cpu, or cuda: stage executables with the CUDA runtime.
  std::string target = "cpu";
  /// A fixed cut: the last layer of every stage but the last (empty: the
  /// planner chooses).
  std::vector<int> cuts;
  std::map<std::string, std::vector<int64_t>> inputShapes;
  /// Float initializers kept constant (not trained).
  std::set<std::string> frozen;
  /// Every reader of a shared float initializer gets its own copy.
  bool untieWeights = false;
  /// --no-fuse: every ONNX node imported as its own op.
  bool noFuse = false;
  bool emitMlir = false;
  bool quiet = false;
  /// Print the seconds of every phase (import, plan, split and
  /// differentiate, schedule and verify, lower, link, write outputs).
  bool timings = false;
};

/// Compiles a model into OUT/ (stage executables, weights, manifest).
/// Returns 0 or prints one error line and returns non-zero.
int compileModel(const CompileOptions &options);

/// Fails (false, with one error line under `command`) when `--activations`
/// is neither f32 nor bf16, or bf16 without `--precision bf16`.
bool checkActivations(const CompileOptions &o, const std::string &command);

/// Directory of the running executable (to find sibling tools).

} // namespace pipec::driver

#endif // PIPEC_TOOLS_PIPEC_DRIVER_H
