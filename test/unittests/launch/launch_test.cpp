//===- launch_test.cpp - hosts, placement and launcher lines --------------===//
//
// tools/pipec/Launch.cpp: hostfiles and --hosts, one rank per slot, the
// mpirun and srun lines, the shell-word splitting of --launcher-args and the
// filter of OpenMPI's banners.
//
//===----------------------------------------------------------------------===//
#include "Launch.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>

#include <cstdio>
#include <fstream>

using namespace pipec::driver;

namespace {

std::string writeTemp(const std::string &text) {
  char name[] = "/tmp/pipec-launch-test-XXXXXX";
  int fd = mkstemp(name);
  EXPECT_GE(fd, 0);
  std::ofstream(name) << text;
  close(fd);
  return name;
}

std::string joined(const std::vector<std::string> &words) {
  std::string s;
  for (const std::string &w : words)
    s += (s.empty() ? "" : " ") + w;
  return s;
}

} // namespace

TEST(Hostfile, SlotsCommentsAndRepeats) {
  std::string path = writeTemp("# the lab\n"
                               "n1 slots=2   # two GPUs\n"
                               "\n"
                               "n2\n"
                               "n3 slots=1 max_slots=4\n"
                               "n1 slots=1\n");
  std::vector<HostSlots> hosts;
  std::string error;
  ASSERT_TRUE(readHostfile(path, hosts, error)) << error;
  ASSERT_EQ(hosts.size(), 3u);
  EXPECT_EQ(hosts[0].host, "n1");
  EXPECT_EQ(hosts[0].slots, 3); // listed twice: 2 + 1
  EXPECT_EQ(hosts[1].slots, 1); // no slots=: one rank
  EXPECT_EQ(hosts[2].slots, 1);
  std::remove(path.c_str());
}

TEST(Hostfile, BadLinesAreNamed) {
  std::vector<HostSlots> hosts;
  std::string error;
  std::string path = writeTemp("n1 slots=2\nn2 slots=zero\n");
  EXPECT_FALSE(readHostfile(path, hosts, error));
  EXPECT_NE(error.find("line 2"), std::string::npos) << error;
  EXPECT_NE(error.find("slots=zero"), std::string::npos) << error;
  std::remove(path.c_str());
  hosts.clear();
  path = writeTemp("n1 cpus=4\n");
  EXPECT_FALSE(readHostfile(path, hosts, error));
  EXPECT_NE(error.find("unknown field 'cpus=4'"), std::string::npos) << error;
  std::remove(path.c_str());
  hosts.clear();
  path = writeTemp("# nothing\n");
  EXPECT_FALSE(readHostfile(path, hosts, error));
  EXPECT_NE(error.find("names no host"), std::string::npos) << error;
  std::remove(path.c_str());
  EXPECT_FALSE(readHostfile("/nonexistent/hosts", hosts, error));
  EXPECT_NE(error.find("cannot read hostfile"), std::string::npos);
}

TEST(HostList, SlotsAndErrors) {
  std::vector<HostSlots> hosts;
  std::string error;
  ASSERT_TRUE(parseHostList("a:2,b,10.0.0.3:4", hosts, error)) << error;
  ASSERT_EQ(hosts.size(), 3u);
  EXPECT_EQ(hosts[0].slots, 2);
  EXPECT_EQ(hosts[1].slots, 1);
  EXPECT_EQ(hosts[2].host, "10.0.0.3");
  EXPECT_EQ(hosts[2].slots, 4);
  hosts.clear();
  EXPECT_FALSE(parseHostList("a:0", hosts, error));
  EXPECT_NE(error.find("'a:0'"), std::string::npos);
  hosts.clear();
  EXPECT_FALSE(parseHostList(":3", hosts, error));
  hosts.clear();
  EXPECT_FALSE(parseHostList(",", hosts, error));
}

TEST(Placement, OneRankPerSlotInOrder) {
  std::vector<std::string> where;
  std::string error;
  ASSERT_TRUE(placeRanks({{"a", 2}, {"b", 1}, {"c", 3}}, 4, where, error));
  EXPECT_EQ(joined(where), "a a b c");
  EXPECT_FALSE(placeRanks({{"a", 2}, {"b", 1}}, 4, where, error));
  EXPECT_NE(error.find("4 ranks"), std::string::npos) << error;
  EXPECT_NE(error.find("3 slots on 2 hosts"), std::string::npos) << error;
  EXPECT_NE(error.find("add 1 slot "), std::string::npos) << error;
}

