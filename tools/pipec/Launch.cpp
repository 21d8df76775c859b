//===- Launch.cpp - where the ranks of a run go, and the launcher line -----===//
#include "Launch.h"

#include <algorithm>
#include <arpa/inet.h>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <ifaddrs.h>
#include <map>
#include <netinet/in.h>
#include <optional>
#include <poll.h>
#include <set>
#include <sstream>
#include <sys/wait.h>
#include <unistd.h>

using namespace pipec::driver;

namespace {

/// A slot count: a positive integer, else -1.
int parseSlots(const std::string &text) {
  if (text.empty() || text.size() > 6 ||
      text.find_first_not_of("0123456789") != std::string::npos)
    return -1;
  int n = std::stoi(text);
  return n > 0 ? n : -1;
}

/// Adds `slots` to `host` (a host named twice adds up), in first-seen order.
void addHost(std::vector<HostSlots> &hosts, const std::string &host,
             int slots) {
  for (HostSlots &h : hosts)
    if (h.host == host) {
      h.slots += slots;
      return;
    }
  hosts.push_back({host, slots});
}

} // namespace

bool pipec::driver::readHostfile(const std::string &path,
                                 std::vector<HostSlots> &hosts,
                                 std::string &error) {
  std::ifstream in(path);
  if (!in) {
    error = "cannot read hostfile '" + path + "'";
    return false;
  }
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    line = line.substr(0, line.find('#'));
    std::istringstream words(line);
    std::string host, word;
    if (!(words >> host))
      continue;
    int slots = 1;
    while (words >> word) {
      std::string where = "hostfile '" + path + "' line " +
                          std::to_string(number) + ": ";
      if (word.rfind("slots=", 0) == 0) {
        slots = parseSlots(word.substr(6));
        if (slots < 0) {
          error = where + "'" + word + "' is not a positive slot count";
          return false;
        }
      } else if (word.rfind("max_slots=", 0) == 0 ||
                 word.rfind("max-slots=", 0) == 0) {
        continue; // pipec never places more ranks than slots
      } else {
        error = where + "unknown field '" + word +
                "' (expected `host [slots=N] [max_slots=M]`)";
        return false;
      }
    }
    addHost(hosts, host, slots);
  }
  if (hosts.empty()) {
    error = "hostfile '" + path + "' names no host";
    return false;
  }
  return true;
}

bool pipec::driver::parseHostList(const std::string &list,
                                  std::vector<HostSlots> &hosts,
                                  std::string &error) {
  std::stringstream items(list);
  std::string item;
  while (std::getline(items, item, ',')) {
    if (item.empty())
      continue;
    std::string host = item;
    int slots = 1;
    if (size_t colon = item.rfind(':'); colon != std::string::npos) {
      host = item.substr(0, colon);
      slots = parseSlots(item.substr(colon + 1));
      if (slots < 0 || host.empty()) {
        error = "--hosts: '" + item + "' is not host or host:slots";
        return false;
      }
    }
    addHost(hosts, host, slots);
  }
  if (hosts.empty()) {
    error = "--hosts names no host";
    return false;
  }
  return true;
}

bool pipec::driver::placeRanks(const std::vector<HostSlots> &hosts,
                               size_t ranks,
                               std::vector<std::string> &hostOfRank,
                               std::string &error) {
  size_t slots = 0;
  for (const HostSlots &h : hosts)
    slots += size_t(h.slots);
  if (slots < ranks) {
    error = "the pipeline has " + std::to_string(ranks) +
            " ranks (one per stage replica) but the hosts give " +
            std::to_string(slots) + " slot" + (slots == 1 ? "" : "s") +
            " on " + std::to_string(hosts.size()) + " host" +
            (hosts.size() == 1 ? "" : "s") + ": add " +
            std::to_string(ranks - slots) + " slot" +
            (ranks - slots == 1 ? "" : "s") +
            " (hostfile `slots=N`, --hosts host:N) or hosts";
    return false;
  }
  hostOfRank.clear();
  for (const HostSlots &h : hosts)
    for (int s = 0; s < h.slots && hostOfRank.size() < ranks; ++s)
      hostOfRank.push_back(h.host);
  return true;
}

