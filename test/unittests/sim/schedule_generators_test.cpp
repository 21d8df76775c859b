//===- schedule_generators_test.cpp - every schedule generator ------------===//
//
// The generators of lib/Schedule against the papers: thesis.md §5.4's
// interleaved worked example verbatim, §7's invariants (one F and one B per
// (microbatch, chunk) owned, F before B, FIFO / Megatron order, warm-up
// counts, peak in-flight equal to the closed form) for many (p, m, v,
// replicas), DAPPLE's K_i (dapple.md §6.2 (b)), 1F1B-RR routing and NOAM
// (pipedream.md §3), weight versions (thesis.md §3.1, Table 7.1), ZB-H1's
// W placement, and the message-level check (deadlock freedom, per-link
// order) on the send/receive programs of every generator.
//
//===----------------------------------------------------------------------===//

#include "pipec/Schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

using namespace pipec;

namespace {

/// thesis.md's notation: 1-indexed microbatches, chunk suffix a, b, ... when
/// `chunks` > 1, W for weight-gradient ops.
std::string render(const std::vector<SchedOp> &ops, int chunks = 1) {
  std::string text;
  for (const SchedOp &op : ops) {
    if (!text.empty())
      text += ' ';
    text += op.kind == PassKind::Forward    ? 'F'
            : op.kind == PassKind::Backward ? 'B'
                                            : 'W';
    text += std::to_string(op.microbatch + 1);
    if (chunks > 1)
      text += static_cast<char>('a' + op.chunk);
  }
  return text;
}

ScheduleResult make(ScheduleKind kind, int p, int64_t m,
                    ScheduleOptions options = {}) {
  return generateSchedule(kind, p, m, options);
}

std::string describe(ScheduleKind kind, int p, int64_t m,
                     const ScheduleOptions &options) {
  std::string text = std::string(scheduleKindName(kind)) +
                     " p=" + std::to_string(p) + " m=" + std::to_string(m) +
                     " v=" + std::to_string(options.chunks) +
                     " steps=" + std::to_string(options.steps) + " r=";
  for (int r : options.replicas)
    text += std::to_string(r) + ",";
  if (options.warmup == WarmupPolicy::B)
    text += " policyB";
  return text;
}

/// Checks the invariants of thesis.md §7 (1-6) and DESIGN.md §5 on every
/// rank program of `result`.
void checkInvariants(const ScheduleResult &result,
                     const ScheduleOptions &options) {
  const ScheduleKind kind = result.kind;
  const int p = result.stages, v = result.chunks;
  const int64_t total = result.microbatches * result.steps;
  const bool split =
      kind == ScheduleKind::ZeroBubbleH1 || kind == ScheduleKind::ZeroBubbleH2;
  for (const RankSchedule &rank : result.ranks) {
    SCOPED_TRACE("stage " + std::to_string(rank.stage) + " replica " +
                 std::to_string(rank.replica));
    const int r = result.replicas[rank.stage];
    const std::vector<SchedOp> ops = rank.schedule.flatten();

    // Owned: microbatches k = replica mod r, every chunk.
    std::set<std::pair<int64_t, int>> owned;
    for (int64_t k = rank.replica; k < total; k += r)
      for (int c = 0; c < v; ++c)
        owned.insert({k, c});
    ASSERT_EQ(ops.size(), owned.size() * (split ? 3 : 2));

    std::map<std::pair<int64_t, int>, size_t> fAt, bAt, wAt;
    std::vector<std::pair<int64_t, int>> fOrder, bOrder, wOrder;
    for (size_t i = 0; i < ops.size(); ++i) {
      std::pair<int64_t, int> key{ops[i].microbatch, ops[i].chunk};
      ASSERT_TRUE(owned.count(key)) << "not owned: " << render({ops[i]}, 2);
      auto &at = ops[i].kind == PassKind::Forward    ? fAt
                 : ops[i].kind == PassKind::Backward ? bAt
                                                     : wAt;
      ASSERT_TRUE(at.emplace(key, i).second) << "twice: " << render({ops[i]});
      (ops[i].kind == PassKind::Forward    ? fOrder
       : ops[i].kind == PassKind::Backward ? bOrder
                                           : wOrder)
          .push_back(key);
    }
    ASSERT_EQ(fAt.size(), owned.size());
    ASSERT_EQ(bAt.size(), owned.size());
    ASSERT_EQ(wAt.size(), split ? owned.size() : 0u);
    for (const auto &key : owned) {
      EXPECT_LT(fAt[key], bAt[key]);
      if (split) {
        EXPECT_LT(bAt[key], wAt[key]);
      }
    }

    // Order of F and B ops.
    const int64_t n = static_cast<int64_t>(owned.size()) / v;
    if (kind == ScheduleKind::Interleaved) {
      // c_F(k) = (k mod pv) div p, mb(k) = (k div pv) p + k mod p on the
      // replica's local microbatches; c_B(k) = v - 1 - c_F(k).
      const int64_t pv = static_cast<int64_t>(p) * v;
      for (int64_t k = 0; k < n * v; ++k) {
        int c = static_cast<int>((k % pv) / p);
        int64_t local = (k / pv) * p + k % p;
        int64_t global = rank.replica + static_cast<int64_t>(r) * local;
        EXPECT_EQ(fOrder[k], std::make_pair(global, c)) << "F #" << k;
        EXPECT_EQ(bOrder[k], std::make_pair(global, v - 1 - c)) << "B #" << k;
      }
    } else {
      EXPECT_TRUE(std::is_sorted(fOrder.begin(), fOrder.end()));
      EXPECT_EQ(bOrder, fOrder); // FIFO
      if (split) {
        EXPECT_EQ(wOrder, bOrder);
      }
    }

    // Warm-up: the leading run of forwards, and the matching cool-down.
    int64_t leading = 0;
    while (leading < static_cast<int64_t>(ops.size()) &&
           ops[leading].kind == PassKind::Forward)
      ++leading;
    int64_t closed = closedFormInflight(
        kind, p, rank.stage, result.microbatches, options, rank.replica);
    if (kind == ScheduleKind::GPipe) {
      EXPECT_EQ(leading, n);
    } else if (kind == ScheduleKind::ZeroBubbleH2) {
      // Warm-up: every forward until the first backward can arrive.
      EXPECT_EQ(leading, std::min<int64_t>(n, 2 * (p - rank.stage) - 1));
    } else if (kind == ScheduleKind::ZeroBubbleH1) {
      EXPECT_EQ(leading, std::min(n, closedFormInflight(
                                         ScheduleKind::OneFOneBFlush, p,
                                         rank.stage, result.microbatches,
                                         ScheduleOptions{1, WarmupPolicy::A, 0,
                                                         1, options.replicas},
                                         rank.replica)));
    } else {
      // The warm-up of w forwards plus the first steady-state forward: the
      // in-flight depth (1F1B: min(K, n); interleaved: min(W_r + 1, N_v)).
      EXPECT_EQ(leading, closed);
    }
    if (kind == ScheduleKind::ZeroBubbleH2) {
      // The last op is a W (the deferred ones end the step).
      EXPECT_EQ(ops.back().kind, PassKind::BackwardWeight);
    } else if (kind != ScheduleKind::ZeroBubbleH1) {
      int64_t trailing = 0;
      while (trailing < static_cast<int64_t>(ops.size()) &&
             ops[ops.size() - 1 - trailing].kind == PassKind::Backward)
        ++trailing;
      EXPECT_EQ(trailing, leading);
      // w = leading - 1 warm-up forwards, then {F, B} pairs until the
      // forwards run out (unless everything is warm-up).
      const int64_t forwards = static_cast<int64_t>(ops.size()) / 2;
      if (leading < forwards) {
        const int64_t w = leading - 1;
        for (int64_t i = 0; i < forwards - w; ++i) {
          EXPECT_EQ(ops[w + 2 * i].kind, PassKind::Forward) << i;
          EXPECT_EQ(ops[w + 2 * i + 1].kind, PassKind::Backward) << i;
        }
      }
    }

    // Peak in-flight against the closed form.
    EXPECT_EQ(peakInflight(ops), closed);

    // Loops: the program size does not grow with the microbatch count.
    EXPECT_LE(rank.schedule.segments.size(), 7u);
  }
}

/// Deadlock freedom and per-link order of the derived send/recv programs.
void checkCommunicationOf(const ScheduleResult &result) {
  CommCheckResult check = checkCommunication(scheduleCommPrograms(result));
  std::string errors;
  for (const std::string &e : check.errors)
    errors += e + "\n";
  EXPECT_TRUE(check.ok) << errors;
}

const ScheduleKind kAllKinds[] = {
    ScheduleKind::GPipe,       ScheduleKind::OneFOneBFlush,
    ScheduleKind::OneFOneB,    ScheduleKind::TwoBW,
    ScheduleKind::Interleaved, ScheduleKind::ZeroBubbleH1,
    ScheduleKind::ZeroBubbleH2};

} // namespace

