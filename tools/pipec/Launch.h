//===- Launch.h - where the ranks of a run go, and the launcher line -------===//
//
// Plain C++ (no LLVM): the hosts a run may use (a hostfile or --hosts),
// the placement of its ranks on their slots, and the command line of the
// launcher (mpirun's MPMD syntax, or srun with a --multi-prog file).
//
//===----------------------------------------------------------------------===//
#ifndef PIPEC_TOOLS_PIPEC_LAUNCH_H
#define PIPEC_TOOLS_PIPEC_LAUNCH_H

#include <string>
#include <vector>

namespace pipec::driver {

/// A machine of the job and how many ranks it may run.
struct HostSlots {
  std::string host;
  int slots = 1;
};

/// Reads an OpenMPI-style hostfile: one host per line, `host [slots=N]
/// [max_slots=M]`, `#` comments. A host without `slots=` runs one rank
/// (pipec's rule: one stage per machine unless said otherwise); a host
/// listed twice adds its slots. False with `error` (file, line, what).
bool readHostfile(const std::string &path, std::vector<HostSlots> &hosts,
                  std::string &error);

/// Parses `--hosts a,b:2,c` (host[:slots], one slot by default).
bool parseHostList(const std::string &list, std::vector<HostSlots> &hosts,
                   std::string &error);

/// The host of every rank, in rank order: the hosts are filled in the
/// order given, one rank per slot. False with `error` when the slots are
/// fewer than the ranks (saying how many are needed).
bool placeRanks(const std::vector<HostSlots> &hosts, size_t ranks,
                std::vector<std::string> &hostOfRank, std::string &error);

/// True for names that mean this machine (localhost, 127.x, its hostname).
bool isLocalHost(const std::string &host);

/// Splits launcher arguments as a POSIX shell would split words (single and
/// double quotes, backslash escapes; no expansion). False on an unclosed
/// quote.
bool splitWords(const std::string &text, std::vector<std::string> &words,
                std::string &error);

/// What the launcher runs: one binary per rank with the same arguments.
struct LaunchPlan {
  std::vector<std::string> bins;      ///< in rank order
  std::vector<int> stageOfRank;       ///< the stage each rank runs
  std::vector<std::string> stageArgs; ///< appended to every binary
  std::vector<HostSlots> hosts;       ///< empty: this machine only
  std::vector<std::string> hostOfRank; ///< from placeRanks, or empty
  std::vector<std::string> launcherArgs; ///< --launcher-args, verbatim
  /// Environment variables the ranks must see (exported by the launcher).
  std::vector<std::string> exportEnv;
};

/// mpirun's MPMD line: `-np 1 [--host H:SLOTS] BIN ARGS : ...`. On this
/// machine only, ranks share its cores (--oversubscribe); with hosts, each
/// rank goes to its host and OpenMPI refuses more ranks than slots.
std::vector<std::string> mpirunCommand(const std::string &mpirun,
                                       const LaunchPlan &plan, bool asRoot);

/// srun's line for the same job: `srun --ntasks R [--distribution=arbitrary
/// (SLURM_HOSTFILE names every task's host)] ARGS --multi-prog CONF`, with
/// CONF (`rank binary args...` per line) returned in `config`.
std::vector<std::string> srunCommand(const std::string &srun,
                                     const LaunchPlan &plan,
                                     const std::string &configPath,
                                     std::string &config);

/// Runs the launcher and waits for it: its exit status, or -1 (with a
/// message) when it cannot be started. Its standard error passes through
/// line by line, less OpenMPI's banners about an abort or a non-zero exit
/// status that follow a rank's own pipec error line (the rank said what
/// happened; the launcher's banner would only bury it) and the error-log
/// lines such an abort makes. Every other message of the launcher is kept.
/// `deaths` receives what OpenMPI said of ranks that died ("mpirun noticed
/// that process rank R ... on node H exited on signal S"): rank, host and
/// how it ended, for the ranks whose status record is on another host.
struct RankDeath {
  int rank = -1;
  std::string host, how;
  int signal = 0; ///< the signal that ended it, when it says one
  /// Killed by the launcher's cleanup after another rank's failure (srun
  /// reports every task it cancels; a SIGTERM beside a death of another
  /// kind), not a cause.
  bool consequence = false;
};
/// The exit status of a job a watchdog stopped (the runtime's too).
constexpr int kWatchdogStatus = 4;

struct LauncherReport {
  std::vector<RankDeath> deaths;
  /// Hosts whose MPI daemon the launcher lost ("ORTE has lost
  /// communication with a remote daemon": the host died or its link).
  std::vector<std::string> lostHosts;
  /// The ranks' watchdog lines (runtime core/watchdog.h), held back from
  /// the output: summarizeWatchdog makes one line of them.
  std::vector<std::string> watchdog;
  /// OpenMPI could not start its daemon on some host (unreachable, no such
  /// host, no MPI there): no rank started.
  bool daemonsFailed = false;
  /// Some rank printed its own error line (pipec-rt: error: ...).
  bool rankReported = false;
  /// The launcher had not ended the job `graceSeconds` after a watchdog
  /// line (mpirun waits for daemons on a host it cannot reach); pipec
  /// stopped it.
  bool stopped = false;
  /// At the start-up deadline (StartWatch), the ranks that had not joined
  /// the job: those that never started the runtime (no marker: exited or
  /// hung before it), and those waiting in MPI_Init; pipec stopped the job.
  std::vector<int> notStarted, waitingInInit;
  /// pipec itself got SIGINT, SIGTERM or SIGHUP (0: none): it stopped the
  /// launcher and returned 128 + that signal.
  int interrupted = 0;
};

/// A rank's file in a job's status folder (runtime core/status.h):
/// `statusDir`/rank-R.status, its record once it has joined MPI, or
/// rank-R.started, the marker it leaves before MPI_Init.
std::string rankStatusPath(const std::string &statusDir, size_t rank,
                           const char *kind = "status");

/// "rank R (stage S)", or "rank R" when `stageOfRank` does not list it.
std::string rankName(int rank, const std::vector<int> &stageOfRank);

/// A start-up deadline: every rank makes its status record
/// (`statusDir`/rank-R.status) once it has joined MPI; a rank without one
/// `seconds` after the launch (a stage executable that exits or hangs
/// before MPI_Init) would leave the others waiting in MPI_Init forever.
/// Only where every rank runs on this machine (their records are here).
struct StartWatch {
  std::string statusDir;
  size_t ranks = 0;
  double seconds = 60;
};

/// SIGINT, SIGTERM and SIGHUP noted, not fatal, while one lives (nested:
/// the outermost installs and restores the handlers, and clears what was
/// noted), so that pipec stops the job and cleans up after it instead of
/// dying first; runLauncher holds one, and a caller that launches more than
/// once or cleans up afterwards holds one around all of it.
class InterruptsNoted {
public:
  InterruptsNoted();
  ~InterruptsNoted();
  InterruptsNoted(const InterruptsNoted &) = delete;
  InterruptsNoted &operator=(const InterruptsNoted &) = delete;
  /// The signal noted (0: none).
  static int signal();
};

int runLauncher(const std::vector<std::string> &cmd,
                LauncherReport *report = nullptr, double graceSeconds = 5,
                const StartWatch *start = nullptr);

/// One line from the ranks' watchdog lines: the rank that the others wait
/// for and that reported nothing itself (lost, or on a lost host or link),
/// with who waited, the step and the last complete checkpoint; else the
/// first line as it is, and, given the job's `stageOfRank`, a note naming
/// the ranks that reported nothing (in a collective nobody can name the
/// peer it waits for; a stopped or stuck rank cannot report).
std::string summarizeWatchdog(const std::vector<std::string> &lines,
                              const std::vector<int> &stageOfRank = {});

/// The death OpenMPI reports in `line`, if it reports one.
bool parseRankDeath(const std::string &line, RankDeath &death);

/// True for a block of OpenMPI's help output (between lines of dashes)
/// that runLauncher leaves out.
bool isLauncherNoise(const std::string &block);

/// One word quoted for a POSIX shell (as is when it needs no quotes).
std::string shellQuote(const std::string &s);

/// The environment variables every rank must see (exported by the
/// launcher): OPENBLAS_NUM_THREADS when the user set it, then every
/// PIPEC_ variable that is set, by name.
std::vector<std::string> exportedEnv();

/// The launcher program `requested` (mpirun, srun or a path) found on
/// PATH; "" with `error` saying what to install when there is none.
std::string findLauncher(const std::string &requested, std::string &error);

} // namespace pipec::driver

#endif // PIPEC_TOOLS_PIPEC_LAUNCH_H