bool pipec::driver::isLocalHost(const std::string &host) {
  if (host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1")
    return true;
  // One of this machine's addresses.
  if (struct ifaddrs *addrs = nullptr; getifaddrs(&addrs) == 0) {
    bool mine = false;
    for (struct ifaddrs *a = addrs; a && !mine; a = a->ifa_next) {
      if (!a->ifa_addr || (a->ifa_addr->sa_family != AF_INET &&
                           a->ifa_addr->sa_family != AF_INET6))
        continue;
      char text[INET6_ADDRSTRLEN] = {};
      const void *raw =
          a->ifa_addr->sa_family == AF_INET
              ? static_cast<const void *>(
                    &reinterpret_cast<sockaddr_in *>(a->ifa_addr)->sin_addr)
              : static_cast<const void *>(
                    &reinterpret_cast<sockaddr_in6 *>(a->ifa_addr)->sin6_addr);
      if (inet_ntop(a->ifa_addr->sa_family, raw, text, sizeof(text)))
        mine = host == text;
    }
    freeifaddrs(addrs);
    if (mine)
      return true;
  }
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0)
    return false;
  std::string self = name;
  return host == self || self.rfind(host + ".", 0) == 0 ||
         host.rfind(self + ".", 0) == 0;
}

bool pipec::driver::splitWords(const std::string &text,
                               std::vector<std::string> &words,
                               std::string &error) {
  std::string word;
  bool inWord = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (std::isspace(static_cast<unsigned char>(c))) {
      if (inWord)
        words.push_back(word);
      word.clear();
      inWord = false;
      continue;
    }
    inWord = true;
    if (c == '\\' && i + 1 < text.size()) {
      word += text[++i];
    } else if (c == '\'' || c == '"') {
      size_t close = text.find(c, i + 1);
      if (close == std::string::npos) {
        error = std::string("unclosed ") + c + " in '" + text + "'";
        return false;
      }
      word += text.substr(i + 1, close - i - 1);
      i = close;
    } else {
      word += c;
    }
  }
  if (inWord)
    words.push_back(word);
  return true;
}

std::string pipec::driver::shellQuote(const std::string &s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJ"
                                        "KLMNOPQRSTUVWXYZ0123456789-_./=,:+@%") ==
                        std::string::npos)
    return s;
  std::string q = "'";
  for (char c : s)
    q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::vector<std::string> pipec::driver::exportedEnv() {
  // OPENBLAS_NUM_THREADS when the user set it (else each rank shares its
  // own host's cores among the ranks on that host: runtime core/main.cpp),
  // and every PIPEC_ variable set here: the runtime's switches
  // (PIPEC_CUDA_IPC, PIPEC_CUDNN, PIPEC_MESSAGE_PROGRESS, ...) must be the
  // same on every rank, and OpenMPI passes nothing else to the ranks of
  // other hosts.
  std::vector<std::string> vars;
  if (std::getenv("OPENBLAS_NUM_THREADS"))
    vars.push_back("OPENBLAS_NUM_THREADS");
  std::set<std::string> pipec;
  for (char **e = environ; e && *e; ++e) {
    const std::string entry = *e;
    const size_t eq = entry.find('=');
    if (entry.rfind("PIPEC_", 0) == 0 && eq != std::string::npos)
      pipec.insert(entry.substr(0, eq));
  }
  vars.insert(vars.end(), pipec.begin(), pipec.end());
  return vars;
}