//===----------------------------------------------------------------------===//
// Names and errors
//===----------------------------------------------------------------------===//

TEST(ScheduleGenerators, NamesRoundTrip) {
  EXPECT_EQ(scheduleKindNames().size(), 10u);
  for (ScheduleKind kind : kAllKinds)
    EXPECT_EQ(parseScheduleKind(scheduleKindName(kind)), kind);
  EXPECT_TRUE(isFlushSchedule(ScheduleKind::ZeroBubbleH1));
  EXPECT_TRUE(isFlushSchedule(ScheduleKind::Interleaved));
  EXPECT_FALSE(isFlushSchedule(ScheduleKind::OneFOneB));
  EXPECT_FALSE(isFlushSchedule(ScheduleKind::TwoBW));
}

TEST(ScheduleGenerators, ErrorsAreText) {
  auto error = [](ScheduleKind kind, int p, int64_t m, ScheduleOptions o) {
    ScheduleResult result = generateSchedule(kind, p, m, o);
    EXPECT_FALSE(result.ok);
    EXPECT_TRUE(result.ranks.empty());
    return result.error;
  };
  ScheduleOptions two;
  two.chunks = 2;
  // Megatron's rule: m % p == 0 (thesis.md §7 invariant 7).
  std::string text = error(ScheduleKind::Interleaved, 4, 6, two);
  EXPECT_NE(text.find("multiple of the pipeline depth p = 4"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("(6)"), std::string::npos) << text;
  // chunks only for interleaved.
  text = error(ScheduleKind::OneFOneBFlush, 4, 8, two);
  EXPECT_NE(text.find("only the interleaved schedule"), std::string::npos);
  // 2bw needs m >= p - 1.
  text = error(ScheduleKind::TwoBW, 5, 3, {});
  EXPECT_NE(text.find("m >= p - 1"), std::string::npos) << text;
  EXPECT_TRUE(generateSchedule(ScheduleKind::TwoBW, 5, 4, {}).ok);
  EXPECT_TRUE(generateSchedule(ScheduleKind::TwoBW, 4, 3, {}).ok);
  EXPECT_FALSE(generateSchedule(ScheduleKind::TwoBW, 4, 2, {}).ok);
  // steps > 1 only for continuous schedules.
  ScheduleOptions steps;
  steps.steps = 2;
  text = error(ScheduleKind::GPipe, 2, 2, steps);
  EXPECT_NE(text.find("flushes"), std::string::npos) << text;
  // Replica lists.
  ScheduleOptions bad;
  bad.replicas = {1, 2};
  EXPECT_NE(error(ScheduleKind::GPipe, 3, 2, bad).find("3 stages"),
            std::string::npos);
  bad.replicas = {1, 0, 1};
  EXPECT_NE(error(ScheduleKind::GPipe, 3, 2, bad).find("stage 1 has 0"),
            std::string::npos);
  ScheduleOptions uneven = two;
  uneven.replicas = {2, 1};
  EXPECT_NE(
      error(ScheduleKind::Interleaved, 2, 4, uneven).find("same replica count"),
      std::string::npos);
  error(ScheduleKind::GPipe, 0, 4, {});
  error(ScheduleKind::GPipe, 4, 0, {});
  // The legacy entry point returns no programs on error.
  EXPECT_TRUE(generateSchedule(ScheduleKind::TwoBW, 5, 2).empty());
}

//===----------------------------------------------------------------------===//
// Interleaved 1F1B (thesis.md §4.2, §5.4)
//===----------------------------------------------------------------------===//

TEST(ScheduleGenerators, InterleavedThesisWorkedExample) {
  ScheduleOptions options;
  options.chunks = 2;
  ScheduleResult result = make(ScheduleKind::Interleaved, 4, 8, options);
  ASSERT_TRUE(result.ok) << result.error;
  ASSERT_EQ(result.ranks.size(), 4u);
  const char *expected[] = {
      "F1a F2a F3a F4a F1b F2b F3b F4b F5a F6a F7a B1b F8a B2b F5b B3b F6b "
      "B4b F7b B1a F8b B2a B3a B4a B5b B6b B7b B8b B5a B6a B7a B8a",
      "F1a F2a F3a F4a F1b F2b F3b F4b F5a B1b F6a B2b F7a B3b F8a B4b F5b "
      "B1a F6b B2a F7b B3a F8b B4a B5b B6b B7b B8b B5a B6a B7a B8a",
      "F1a F2a F3a F4a F1b F2b F3b B1b F4b B2b F5a B3b F6a B4b F7a B1a F8a "
      "B2a F5b B3a F6b B4a F7b B5b F8b B6b B7b B8b B5a B6a B7a B8a",
      "F1a F2a F3a F4a F1b B1b F2b B2b F3b B3b F4b B4b F5a B1a F6a B2a F7a "
      "B3a F8a B4a F5b B5b F6b B6b F7b B7b F8b B8b B5a B6a B7a B8a"};
  const int64_t warmups[] = {10, 8, 6, 4}; // W_r
  for (int r = 0; r < 4; ++r) {
    std::vector<SchedOp> ops = result.ranks[r].schedule.flatten();
    EXPECT_EQ(render(ops, 2), expected[r]) << "device " << r;
    int64_t leading = 0;
    while (ops[leading].kind == PassKind::Forward)
      ++leading;
    EXPECT_EQ(leading, warmups[r] + 1);
    // 2(p-r-1) + (v-1)p + 1 = 11, 9, 7, 5 chunk-microbatches (m > p).
    EXPECT_EQ(peakInflight(ops), 11 - 2 * r);
    EXPECT_EQ(closedFormInflight(ScheduleKind::Interleaved, 4, r, 8, options),
              11 - 2 * r);
  }
  checkCommunicationOf(result);
}

TEST(ScheduleGenerators, InterleavedMEqualsPIsAllForwardAllBackward) {
  ScheduleOptions options;
  options.chunks = 2;
  ScheduleResult result = make(ScheduleKind::Interleaved, 4, 4, options);
  ASSERT_TRUE(result.ok);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(render(result.ranks[r].schedule.flatten(), 2),
              "F1a F2a F3a F4a F1b F2b F3b F4b B1b B2b B3b B4b B1a B2a B3a "
              "B4a");
    EXPECT_EQ(closedFormInflight(ScheduleKind::Interleaved, 4, r, 4, options),
              8);
  }
}

