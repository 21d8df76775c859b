//===- synth_test.cpp - The schedule synthesiser --------------------------===//
//
// On every profile of examples/profiles (balanced split over 4 and 8
// devices of a free network) and two memory limits (1F1B's in-flight depth
// p - s, and zb-h1's p on every stage), the synthesised schedule is
// deadlock free, within the limit, and simulated no slower than the best
// fixed schedule (gpipe, 1f1b-flush A/B, zb-h1) that fits the same limit.
//
//===----------------------------------------------------------------------===//

#include "pipec/Planners.h"
#include "pipec/Sim.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

using namespace pipec;
namespace fs = std::filesystem;

namespace {

Profile load(const fs::path &path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  ProfileResult parsed = profileFromJson(text.str());
  EXPECT_TRUE(parsed.ok) << path << ": " << parsed.error;
  return parsed.profile;
}

/// The fastest fixed schedule within `caps`, simulated.
double bestFixed(const Profile &profile, const Topology &topology, Plan plan,
                 const std::vector<int64_t> &caps) {
  double best = std::numeric_limits<double>::infinity();
  struct F {
    const char *name;
    WarmupPolicy warmup;
  };
  for (F f : {F{"gpipe", WarmupPolicy::A}, F{"1f1b-flush", WarmupPolicy::A},
              F{"1f1b-flush", WarmupPolicy::B}, F{"zb-h1", WarmupPolicy::A}}) {
    plan.schedule = f.name;
    ScheduleOptions o;
    o.warmup = f.warmup;
    ScheduleResult s = generateSchedule(*parseScheduleKind(f.name),
                                        plan.numStages(), plan.microbatches, o);
    bool fits = s.ok;
    for (const RankSchedule &r : s.ranks)
      fits &= peakInflight(r.schedule.flatten()) <= caps[size_t(r.stage)];
    if (!fits)
      continue;
    SimOptions options;
    options.warmupPolicy = f.warmup;
    SimResult sim = simulatePlan(profile, topology, plan, options);
    EXPECT_TRUE(sim.ok) << sim.error;
    best = std::min(best, sim.iterationSeconds);
  }
  return best;
}

} // namespace

TEST(Synth, NeverSlowerThanTheBestFixedScheduleWithinTheLimit) {
  const fs::path dir = fs::path(PIPEC_SOURCE_DIR) / "examples" / "profiles";
  int compared = 0, faster = 0;
  for (const auto &entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".json")
      continue;
    Profile profile = load(entry.path());
    for (int p : {4, 8}) {
      if (int(profile.ops.size()) < p)
        continue;
      PlannerOptions options;
      options.stages = p;
      options.microbatches = 2 * p;
      Topology topology = Topology::flat(p, 1e12, 1e-6);
      PlanResult planned = runPlanner("balanced", profile, topology, options);
      ASSERT_TRUE(planned.ok) << planned.error;
      for (bool zbMemory : {false, true}) {
        SCOPED_TRACE(entry.path().filename().string() + " p=" +
                     std::to_string(p) + (zbMemory ? " caps p" : " caps p-s"));
        std::vector<int64_t> caps;
        for (int s = 0; s < p; ++s)
          caps.push_back(zbMemory ? p : p - s);
        SynthResult synth =
            synthesizeSchedule(profile, topology, planned.plan, caps);
        ASSERT_TRUE(synth.ok) << synth.error;
        for (size_t s = 0; s < caps.size(); ++s)
          EXPECT_LE(synth.best.peakInflight[s], caps[s]);
        EXPECT_TRUE(
            checkCommunication(scheduleCommPrograms(synth.best.schedule)).ok);
        const double fixed = bestFixed(profile, topology, planned.plan, caps);
        EXPECT_LE(synth.best.iterationSeconds, fixed * (1 + 1e-12));
        ++compared;
        faster += synth.best.iterationSeconds < fixed * (1 - 1e-9);
      }
    }
  }
  EXPECT_GE(compared, 20);
  // The list scheduler should win somewhere, not only tie by choosing a
  // fixed schedule.
  EXPECT_GT(faster, 0);
  std::printf("synth: faster than every fixed schedule in %d of %d cases\n",
              faster, compared);
}

TEST(Synth, Refusals) {
  Profile profile;
  profile.microbatch = 1;
  for (int i = 0; i < 4; ++i)
    profile.ops.push_back({"l" + std::to_string(i), "x", 1, 2, 8, 8, 8, {}});
  Topology topology = Topology::flat(2, 1e12, 0);
  PlannerOptions options;
  options.stages = 2;
  options.microbatches = 4;
  Plan plan = runPlanner("balanced", profile, topology, options).plan;
  EXPECT_NE(synthesizeSchedule(profile, topology, plan, {2, 0})
                .error.find("stage 1 cannot hold even one microbatch"),
            std::string::npos);
  EXPECT_NE(synthesizeSchedule(profile, topology, plan, {2})
                .error.find("one in-flight cap per stage"),
            std::string::npos);
  plan.stages[0].replicas = 2;
  EXPECT_NE(synthesizeSchedule(profile, topology, plan, {2, 2})
                .error.find("no replicas"),
            std::string::npos);
}