std::vector<std::string> pipec::driver::mpirunCommand(const std::string &mpirun,
                                                      const LaunchPlan &plan,
                                                      bool asRoot) {
  std::vector<std::string> cmd = {mpirun};
  if (plan.hostOfRank.empty())
    cmd.push_back("--oversubscribe"); // this machine's cores, shared
  cmd.insert(cmd.end(), {"--bind-to", "none"});
  if (asRoot)
    cmd.push_back("--allow-run-as-root");
  cmd.insert(cmd.end(), plan.launcherArgs.begin(), plan.launcherArgs.end());
  std::map<std::string, int> slotsOf;
  for (const HostSlots &h : plan.hosts)
    slotsOf[h.host] = h.slots;
  for (size_t i = 0; i < plan.bins.size(); ++i) {
    if (i)
      cmd.push_back(":");
    cmd.insert(cmd.end(), {"-np", "1"});
    // -x belongs to one program of an MPMD line: every rank gets its own
    // (ranks on other hosts see only what is exported to them).
    for (const std::string &var : plan.exportEnv)
      cmd.insert(cmd.end(), {"-x", var});
    if (!plan.hostOfRank.empty()) {
      // The host with all its slots: the contexts on one host share them.
      const std::string &host = plan.hostOfRank[i];
      cmd.insert(cmd.end(),
                 {"--host", host + ":" + std::to_string(slotsOf[host])});
    }
    cmd.push_back(plan.bins[i]);
    cmd.insert(cmd.end(), plan.stageArgs.begin(), plan.stageArgs.end());
  }
  return cmd;
}

std::vector<std::string> pipec::driver::srunCommand(const std::string &srun,
                                                    const LaunchPlan &plan,
                                                    const std::string &configPath,
                                                    std::string &config) {
  config.clear();
  for (size_t i = 0; i < plan.bins.size(); ++i) {
    config += std::to_string(i) + " " + shellQuote(plan.bins[i]);
    for (const std::string &arg : plan.stageArgs)
      config += " " + shellQuote(arg);
    config += "\n";
  }
  // A task that dies ends the step at once (SLURM kills the others), as
  // mpirun ends the job: without it the surviving ranks of a multi-host
  // step wait for the dead one until pipec's watchdog fires (OpenMPI under
  // srun has no daemon that sees the death).
  std::vector<std::string> cmd = {srun, "--ntasks",
                                  std::to_string(plan.bins.size()),
                                  "--kill-on-bad-exit=1"};
  if (!plan.hostOfRank.empty())
    cmd.push_back("--distribution=arbitrary");
  // srun passes the whole environment on (--export=ALL, its default).
  cmd.insert(cmd.end(), plan.launcherArgs.begin(), plan.launcherArgs.end());
  cmd.insert(cmd.end(), {"--multi-prog", configPath});
  return cmd;
}

bool pipec::driver::isLauncherNoise(const std::string &block) {
  static const char *const noise[] = {
      "MPI_ABORT was invoked on rank",
      "Primary job  terminated normally, but",
      "Primary job terminated normally, but",
      "mpirun detected that one or more processes exited with non-zero "
      "status",
  };
  for (const char *phrase : noise)
    if (block.find(phrase) != std::string::npos)
      return true;
  return false;
}