TEST(LauncherArgs, ShellWords) {
  std::vector<std::string> words;
  std::string error;
  ASSERT_TRUE(splitWords("--mca btl tcp,self  --x 'a b' \"c d\" e\\ f", words,
                         error));
  EXPECT_EQ(words, (std::vector<std::string>{"--mca", "btl", "tcp,self", "--x",
                                             "a b", "c d", "e f"}));
  words.clear();
  EXPECT_FALSE(splitWords("--x 'open", words, error));
  words.clear();
  ASSERT_TRUE(splitWords("", words, error));
  EXPECT_TRUE(words.empty());
}

TEST(MpirunLine, LocalOversubscribesPlacedDoesNot) {
  LaunchPlan plan;
  plan.bins = {"/o/stage0", "/o/stage1", "/o/stage2"};
  plan.stageArgs = {"--steps", "2"};
  std::string local = joined(mpirunCommand("mpirun", plan, false));
  EXPECT_EQ(local, "mpirun --oversubscribe --bind-to none -np 1 /o/stage0 "
                   "--steps 2 : -np 1 /o/stage1 --steps 2 : -np 1 /o/stage2 "
                   "--steps 2");
  plan.hosts = {{"a", 2}, {"b", 1}};
  plan.hostOfRank = {"a", "a", "b"};
  plan.launcherArgs = {"--mca", "btl", "tcp,self"};
  plan.exportEnv = {"OPENBLAS_NUM_THREADS"};
  std::string placed = joined(mpirunCommand("mpirun", plan, true));
  EXPECT_EQ(placed,
            "mpirun --bind-to none --allow-run-as-root --mca btl tcp,self "
            "-np 1 -x OPENBLAS_NUM_THREADS --host a:2 /o/stage0 --steps 2 : "
            "-np 1 -x OPENBLAS_NUM_THREADS --host a:2 /o/stage1 --steps 2 : "
            "-np 1 -x OPENBLAS_NUM_THREADS --host b:1 /o/stage2 --steps 2");
}

TEST(MpirunLine, ExportsEveryPipecVariable) {
  // The runtime's switches reach the ranks of every host (OpenMPI passes
  // only what -x names to other hosts); other variables stay out.
  const char *blas = std::getenv("OPENBLAS_NUM_THREADS");
  const std::string blasWas = blas ? blas : "";
  setenv("PIPEC_CUDA_IPC", "1", 1);
  setenv("PIPEC_CUDNN", "0", 1);
  setenv("PIPECX_NOT_OURS", "1", 1);
  unsetenv("OPENBLAS_NUM_THREADS");
  std::vector<std::string> vars = exportedEnv();
  EXPECT_NE(std::find(vars.begin(), vars.end(), "PIPEC_CUDA_IPC"), vars.end());
  EXPECT_NE(std::find(vars.begin(), vars.end(), "PIPEC_CUDNN"), vars.end());
  EXPECT_EQ(std::find(vars.begin(), vars.end(), "PIPECX_NOT_OURS"), vars.end());
  EXPECT_EQ(std::find(vars.begin(), vars.end(), "OPENBLAS_NUM_THREADS"),
            vars.end());
  setenv("OPENBLAS_NUM_THREADS", "1", 1);
  vars = exportedEnv();
  ASSERT_FALSE(vars.empty());
  EXPECT_EQ(vars.front(), "OPENBLAS_NUM_THREADS");
  for (const char *v : {"PIPEC_CUDA_IPC", "PIPEC_CUDNN", "PIPECX_NOT_OURS",
                        "OPENBLAS_NUM_THREADS"})
    unsetenv(v);
  if (blas)
    setenv("OPENBLAS_NUM_THREADS", blasWas.c_str(), 1);
}

TEST(SrunLine, MultiProgFile) {
  LaunchPlan plan;
  plan.bins = {"/o/stage0", "/o/my stage1"};
  plan.stageArgs = {"--steps", "2"};
  std::string config;
  std::string line = joined(srunCommand("srun", plan, "/o/conf", config));
  EXPECT_EQ(line, "srun --ntasks 2 --kill-on-bad-exit=1 --multi-prog /o/conf");
  EXPECT_EQ(config, "0 /o/stage0 --steps 2\n1 '/o/my stage1' --steps 2\n");
  plan.hostOfRank = {"a", "b"};
  line = joined(srunCommand("srun", plan, "/o/conf", config));
  EXPECT_EQ(line,
            "srun --ntasks 2 --kill-on-bad-exit=1 --distribution=arbitrary "
            "--multi-prog /o/conf");
}

TEST(LauncherOutput, BannersAfterAnAbortAreNoise) {
  EXPECT_TRUE(isLauncherNoise("----\nMPI_ABORT was invoked on rank 0 in "
                              "communicator MPI_COMM_WORLD\n----\n"));
  EXPECT_TRUE(isLauncherNoise("Primary job  terminated normally, but 1 "
                              "process returned\n"));
  EXPECT_FALSE(isLauncherNoise("There are not enough slots available in the "
                               "system to satisfy the 4\nslots"));
  EXPECT_FALSE(isLauncherNoise("ORTE was unable to reliably start one or more "
                               "daemons."));
}