TEST(ScheduleGenerators, InterleavedSteadyStateIsALoop) {
  // p = 4, v = 2, m = 64: the steady state repeats every p*v = 8 pairs with
  // microbatches growing by p = 4 per trip.
  ScheduleOptions options;
  options.chunks = 2;
  ScheduleResult result = make(ScheduleKind::Interleaved, 4, 64, options);
  ASSERT_TRUE(result.ok);
  const StageSchedule &device0 = result.ranks[0].schedule;
  bool found = false;
  for (const Segment &segment : device0.segments)
    if (segment.body.size() == 16 && segment.trips > 1) {
      EXPECT_EQ(segment.stride, 4);
      found = true;
    }
  EXPECT_TRUE(found);
  EXPECT_LE(device0.segments.size(), 6u);
}

//===----------------------------------------------------------------------===//
// Invariants for many shapes
//===----------------------------------------------------------------------===//

TEST(ScheduleGenerators, InvariantsStraightPipelines) {
  for (ScheduleKind kind : kAllKinds)
    for (int p = 1; p <= 7; ++p)
      for (int64_t m = 1; m <= 13; ++m)
        for (int v : {1, 2, 3}) {
          if (v > 1 && kind != ScheduleKind::Interleaved)
            continue;
          if (kind == ScheduleKind::Interleaved && m % p != 0)
            continue;
          if (kind == ScheduleKind::TwoBW && m < p - 1)
            continue;
          for (int64_t steps : {1, 3}) {
            if (steps > 1 && isFlushSchedule(kind))
              continue;
            for (WarmupPolicy policy : {WarmupPolicy::A, WarmupPolicy::B}) {
              if (policy == WarmupPolicy::B &&
                  kind != ScheduleKind::OneFOneBFlush)
                continue;
              ScheduleOptions options;
              options.chunks = v;
              options.steps = steps;
              options.warmup = policy;
              SCOPED_TRACE(describe(kind, p, m, options));
              ScheduleResult result = make(kind, p, m, options);
              ASSERT_TRUE(result.ok) << result.error;
              ASSERT_EQ(static_cast<int>(result.ranks.size()), p);
              checkInvariants(result, options);
              checkCommunicationOf(result);
            }
          }
        }
}