namespace {

/// A line of OpenMPI's help-block delimiters.
bool isDashes(const std::string &line) {
  return line.size() >= 20 &&
         line.find_first_not_of('-') == std::string::npos;
}

/// Error-log lines an abort leaves behind (show_help racing the teardown;
/// the rsh launcher's setpgid on a daemon that already ended; libevent's
/// epoll warning about a closed descriptor).
bool isAbortLogLine(const std::string &line) {
  if (line.find("plm:rsh: Warning: setpgid(") != std::string::npos)
    return true;
  // libevent (inside OpenMPI) on a descriptor the teardown already closed.
  if (line.rfind("[warn] Epoll ", 0) == 0 &&
      line.find("Bad file descriptor") != std::string::npos)
    return true;
  return line.find("ORTE_ERROR_LOG") != std::string::npos &&
         (line.find("show_help") != std::string::npos ||
          line.find("Data unpack would read past end of buffer") !=
              std::string::npos);
}

/// Writes what passes the filter to stderr, a line or a block at a time.
class StderrFilter {
public:
  explicit StderrFilter(LauncherReport *report) : report(report) {}
  bool watchdogSeen() const { return sawWatchdog; }
  /// From now on only the ranks' own lines pass (pipec is stopping the
  /// launcher; what it says while dying is not the user's business).
  void mute() { muted = true; }
  /// Until every rank has joined the job (started()), the launcher's help
  /// blocks are held: if pipec ends the job at the start-up deadline, its
  /// own line says what happened and they are dropped (OpenMPI may report
  /// the rank that exited before MPI_Init in a block of its own, before or
  /// after the deadline, as the machine's load decides); otherwise they
  /// come out when the job starts or ends.
  void holdUntilStarted() { startingUp = true; }
  void started() {
    startingUp = false;
    for (const std::string &text : startBlocks)
      emit(text);
    startBlocks.clear();
  }
  void feed(const char *data, size_t n) {
    pending.append(data, n);
    size_t eol;
    while ((eol = pending.find('\n')) != std::string::npos) {
      line(pending.substr(0, eol + 1));
      pending.erase(0, eol + 1);
    }
  }
  void finish() {
    if (!pending.empty())
      line(pending + "\n");
    pending.clear();
    if (inBlock) // an unterminated block: show it
      emit(block);
    block.clear();
    inBlock = false;
    const bool stoppedAtStart = report && (!report->notStarted.empty() ||
                                           !report->waitingInInit.empty());
    if (!stoppedAtStart)
      for (const std::string &text : startBlocks)
        emit(text);
    startBlocks.clear();
    if (!knownFailure() && !sawWatchdog)
      for (const std::string &text : held)
        emit(text);
    held.clear();
    markTerminatedConsequences();
  }

private:
  /// srun (--kill-on-bad-exit) and mpirun end the other ranks with SIGTERM
  /// after a rank dies, and srun may report those before or after it says
  /// it cancelled the step: once every line is in, beside a death of
  /// another kind, a rank that died of SIGTERM is a consequence, not a
  /// cause.
  void markTerminatedConsequences() {
    if (!report)
      return;
    auto terminated = [](const RankDeath &d) {
      return d.signal == SIGTERM || d.how == "Terminated";
    };
    std::vector<RankDeath> &deaths = report->deaths;
    if (std::any_of(deaths.begin(), deaths.end(), [&](const RankDeath &d) {
          return !d.consequence && !terminated(d);
        }))
      for (RankDeath &d : deaths)
        d.consequence |= terminated(d);
  }

