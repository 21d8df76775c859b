//===- planners_bench.cpp - Planning time at paper scale ------------------===//
//
// Issue 3's planning-time benchmark: a 1,000-layer chain (jittered
// transformer-like layers) on 1,024 devices as 128 nodes x 8 (NVLink-class
// inside a node, InfiniBand-class between nodes, 80 GiB per device). Every
// planner of plannerNames() is timed through runPlanner; pipedream and
// dapple also on smaller shapes to show how the time grows.
//
//   planners_bench [--benchmark_filter=pipedream]
//
// Each benchmark reports the wall time of one planning call and, as
// counters, the plan's stages, devices used and predicted samples/s (0 when
// the planner failed; the error is the skip message).
//
//===----------------------------------------------------------------------===//

#include "pipec/Planners.h"
#include "pipec/Sim.h"

#include <algorithm>

#include <benchmark/benchmark.h>

#include <cstdlib>
#include <fstream>
#include <random>
#include <string>

using namespace pipec;

namespace {

Profile chainProfile(int layers) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> jitter(0.8, 1.2);
  Profile profile;
  profile.device = "h100";
  profile.microbatch = 1;
  for (int l = 0; l < layers; ++l) {
    ProfileOp op;
    op.name = "layer" + std::to_string(l);
    op.op = "TransformerLayer";
    op.fwdSeconds = 1e-3 * jitter(rng);
    op.bwdSeconds = 2e-3 * jitter(rng);
    op.paramBytes = static_cast<int64_t>(2e7 * jitter(rng));
    op.outBytes = static_cast<int64_t>(4e6 * jitter(rng));
    op.savedBytes = op.outBytes * 4;
    profile.ops.push_back(op);
  }
  return profile;
}

Topology cluster(int nodes, int perNode) {
  Topology topology;
  topology.deviceMemoryBytes = 80LL << 30;
  TopologyLevel node{"node", perNode, 3e11, 5e-6};
  TopologyLevel net{"cluster", nodes, 2.5e10, 1e-5};
  topology.levels = {node, net};
  return topology;
}

void runOne(benchmark::State &state, const std::string &planner, int layers,
            int nodes, int perNode) {
  Profile profile = chainProfile(layers);
  Topology topology = cluster(nodes, perNode);
  PlannerOptions options;
  if (planner == "dapple" || planner == "balanced")
    options.globalBatch = 2048;
  PlanResult result;
  for (auto _ : state) {
    result = runPlanner(planner, profile, topology, options);
    benchmark::DoNotOptimize(result);
  }
  if (!result.ok) {
    state.SkipWithError(result.error.c_str());
    return;
  }
  // Devices: the replicas of every stage, counted once per device position
  // (an interleaved plan's device holds `chunks` of its p*v stages).
  int devices = 0;
  for (const StagePlan &stage : result.plan.stages)
    devices += stage.replicas;
  devices /= std::max(1, result.plan.chunks);
  state.counters["stages"] = result.plan.numStages();
  state.counters["devices"] = devices;
  state.counters["samples_per_s"] = result.plan.predicted.samplesPerSecond;
}

/// `pipec plan --algorithm NAME` on the shape (see registerAll);
/// `baseline`: auto without lane collapsing and without skipping.
void runCommand(benchmark::State &state, const std::string &name,
                bool baseline) {
  Profile profile = chainProfile(1000);
  Topology topology = cluster(128, 8);
  PlannerOptions options;
  double rate = 0;
  for (auto _ : state) {
    rate = 0;
    if (name == "auto" && !baseline) {
      AutoPlanResult result = planAuto(profile, topology, options);
      rate = result.ok ? result.best.predicted.samplesPerSecond : 0;
      continue;
    }
    std::vector<std::string> names = {name};
    if (baseline)
      names = {"balanced", "pipedream", "dapple",
               "madpipe",  "twobw",     "interleaved"};
    for (const std::string &planner : names) {
      PlanResult planned = runPlanner(planner, profile, topology, options);
      if (!planned.ok)
        continue;
      SimOptions sim;
      sim.splitReplicas = planner == "dapple";
      sim.collapseLanes = !baseline;
      SimResult result = simulatePlan(profile, topology, planned.plan, sim);
      if (result.ok && result.fitsMemory)
        rate = std::max(rate, result.samplesPerSecond);
    }
  }
  state.counters["samples_per_s"] = rate;
}

void registerAll() {
  // The shape, every planner.
  for (const std::string &name : plannerNames()) {
    if (name == "exhaustive" || name == "auto")
      continue; // brute force refuses; auto is the sum of the others
    benchmark::RegisterBenchmark(
        ("plan/" + name + "/1000x(128x8)").c_str(),
        [name](benchmark::State &state) { runOne(state, name, 1000, 128, 8); })
        ->Unit(benchmark::kMillisecond)
        ->Iterations(1)
        ->Repetitions(3)
        ->ReportAggregatesOnly(true);
  }
  // What `pipec plan --algorithm NAME` computes: the planner, then one
  // simulation of its plan (for auto, the search over every planner's plan
  // and variants, skipping the flush plans that cannot win).
  for (const std::string &name : plannerNames()) {
    if (name == "exhaustive")
      continue;
    benchmark::RegisterBenchmark(
        ("command/" + name + "/1000x(128x8)").c_str(),
        [name](benchmark::State &state) { runCommand(state, name, false); })
        ->Unit(benchmark::kMillisecond)
        ->Iterations(1)
        ->Repetitions(3)
        ->ReportAggregatesOnly(true);
  }
  // The baseline of the ratio: every planner's plan simulated in full,
  // every lane of every replicated stage (SimOptions::collapseLanes off).
  benchmark::RegisterBenchmark(
      "command/auto-baseline-every-plan-every-lane/1000x(128x8)",
      [](benchmark::State &state) { runCommand(state, "auto", true); })
      ->Unit(benchmark::kMillisecond)
      ->Iterations(1);
  // Growth of pipedream and dapple with the instance.
  for (const char *name : {"pipedream", "dapple"})
    for (auto [layers, nodes] : {std::pair{100, 16}, std::pair{300, 32},
                                 std::pair{1000, 64}, std::pair{1000, 128}})
      benchmark::RegisterBenchmark(("scale/" + std::string(name) + "/" +
                                    std::to_string(layers) + "x(" +
                                    std::to_string(nodes) + "x8)")
                                       .c_str(),
                                   [name = std::string(name), layers = layers,
                                    nodes = nodes](benchmark::State &state) {
                                     runOne(state, name, layers, nodes, 8);
                                   })
          ->Unit(benchmark::kMillisecond)
          ->Iterations(1);
}

} // namespace

int main(int argc, char **argv) {
  // PIPEC_BENCH_INSTANCE=DIR writes the paper-scale instance as
  // DIR/profile.json and DIR/topology.json (to time `pipec plan` itself on it)
  // and exits.
  if (const char *dir = std::getenv("PIPEC_BENCH_INSTANCE")) {
    std::ofstream(std::string(dir) + "/profile.json")
        << profileToJson(chainProfile(1000));
    std::ofstream(std::string(dir) + "/topology.json")
        << topologyToJson(cluster(128, 8));
    return 0;
  }
  registerAll();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