TEST(ScheduleGenerators, InvariantsReplicatedStages) {
  const std::vector<std::vector<int>> shapes = {
      {2, 1},  {1, 2},  {3, 1, 1},    {2, 2, 2},
      {15, 1}, {11, 5}, {1, 3, 2, 1}, {4, 2, 1, 1}};
  for (ScheduleKind kind : kAllKinds)
    for (const std::vector<int> &replicas : shapes)
      for (int64_t m : {1, 2, 3, 5, 8, 12, 16, 30}) {
        const int p = static_cast<int>(replicas.size());
        ScheduleOptions options;
        options.replicas = replicas;
        if (kind == ScheduleKind::Interleaved) {
          if (!std::all_of(replicas.begin(), replicas.end(),
                           [&](int r) { return r == replicas[0]; }) ||
              m % (replicas[0] * p) != 0)
            continue;
          options.chunks = 2;
        }
        if (!isFlushSchedule(kind))
          options.steps = 3;
        SCOPED_TRACE(describe(kind, p, m, options));
        ScheduleResult result = make(kind, p, m, options);
        if (kind == ScheduleKind::TwoBW && !result.ok)
          continue; // too few microbatches per batch for the depth
        if (kind == ScheduleKind::ZeroBubbleH2) {
          // Straight pipelines only: refused, saying so.
          EXPECT_FALSE(result.ok);
          EXPECT_NE(result.error.find("straight pipeline"), std::string::npos)
              << result.error;
          continue;
        }
        ASSERT_TRUE(result.ok) << result.error;
        checkInvariants(result, options);
        checkCommunicationOf(result);
      }
}