  void line(const std::string &text) {
    std::string bare = text.substr(0, text.find_last_not_of("\r\n") + 1);
    if (muted && bare.find("pipec-rt: ") == std::string::npos)
      return;
    // srun cancels the step after a task's death and reports every task
    // it kills: those deaths are consequences.
    if (bare.find("CANCELLED AT") != std::string::npos &&
        bare.find("*** STEP ") != std::string::npos)
      stepCancelled = true;
    if (RankDeath death; report && parseRankDeath(bare, death)) {
      death.consequence = stepCancelled && !report->deaths.empty();
      report->deaths.push_back(death);
      if (isSrunLine(bare)) {
        held.push_back(text);
        return;
      }
    }
    if (isSrunCleanup(bare) || isTransportConsequence(bare)) {
      held.push_back(text);
      return;
    }
    if (report && bare.find("pipec-rt: error: ") != std::string::npos)
      report->rankReported = true;
    if (isDashes(bare)) {
      if (!inBlock) {
        inBlock = true;
        block = text;
        return;
      }
      block += text;
      if (!isLauncherNoise(block) && !explained(block)) {
        if (startingUp)
          startBlocks.push_back(block);
        else
          emit(block);
      }
      block.clear();
      inBlock = false;
      return;
    }
    if (inBlock) {
      block += text;
      return;
    }
    // Every stalled rank's watchdog fires; held back, made one line of
    // (summarizeWatchdog) when the job has ended.
    if (bare.find("error: watchdog:") != std::string::npos) {
      sawWatchdog = true;
      if (report) {
        report->watchdog.push_back(bare);
        return;
      }
    }
    if (isHelpCounter(bare)) {
      held.push_back(text);
      return;
    }
    if (!isAbortLogLine(bare))
      emit(text);
  }
  /// OpenMPI's TCP transport on a surviving rank when a peer, its host or
  /// the link went away ("mca_btl_tcp_frag_send: writev failed:
  /// Connection reset by peer", or "mca_btl_tcp_endpoint_send_handler]
  /// invalid connection state" from a rank that wrote to the socket of a
  /// killed peer: ranks ignore SIGPIPE, runtime core/main.cpp): a
  /// consequence, held like the others.
  static bool isTransportConsequence(const std::string &line) {
    return line.find("btl_tcp") != std::string::npos &&
           (line.find("writev failed") != std::string::npos ||
            line.find("readv failed") != std::string::npos ||
            line.find("recv failed") != std::string::npos ||
            line.find("Connection reset by peer") != std::string::npos ||
            line.find("Broken pipe") != std::string::npos ||
            line.find("invalid connection state") != std::string::npos);
  }
  static bool isSrunLine(const std::string &line) {
    return line.rfind("srun: ", 0) == 0;
  }
  /// What srun and slurmstepd print while cancelling a step after a task
  /// died: held back like OpenMPI's consequences.
  static bool isSrunCleanup(const std::string &line) {
    return line.find("srun: Job step aborted") != std::string::npos ||
           (line.rfind("slurmstepd", 0) == 0 &&
            (line.find("CANCELLED AT") != std::string::npos ||
             line.find("_errhandler") != std::string::npos)) ||
           line.find("srun: launch/slurm: _step_signal") != std::string::npos ||
           // OpenMPI's shared-memory transport on a rank whose peer died.
           line.find("] Read -1, expected ") != std::string::npos;
  }
  /// A failure pipec reports itself (a rank death, a lost host) is known.
  bool knownFailure() const {
    return report && (!report->deaths.empty() || !report->lostHosts.empty());
  }
  /// "[host:pid] 1 more process has sent help message ..." and its hint,
  /// "N total processes killed (some possibly by mpirun during cleanup)".
  static bool isHelpCounter(const std::string &line) {
    return line.find("total processes killed") != std::string::npos ||
           line.find("total process killed") != std::string::npos ||
           line.find("more process has sent help message") !=
               std::string::npos ||
           line.find("more processes have sent help message") !=
               std::string::npos ||
           line.find("orte_base_help_aggregate") != std::string::npos;
  }
  /// Blocks pipec replaces by its own line: a lost daemon (recorded), and
  /// the consequences of a failure already known (peers hanging up).
  bool explained(const std::string &text) {
    if (text.find("ORTE has lost communication with a remote daemon") !=
        std::string::npos) {
      size_t at = text.find("Remote daemon:");
      size_t on = at == std::string::npos ? at : text.find(" on node ", at);
      if (report && on != std::string::npos) {
        size_t end = text.find_first_of(" \r\n", on + 9);
        report->lostHosts.push_back(text.substr(on + 9, end - on - 9));
        return true;
      }
      return false;
    }
    // Daemons that did not start: pipec train says so in one line (the
    // launcher's own message about the host, e.g. ssh's, is above it).
    if (report && text.find("ORTE was unable to reliably start one or more "
                            "daemons") != std::string::npos) {
      report->daemonsFailed = true;
      return true;
    }
    // A rank's death: recorded (line()), reported by pipec train.
    if (report && text.find("mpirun noticed that process rank ") !=
                      std::string::npos)
      return true;
    // Peers hanging up are the consequence of a failure that may be
    // reported only after them: held until the end, shown only if pipec
    // has no explanation of its own.
    static const char *const consequences[] = {
        "peer process has unexpectedly disconnected", "peer hung up",
        "failed to TCP connect to a peer MPI process"};
    if (std::any_of(std::begin(consequences), std::end(consequences),
                    [&](const char *phrase) {
                      return text.find(phrase) != std::string::npos;
                    })) {
      held.push_back(text);
      return true;
    }
    return false;
  }
  std::vector<std::string> held;
  static void emit(const std::string &text) {
    std::fwrite(text.data(), 1, text.size(), stderr);
    std::fflush(stderr);
  }

  std::string pending, block;
  std::vector<std::string> startBlocks; ///< held until the job started
  bool inBlock = false, sawWatchdog = false, muted = false,
       stepCancelled = false, startingUp = false;
  LauncherReport *report;
};

} // namespace