TEST(LocalHost, Names) {
  EXPECT_TRUE(isLocalHost("localhost"));
  EXPECT_TRUE(isLocalHost("127.0.0.1"));
  EXPECT_FALSE(isLocalHost("10.213.0.2"));
  EXPECT_FALSE(isLocalHost("node-that-is-not-here.example"));
}

TEST(LauncherOutput, RankDeathsAreRead) {
  RankDeath d;
  ASSERT_TRUE(parseRankDeath("mpirun noticed that process rank 2 with PID 4892 "
                             "on node 10.213.13.3 exited on signal 9 (Killed).",
                             d));
  EXPECT_EQ(d.rank, 2);
  EXPECT_EQ(d.host, "10.213.13.3");
  EXPECT_EQ(d.how, "exited on signal 9 (Killed)");
  EXPECT_FALSE(parseRankDeath("mpirun noticed that the job aborted", d));
  EXPECT_FALSE(parseRankDeath("pipec-rt: error: rank 2", d));
  // srun (slurm 22.05).
  RankDeath s;
  ASSERT_TRUE(parseRankDeath("srun: error: node-7: task 3: Killed", s));
  EXPECT_EQ(s.rank, 3);
  EXPECT_EQ(s.host, "node-7");
  EXPECT_EQ(s.how, "Killed");
  EXPECT_EQ(s.signal, 9);
  RankDeath e;
  ASSERT_TRUE(
      parseRankDeath("srun: error: vm: task 0: Exited with exit code 1", e));
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.signal, 0);
  RankDeath g;
  ASSERT_TRUE(
      parseRankDeath("srun: error: vm: task 12: Segmentation fault", g));
  EXPECT_EQ(g.signal, 11);
  EXPECT_FALSE(parseRankDeath("srun: error: Unable to allocate resources", g));
  EXPECT_FALSE(parseRankDeath("srun: error: vm: task x: Killed", g));
}

TEST(Watchdog, SummaryNamesTheRankNobodyHearsFrom) {
  // Rank 0 waits for 1, ranks 1 and 3 wait for 2; 2 said nothing.
  std::vector<std::string> lines = {
      "pipec-rt: error: watchdog: rank 0 (stage 0, host h0) made no progress "
      "for 5 s in step 7, waiting for rank 1 (stage 1, host h1) to send "
      "microbatch 0 on channel 1: that rank, its host or the link to it is "
      "lost or stopped; the last complete checkpoint is /r/step-000004; "
      "stopping the job (--watchdog-s) (rank 0, stage 0, step 7)",
      "pipec-rt: error: watchdog: rank 3 (stage 3, host h3) made no progress "
      "for 5 s in step 7, waiting for rank 2 (stage 2, host h2) to send "
      "microbatch 1 on channel 4: ...; the last complete checkpoint is "
      "/r/step-000004; stopping the job (--watchdog-s) (rank 3, stage 3, "
      "step 7)",
      "pipec-rt: error: watchdog: rank 1 (stage 1, host h1) made no progress "
      "for 6 s in step 7, waiting for rank 2 (stage 2, host h2) to send "
      "microbatch 1 on channel 3: ...; the last complete checkpoint is "
      "/r/step-000004; stopping the job (--watchdog-s) (rank 1, stage 1, "
      "step 7)"};
  std::string line = summarizeWatchdog(lines);
  EXPECT_EQ(line, "pipec: error: rank 2 (stage 2, host h2) stopped answering "
                  "in step 7: ranks 1, 3 waited 5 s for it (the rank, its "
                  "host or the link to it is lost); the last complete "
                  "checkpoint is /r/step-000004; the job was stopped "
                  "(--watchdog-s)");
  // A collective: nobody names a peer; the first line as it is.
  std::vector<std::string> collective = {
      "pipec-rt: error: watchdog: rank 0 (stage 0, host h0) made no progress "
      "for 5 s in step 2, waiting in a collective (...)"};
  EXPECT_EQ(summarizeWatchdog(collective), collective[0]);
  EXPECT_EQ(summarizeWatchdog({}), "");
  // With the job's ranks: those that reported nothing are named.
  EXPECT_EQ(summarizeWatchdog(collective, {0, 1, 1}),
            collective[0] + "\npipec: note: rank 1 (stage 1), rank 2 (stage "
                            "1) had made no watchdog report when the job was "
                            "stopped: stalled (stopped, or stuck outside the "
                            "runtime), or blocked later than the others");
  // Everyone reported: no note.
  EXPECT_EQ(summarizeWatchdog(collective, {0}), collective[0]);
}