//===----------------------------------------------------------------------===//
// 1F1B-flush warm-up policies (dapple.md §3.3, §6.2 (b))
//===----------------------------------------------------------------------===//

TEST(ScheduleGenerators, DappleWarmupPolicies) {
  // Four compute stages, D large: P_A gives K = 4, 3, 2, 1; P_B 7, 5, 3, 1.
  const int64_t policyA[] = {4, 3, 2, 1}, policyB[] = {7, 5, 3, 1};
  for (WarmupPolicy policy : {WarmupPolicy::A, WarmupPolicy::B}) {
    ScheduleOptions options;
    options.warmup = policy;
    ScheduleResult result = make(ScheduleKind::OneFOneBFlush, 4, 16, options);
    ASSERT_TRUE(result.ok);
    for (int s = 0; s < 4; ++s) {
      std::vector<SchedOp> ops = result.ranks[s].schedule.flatten();
      int64_t k = 0;
      while (ops[k].kind == PassKind::Forward)
        ++k;
      int64_t expected = policy == WarmupPolicy::A ? policyA[s] : policyB[s];
      EXPECT_EQ(k, expected) << "stage " << s;
      // In-flight peaks at min(K_i, M), independent of M (invariant 14).
      EXPECT_EQ(peakInflight(ops), expected);
    }
    checkCommunicationOf(result);
  }
  // D clamps K_i: D = 2 gives 2, 2, 2, 1 under P_B.
  ScheduleOptions clamped;
  clamped.warmup = WarmupPolicy::B;
  clamped.maxInflight = 2;
  ScheduleResult result = make(ScheduleKind::OneFOneBFlush, 4, 16, clamped);
  ASSERT_TRUE(result.ok);
  const int64_t expected[] = {2, 2, 2, 1};
  for (int s = 0; s < 4; ++s) {
    EXPECT_EQ(peakInflight(result.ranks[s].schedule.flatten()), expected[s]);
    EXPECT_EQ(
        closedFormInflight(ScheduleKind::OneFOneBFlush, 4, s, 16, clamped),
        expected[s]);
  }
  checkCommunicationOf(result);
  // Policy B with M smaller than K: clamped to M.
  ScheduleOptions b;
  b.warmup = WarmupPolicy::B;
  EXPECT_EQ(closedFormInflight(ScheduleKind::OneFOneBFlush, 4, 0, 3, b), 3);
  EXPECT_EQ(render(make(ScheduleKind::OneFOneBFlush, 4, 3, b)
                       .ranks[0]
                       .schedule.flatten()),
            "F1 F2 F3 B1 B2 B3");
}