/// srun's "srun: error: HOST: task N: REASON" (Killed, Segmentation
/// fault, Aborted, Terminated, Exited with exit code X).
static bool parseSrunTaskDeath(const std::string &line, RankDeath &death) {
  const std::string lead = "srun: error: ";
  if (line.rfind(lead, 0) != 0)
    return false;
  size_t task = line.find(": task ", lead.size());
  if (task == std::string::npos)
    return false;
  death.host = line.substr(lead.size(), task - lead.size());
  const char *digits = line.c_str() + task + 7;
  char *end = nullptr;
  long rank = std::strtol(digits, &end, 10);
  if (end == digits || *end != ':')
    return false;
  death.rank = int(rank);
  death.how = std::string(end + 1);
  death.how.erase(0, death.how.find_first_not_of(' '));
  static const std::pair<const char *, int> signals[] = {
      {"Killed", 9},
      {"Segmentation fault", 11},
      {"Aborted", 6},
      {"Terminated", 15},
      {"Bus error", 7}};
  for (auto [name, number] : signals)
    if (death.how.rfind(name, 0) == 0)
      death.signal = number;
  return true;
}

bool pipec::driver::parseRankDeath(const std::string &line, RankDeath &death) {
  if (parseSrunTaskDeath(line, death))
    return true;
  // mpirun noticed that process rank 2 with PID 4892 on node 10.0.0.3
  // exited on signal 9 (Killed).
  const std::string lead = "mpirun noticed that process rank ";
  size_t at = line.find(lead);
  if (at == std::string::npos)
    return false;
  std::istringstream in(line.substr(at + lead.size()));
  std::string with, pid, word, on, node, host;
  if (!(in >> death.rank >> with >> pid >> word >> on >> node >> host) ||
      on != "on" || node != "node")
    return false;
  death.host = host;
  std::string rest;
  std::getline(in, rest);
  size_t first = rest.find_first_not_of(' ');
  death.how = first == std::string::npos ? "" : rest.substr(first);
  if (!death.how.empty() && death.how.back() == '.')
    death.how.pop_back();
  if (size_t sig = death.how.find("signal "); sig != std::string::npos)
    death.signal = std::atoi(death.how.c_str() + sig + 7);
  return true;
}

namespace {
/// The signal pipec got while an InterruptsNoted lived (0: none).
volatile std::sig_atomic_t launcherInterrupt = 0;
void noteInterrupt(int signal) { launcherInterrupt = signal; }
int interruptsDepth = 0;
struct sigaction savedActions[3];
constexpr int kInterruptSignals[3] = {SIGINT, SIGTERM, SIGHUP};

/// The ranks of `start` without a status record yet, split into those
/// that started the runtime (a marker: waiting in MPI_Init) and those that
/// never did.
void ranksNotStarted(const StartWatch &start, std::vector<int> &never,
                     std::vector<int> &waiting) {
  never.clear();
  waiting.clear();
  for (size_t r = 0; r < start.ranks; ++r) {
    if (::access(rankStatusPath(start.statusDir, r).c_str(), F_OK) == 0)
      continue;
    (::access(rankStatusPath(start.statusDir, r, "started").c_str(), F_OK) == 0
         ? waiting
         : never)
        .push_back(int(r));
  }
}
} // namespace

std::string pipec::driver::rankStatusPath(const std::string &statusDir,
                                          size_t rank, const char *kind) {
  return statusDir + "/rank-" + std::to_string(rank) + "." + kind;
}

std::string pipec::driver::rankName(int rank,
                                    const std::vector<int> &stageOfRank) {
  std::string name = "rank " + std::to_string(rank);
  if (rank >= 0 && size_t(rank) < stageOfRank.size())
    name += " (stage " + std::to_string(stageOfRank[size_t(rank)]) + ")";
  return name;
}

