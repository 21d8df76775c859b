//===- Profile.cpp - pipec profile ----------------------------------------===//
//
// `pipec profile` compiles a one-stage program at the requested microbatch
// and runs it with the runtime's per-op profiler. Part of the compiler
// driver (it compiles); the launch itself is the launcher's (Launch.h).
//
//===----------------------------------------------------------------------===//
#include "Driver.h"

#include "Launch.h"
#include "SysUtil.h"
#include <filesystem>

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdio>
#include <unistd.h>

using namespace pipec::driver;

/// Where the profile goes, checked before a minute of measuring: a
/// regular file (or none yet) in a folder that exists. The runtime writes it
/// to a temporary name and renames it over the target, which would replace
/// a device file. 0 if good, else the exit code after the error line.
static int checkProfileOut(const std::string &out) {
  if (out.empty())
    return fail("profile", "-o needs a file name", 2);
  std::error_code ec;
  const std::filesystem::path path = std::filesystem::absolute(out, ec);
  const auto status = std::filesystem::status(path, ec);
  if (std::filesystem::is_directory(status))
    return fail("profile", "-o '" + out + "' is a folder; give a file name", 2);
  if (std::filesystem::exists(status) &&
      !std::filesystem::is_regular_file(status))
    return fail("profile", "-o '" + out + "' exists and is not a regular file",
                2);
  if (!std::filesystem::is_directory(path.parent_path(), ec))
    return fail("profile",
                "-o '" + out + "': the folder '" + path.parent_path().string() +
                    "' does not exist",
                2);
  return 0;
}

int pipec::driver::runProfile(const std::vector<std::string> &argv,
                              const char *argv0) {
  Args a("profile", argv);
  a.positional("MODEL.onnx", "the model to measure")
      .opt("-o", "output profile", "profile.json")
      .opt("--microbatch", "batch size the ops are measured at (default: the "
                           "model's batch)")
      .opt("--steps", "measured steps", "20")
      .opt("--warmup", "unmeasured first steps", "3")
      .opt("--input-shape", "static shapes NAME=D0xD1..., comma-separated")
      .opt("--target",
           "cpu, or cuda (per-op times on the GPU: each op's "
           "kernels, the device synchronised around it)",
           "cpu")
      .opt("--precision",
           "f32, or bf16: the ops measured as `pipec compile --precision "
           "bf16` runs them",
           "f32")
      .opt("--activations",
           "f32, or bf16 / bf16-casts (with --precision bf16): "
           "activations stored in bfloat16, as `pipec compile "
           "--activations` does (the memory model's bytes then halve with "
           "them)",
           "f32")
      .opt("--threads", "BLAS threads of the measuring process (default: "
                        "every core, or OPENBLAS_NUM_THREADS). A stage "
                        "process gets cores / processes on its host: "
                        "measure with that many, and give a simulated host "
                        "with more processes than cores 'processors'")
      .opt("--mpirun", "MPI launcher", "mpirun");
  if (!a.parse())
    return a.helpShown ? 0 : 2;
  if (a.positionals().size() != 1)
    return fail("profile", "expected one MODEL.onnx", 2);
  int64_t steps, warmup, micro = 0, threads = 0;
  if (!a.getInt("--steps", steps, 1) || !a.getInt("--warmup", warmup, 0) ||
      (a.has("--microbatch") &&
       !a.getInt("--microbatch", micro, 1,
                 std::numeric_limits<int64_t>::max())) ||
      (a.has("--threads") && !a.getInt("--threads", threads, 1)))
    return 2;
  if (threads > 0) // the runtime and the launcher honour it
    setenv("OPENBLAS_NUM_THREADS", std::to_string(threads).c_str(), 1);
  if (int rc = checkProfileOut(a.get("-o")))
    return rc;
  if (a.get("--target") != "cpu" && a.get("--target") != "cuda")
    return fail("profile",
                "--target is cpu or cuda, got '" + a.get("--target") + "'", 2);
  llvm::SmallString<128> tmp;
  if (std::error_code ec =
          llvm::sys::fs::createUniqueDirectory("pipec-profile", tmp))
    return fail("profile", "cannot create a temporary folder: " + ec.message());
  CompileOptions o;
  o.model = a.positionals()[0];
  o.outDir = tmp.str().str();
  o.batch = micro;
  o.quiet = true;
  o.target = a.get("--target");
  o.precision = a.get("--precision");
  o.activations = a.get("--activations");
  if (o.precision != "f32" && o.precision != "bf16")
    return fail("profile",
                "--precision is f32 or bf16, got '" + o.precision + "'", 2);
  if (!checkActivations(o, "profile"))
    return 2;
  if (!parseInputShapes(a, o.inputShapes, "profile"))
    return 2;
  llvm::outs() << "pipec profile: compiling " << o.model << " (one stage)\n";
  int rc = compileModel(o);
  if (rc != 0) {
    llvm::sys::fs::remove_directories(o.outDir);
    return rc;
  }
  std::string error;
  std::string mpirun = findLauncher(a.get("--mpirun"), error);
  if (mpirun.empty())
    return fail("profile", error);
  std::string outPath = sys::absolute(a.get("-o"));
  std::vector<std::string> stageArgs = {"--manifest",
                                        o.outDir + "/manifest.json",
                                        "--steps",
                                        std::to_string(steps + warmup),
                                        "--lr",
                                        "0",
                                        "--profile-out",
                                        outPath,
                                        "--profile-warmup",
                                        std::to_string(warmup),
                                        "--quiet",
                                        "--checkpoint-dir",
                                        o.outDir + "/checkpoints"};
  llvm::outs() << "pipec profile: measuring " << steps << " steps after "
               << warmup << " warm-up steps\n";
  LaunchPlan plan;
  plan.bins = {o.outDir + "/stage0"};
  plan.stageArgs = stageArgs;
  plan.exportEnv = exportedEnv();
  llvm::outs().flush();
  rc = runLauncher(mpirunCommand(mpirun, plan, geteuid() == 0));
  llvm::sys::fs::remove_directories(o.outDir);
  if (rc != 0)
    return fail("profile", "the profiling run failed (exit status " +
                               std::to_string(rc) + ")");
  // The step against its ops: what the runtime adds per op call.
  std::string text;
  if (sys::readFile(outPath, text, error)) {
    if (llvm::Expected<llvm::json::Value> doc = llvm::json::parse(text)) {
      const llvm::json::Object *top = doc->getAsObject();
      std::optional<double> step =
                                top ? top->getNumber("step_s") : std::nullopt,
                            overhead = top ? top->getNumber("op_overhead_s")
                                           : std::nullopt;
      if (step && overhead) {
        char line[160];
        std::snprintf(line, sizeof line,
                      "pipec profile: a step takes %.3f ms; beyond its ops' "
                      "times, %.2f us per op call (op_overhead_s)\n",
                      *step * 1e3, *overhead * 1e6);
        llvm::outs() << line;
      }
    } else {
      llvm::consumeError(doc.takeError());
    }
  }
  llvm::outs() << "pipec profile: wrote " << outPath << "\n";
  (void)argv0;
  return 0;
}