//===----------------------------------------------------------------------===//
// PipeDream 1F1B, 1F1B-RR and 2BW (pipedream.md §3-4, thesis.md §3.1, §5.3)
//===----------------------------------------------------------------------===//

TEST(ScheduleGenerators, ContinuousOneFOneBRunsAcrossBatches) {
  // p = 4, m = 2, 3 steps: one program of 6 microbatches, no flush; stage 0
  // admits p = 4 (NOAM) and then runs F(k) right after B(k - p) (thesis.md
  // §7 invariant 11).
  ScheduleOptions options;
  options.steps = 3;
  ScheduleResult result = make(ScheduleKind::OneFOneB, 4, 2, options);
  ASSERT_TRUE(result.ok);
  EXPECT_EQ(render(result.ranks[0].schedule.flatten()),
            "F1 F2 F3 F4 B1 F5 B2 F6 B3 B4 B5 B6");
  EXPECT_EQ(render(result.ranks[3].schedule.flatten()),
            "F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6");
  // Steady state as one loop whatever the number of steps.
  options.steps = 50;
  result = make(ScheduleKind::OneFOneB, 4, 8, options);
  ASSERT_TRUE(result.ok);
  EXPECT_EQ(result.ranks[1].schedule.segments.size(), 3u);
  EXPECT_EQ(result.ranks[1].schedule.segments[1].trips, 400 - 2);
}

TEST(ScheduleGenerators, RoundRobinReplicasAndNoam) {
  // PipeDream's "2-1" configuration (Figure 8): even inputs on worker 1,
  // odd on worker 2, worker 3 runs everything; NOAM = ceil(3 / 2) = 2.
  ScheduleOptions options;
  options.replicas = {2, 1};
  options.steps = 2;
  ScheduleResult result = make(ScheduleKind::OneFOneB, 2, 4, options);
  ASSERT_TRUE(result.ok);
  ASSERT_EQ(result.ranks.size(), 3u);
  EXPECT_EQ(result.rankOf(0, 1), 1);
  EXPECT_EQ(result.rankOf(1, 0), 2);
  EXPECT_EQ(result.rankOf(1, 1), -1);
  EXPECT_EQ(render(result.ranks[0].schedule.flatten()),
            "F1 F3 B1 F5 B3 F7 B5 B7");
  EXPECT_EQ(render(result.ranks[1].schedule.flatten()),
            "F2 F4 B2 F6 B4 F8 B6 B8");
  EXPECT_EQ(render(result.ranks[2].schedule.flatten()),
            "F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7 F8 B8");
  checkCommunicationOf(result);
  // 15-1 on 16 workers: NOAM = ceil(16 / 15) = 2 (pipedream.md §3).
  options.replicas = {15, 1};
  options.steps = 1;
  result = make(ScheduleKind::OneFOneB, 2, 60, options);
  ASSERT_TRUE(result.ok);
  EXPECT_EQ(closedFormInflight(ScheduleKind::OneFOneB, 2, 0, 60, options), 2);
  EXPECT_EQ(peakInflight(result.ranks[0].schedule.flatten()), 2);
  checkCommunicationOf(result);
}