InterruptsNoted::InterruptsNoted() {
  if (interruptsDepth++ > 0)
    return; // an outer one holds them (and what was noted)
  launcherInterrupt = 0;
  struct sigaction action = {};
  action.sa_handler = noteInterrupt;
  sigemptyset(&action.sa_mask);
  for (size_t i = 0; i < 3; ++i)
    ::sigaction(kInterruptSignals[i], &action, &savedActions[i]);
}

InterruptsNoted::~InterruptsNoted() {
  if (--interruptsDepth > 0)
    return;
  for (size_t i = 0; i < 3; ++i)
    ::sigaction(kInterruptSignals[i], &savedActions[i], nullptr);
}

int InterruptsNoted::signal() { return int(launcherInterrupt); }

int pipec::driver::runLauncher(const std::vector<std::string> &cmd,
                               LauncherReport *report, double graceSeconds,
                               const StartWatch *start) {
  InterruptsNoted interrupts;
  std::fflush(stdout);
  std::fflush(stderr);
  int fds[2];
  if (cmd.empty() || ::pipe(fds) != 0) {
    std::fprintf(stderr, "pipec: error: cannot run the launcher: %s\n",
                 std::strerror(errno));
    return -1;
  }
  pid_t pid = ::fork();
  if (pid < 0) {
    std::fprintf(stderr, "pipec: error: cannot run %s: %s\n", cmd[0].c_str(),
                 std::strerror(errno));
    ::close(fds[0]);
    ::close(fds[1]);
    return -1;
  }
  if (pid == 0) {
    ::dup2(fds[1], STDERR_FILENO);
    ::close(fds[0]);
    ::close(fds[1]);
    std::vector<char *> argv;
    for (const std::string &arg : cmd)
      argv.push_back(const_cast<char *>(arg.c_str()));
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    std::fprintf(stderr, "pipec: error: cannot run %s: %s\n", cmd[0].c_str(),
                 std::strerror(errno));
    ::_exit(127);
  }
  ::close(fds[1]);
  StderrFilter filter(report);
  char buffer[4096];
  using Clock = std::chrono::steady_clock;
  std::optional<Clock::time_point> stopAt, killAt, drainUntil;
  const Clock::time_point launched = Clock::now();
  bool allStarted = !start || start->ranks == 0;
  if (!allStarted)
    filter.holdUntilStarted();
  int status = 0;
  bool exited = false;
  int interrupted = 0;
  for (;;) {
    struct pollfd pfd = {fds[0], POLLIN, 0};
    int ready = ::poll(&pfd, 1, 200);
    if (ready < 0 && errno != EINTR)
      break;
    if (ready > 0) {
      ssize_t n = ::read(fds[0], buffer, sizeof(buffer));
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0)
        break; // every writer closed its end
      filter.feed(buffer, size_t(n));
    }
    Clock::time_point now = Clock::now();
    if (!exited && ::waitpid(pid, &status, WNOHANG) == pid) {
      exited = true;
      // Ranks orphaned on this host may hold the pipe; read what is left.
      drainUntil = now + std::chrono::seconds(2);
    }
    if (drainUntil && now > *drainUntil)
      break;
    // pipec was told to stop (the launcher may have died of the same
    // signal already): it ends the ranks (SIGTERM through the launcher),
    // then pipec cleans up (its status folder) and exits 128 + the signal.
    if (launcherInterrupt && !interrupted) {
      interrupted = launcherInterrupt;
      filter.mute();
      if (!exited) {
        ::kill(pid, SIGTERM);
        killAt = now + std::chrono::seconds(5);
      }
    }
    if (exited)
      continue;
    // A rank that never joined: the others wait in MPI_Init for ever.
    if (!allStarted && !killAt) {
      std::vector<int> never, waiting;
      ranksNotStarted(*start, never, waiting);
      allStarted = never.empty() && waiting.empty();
      if (allStarted)
        filter.started();
      if (!allStarted &&
          now - launched > std::chrono::duration<double>(start->seconds)) {
        if (report) {
          report->notStarted = never;
          report->waitingInInit = waiting;
        }
        filter.mute();
        ::kill(pid, SIGTERM);
        killAt = now + std::chrono::seconds(3);
      }
    }
    // A watchdog fired: the ranks end on their own; a launcher that waits
    // for a host it cannot reach is stopped after the grace period.
    if (filter.watchdogSeen() && !stopAt)
      stopAt = now + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(graceSeconds));
    if (stopAt && !killAt && now > *stopAt) {
      filter.mute();
      ::kill(pid, SIGTERM);
      killAt = now + std::chrono::seconds(3);
      if (report)
        report->stopped = true;
    }
    if (killAt && now > *killAt)
      ::kill(pid, SIGKILL);
  }
  filter.finish();
  ::close(fds[0]);
  if (!exited)
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  if (!interrupted)
    interrupted = launcherInterrupt;
  if (interrupted) {
    if (report)
      report->interrupted = interrupted;
    return 128 + interrupted;
  }
  if (report && (!report->notStarted.empty() || !report->waitingInInit.empty()))
    return 1;
  if (report && report->stopped)
    return kWatchdogStatus;
  if (WIFEXITED(status))
    return WEXITSTATUS(status);
  if (WIFSIGNALED(status))
    return 128 + WTERMSIG(status);
  return -1;
}

std::string
pipec::driver::summarizeWatchdog(const std::vector<std::string> &lines,
                                 const std::vector<int> &stageOfRank) {
  if (lines.empty())
    return "";
  // "... watchdog: rank X (stage S, host H) made no progress for N s in step
  // T, waiting for rank Y (stage S2, host H2) to send ...; the last
  // complete checkpoint is C; ..."
  auto rankAfter = [](const std::string &line, const std::string &lead,
                      std::string &desc) -> int {
    size_t at = line.find(lead);
    if (at == std::string::npos)
      return -1;
    at += lead.size();
    size_t close = line.find(')', at);
    desc = line.substr(at, close == std::string::npos ? 0 : close + 1 - at);
    return std::atoi(line.c_str() + at + 5); // after "rank "
  };
  std::map<int, std::string> reporters, waitedFor;
  std::map<int, std::vector<int>> waiters;
  std::string step, seconds, checkpoint;
  for (const std::string &line : lines) {
    std::string me, them;
    int x = rankAfter(line, "watchdog: ", me);
    if (x < 0)
      continue;
    reporters[x] = me;
    int y = rankAfter(line, "waiting for ", them);
    if (y >= 0 && them.rfind("rank ", 0) == 0) {
      waitedFor[y] = them;
      waiters[y].push_back(x);
    }
    auto field = [&](const std::string &lead, const std::string &end,
                     std::string &out) {
      size_t at = line.find(lead);
      if (at == std::string::npos || !out.empty())
        return;
      at += lead.size();
      out = line.substr(at, line.find(end, at) - at);
    };
    field("made no progress for ", " s", seconds);
    field(" in step ", ",", step);
    field("the last complete checkpoint is ", ";", checkpoint);
  }
  for (auto &[y, desc] : waitedFor) {
    if (reporters.count(y))
      continue;
    std::string who;
    std::sort(waiters[y].begin(), waiters[y].end());
    for (int x : waiters[y])
      who += (who.empty() ? "" : ", ") + std::to_string(x);
    return "pipec: error: " + desc + " stopped answering in step " + step +
           ": rank" + (waiters[y].size() > 1 ? "s " : " ") + who +
           " waited " + seconds + " s for it (the rank, its host or the "
           "link to it is lost); the last complete checkpoint is " +
           checkpoint + "; the job was stopped (--watchdog-s)";
  }
  std::vector<std::string> silent;
  for (size_t r = 0; r < stageOfRank.size(); ++r)
    if (!reporters.count(int(r)))
      silent.push_back(rankName(int(r), stageOfRank));
  if (silent.empty() || silent.size() == stageOfRank.size())
    return lines.front();
  std::string list;
  for (const std::string &s : silent)
    list += (list.empty() ? "" : ", ") + s;
  return lines.front() + "\npipec: note: " + list +
         " had made no watchdog report when the job was stopped: stalled "
         "(stopped, or stuck outside the runtime), or blocked later than "
         "the others";
}