TEST(ScheduleGenerators, WeightVersions) {
  // PipeDream with weight stashing: stage s holds p - s versions in steady
  // state (thesis.md Table 7.1: p on the input stage).
  for (int p = 1; p <= 8; ++p) {
    ScheduleOptions options;
    options.steps = 4;
    ScheduleResult result = make(ScheduleKind::OneFOneB, p, 2 * p, options);
    ASSERT_TRUE(result.ok);
    for (int s = 0; s < p; ++s) {
      std::vector<SchedOp> ops = result.ranks[s].schedule.flatten();
      EXPECT_EQ(peakWeightVersions(ScheduleKind::OneFOneB, ops, 2 * p), p - s)
          << "p=" << p << " s=" << s;
      EXPECT_EQ(closedFormWeightVersions(ScheduleKind::OneFOneB, p, s, 2 * p,
                                         options),
                p - s);
    }
  }
  // 2BW: never more than 2 versions for m >= p - 1, exactly 2 once a second
  // batch runs (thesis.md §3.1 [S], §7 invariant 15).
  for (int p = 1; p <= 8; ++p)
    for (int64_t m : {int64_t(p) - 1, int64_t(p), int64_t(p) + 1,
                      int64_t(2 * p), int64_t(3 * p + 1)}) {
      if (m < 1)
        continue;
      ScheduleOptions options;
      options.steps = 4;
      ScheduleResult result = make(ScheduleKind::TwoBW, p, m, options);
      ASSERT_TRUE(result.ok) << p << " " << m << ": " << result.error;
      for (int s = 0; s < p; ++s)
        EXPECT_EQ(peakWeightVersions(ScheduleKind::TwoBW,
                                     result.ranks[s].schedule.flatten(), m),
                  2)
            << "p=" << p << " m=" << m << " s=" << s;
    }
  // m = p - 2 fails: a forward would need a version not created yet.
  ScheduleOptions options;
  options.steps = 4;
  ScheduleResult one = make(ScheduleKind::OneFOneB, 5, 3, options);
  EXPECT_EQ(peakWeightVersions(ScheduleKind::TwoBW,
                               one.ranks[0].schedule.flatten(), 3),
            -1);
  // Flush schedules keep one version.
  EXPECT_EQ(peakWeightVersions(
                ScheduleKind::GPipe,
                make(ScheduleKind::GPipe, 4, 8).ranks[0].schedule.flatten(), 8),
            1);
}

TEST(ScheduleGenerators, WeightVersionClosedFormMatchesTheWalk) {
  for (int p = 1; p <= 6; ++p)
    for (int64_t m = 1; m <= 9; ++m)
      for (int64_t steps : {1, 2, 3}) {
        ScheduleOptions options;
        options.steps = steps;
        for (ScheduleKind kind :
             {ScheduleKind::OneFOneB, ScheduleKind::TwoBW}) {
          ScheduleResult result = make(kind, p, m, options);
          if (!result.ok)
            continue;
          for (int s = 0; s < p; ++s)
            EXPECT_EQ(
                peakWeightVersions(kind, result.ranks[s].schedule.flatten(), m),
                closedFormWeightVersions(kind, p, s, m, options))
                << scheduleKindName(kind) << " p=" << p << " m=" << m
                << " steps=" << steps << " s=" << s;
        }
      }
}

//===----------------------------------------------------------------------===//
// ZB-H1
//===----------------------------------------------------------------------===//

TEST(ScheduleGenerators, ZeroBubbleH1Order) {
  // Stage s defers s weight-gradient ops: the last stage runs F B pairs for
  // p - 1 microbatches before its first W, the first stage W right after
  // each B; the deferred W ops end the step.
  ScheduleResult result = make(ScheduleKind::ZeroBubbleH1, 4, 8);
  ASSERT_TRUE(result.ok);
  EXPECT_EQ(render(result.ranks[0].schedule.flatten()),
            "F1 F2 F3 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 F8 B5 W5 B6 W6 B7 "
            "W7 B8 W8");
  EXPECT_EQ(render(result.ranks[1].schedule.flatten()),
            "F1 F2 F3 B1 F4 B2 W1 F5 B3 W2 F6 B4 W3 F7 B5 W4 F8 B6 W5 B7 W6 "
            "B8 W7 W8");
  EXPECT_EQ(render(result.ranks[3].schedule.flatten()),
            "F1 B1 F2 B2 F3 B3 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 F8 B8 W5 "
            "W6 W7 W8");
  // Every stage holds up to p microbatches until their W: min(p, m).
  for (int s = 0; s < 4; ++s)
    EXPECT_EQ(peakInflight(result.ranks[s].schedule.flatten()), 4);
  EXPECT_EQ(closedFormInflight(ScheduleKind::ZeroBubbleH1, 4, 2, 3), 3);
  checkCommunicationOf(result);
}
