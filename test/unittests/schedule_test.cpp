//===- schedule_test.cpp - GPipe / 1F1B-flush generator tests -------------===//
//
// The thesis' worked example (papers/thesis.md §5.2), the invariants of
// §7 (one F and one B per microbatch, F before B, FIFO, warm-up counts,
// peak in-flight against the closed form) and a dependency simulation whose
// makespan must be (m + p - 1)(t_f + t_b) on uniform stages.
//
//===----------------------------------------------------------------------===//

#include "pipec/Schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>

using namespace pipec;

namespace {

/// Prints a flat program the way thesis.md does: 1-indexed, space separated.
std::string render(const std::vector<SchedOp> &ops) {
  std::string text;
  for (const SchedOp &op : ops) {
    if (!text.empty())
      text += ' ';
    text += op.kind == PassKind::Forward ? 'F' : 'B';
    text += std::to_string(op.microbatch + 1);
  }
  return text;
}

const ScheduleKind kKinds[] = {ScheduleKind::GPipe,
                               ScheduleKind::OneFOneBFlush};

} // namespace

TEST(ScheduleTest, KindNames) {
  EXPECT_EQ(parseScheduleKind("gpipe"), ScheduleKind::GPipe);
  EXPECT_EQ(parseScheduleKind("1f1b-flush"), ScheduleKind::OneFOneBFlush);
  EXPECT_EQ(parseScheduleKind("1f1b"), ScheduleKind::OneFOneB);
  EXPECT_EQ(parseScheduleKind("2bw"), ScheduleKind::TwoBW);
  EXPECT_EQ(parseScheduleKind("interleaved"), ScheduleKind::Interleaved);
  EXPECT_EQ(parseScheduleKind("zb-h1"), ScheduleKind::ZeroBubbleH1);
  EXPECT_EQ(parseScheduleKind("GPipe"), std::nullopt);
  EXPECT_EQ(parseScheduleKind("1f1b-rr"), std::nullopt);
  for (ScheduleKind kind : kKinds)
    EXPECT_EQ(parseScheduleKind(scheduleKindName(kind)), kind);
  for (const std::string &name : scheduleKindNames())
    EXPECT_EQ(scheduleKindName(*parseScheduleKind(name)), name);
}

TEST(ScheduleTest, ThesisWorkedExampleP4M8) {
  // thesis.md §5.2, p = 4, m = 8.
  std::vector<StageSchedule> stages =
      generateSchedule(ScheduleKind::OneFOneBFlush, 4, 8);
  ASSERT_EQ(stages.size(), 4u);
  EXPECT_EQ(render(stages[0].flatten()),
            "F1 F2 F3 F4 B1 F5 B2 F6 B3 F7 B4 F8 B5 B6 B7 B8");
  EXPECT_EQ(render(stages[1].flatten()),
            "F1 F2 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 F8 B6 B7 B8");
  EXPECT_EQ(render(stages[2].flatten()),
            "F1 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 F8 B7 B8");
  EXPECT_EQ(render(stages[3].flatten()),
            "F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7 F8 B8");
  // In-flight per device is 4/3/2/1.
  for (int s = 0; s < 4; ++s)
    EXPECT_EQ(peakInflight(stages[s].flatten()), 4 - s);
}

TEST(ScheduleTest, SegmentsAreLoops) {
  // Stage 1 of p = 4, m = 8: warm-up F0 x2, steady {F2, B0} x6, cool-down
  // B6 x2.
  std::vector<StageSchedule> stages =
      generateSchedule(ScheduleKind::OneFOneBFlush, 4, 8);
  const std::vector<Segment> &segments = stages[1].segments;
  ASSERT_EQ(segments.size(), 3u);
  EXPECT_EQ(segments[0].trips, 2);
  EXPECT_EQ(segments[0].body, (std::vector<SchedOp>{{PassKind::Forward, 0}}));
  EXPECT_EQ(segments[1].trips, 6);
  EXPECT_EQ(segments[1].body, (std::vector<SchedOp>{{PassKind::Forward, 2},
                                                    {PassKind::Backward, 0}}));
  EXPECT_EQ(segments[2].trips, 2);
  EXPECT_EQ(segments[2].body, (std::vector<SchedOp>{{PassKind::Backward, 6}}));

  // The last stage has no warm-up or cool-down loop: zero-trip segments are
  // omitted.
  ASSERT_EQ(stages[3].segments.size(), 1u);
  EXPECT_EQ(stages[3].segments[0].trips, 8);

  // m < p - s - 1: everything is warm-up and cool-down.
  std::vector<StageSchedule> short_ =
      generateSchedule(ScheduleKind::OneFOneBFlush, 6, 2);
  ASSERT_EQ(short_[0].segments.size(), 2u);
  EXPECT_EQ(render(short_[0].flatten()), "F1 F2 B1 B2");

  std::vector<StageSchedule> gpipe =
      generateSchedule(ScheduleKind::GPipe, 3, 5);
  ASSERT_EQ(gpipe[2].segments.size(), 2u);
  EXPECT_EQ(render(gpipe[2].flatten()), "F1 F2 F3 F4 F5 B1 B2 B3 B4 B5");
}

TEST(ScheduleTest, RejectsBadArguments) {
  EXPECT_TRUE(generateSchedule(ScheduleKind::GPipe, 0, 4).empty());
  EXPECT_TRUE(generateSchedule(ScheduleKind::OneFOneBFlush, 4, 0).empty());
}

TEST(ScheduleTest, InvariantsForManyShapes) {
  for (ScheduleKind kind : kKinds)
    for (int p = 1; p <= 9; ++p)
      for (int64_t m = 1; m <= 13; ++m) {
        SCOPED_TRACE(std::string(scheduleKindName(kind)) +
                     " p=" + std::to_string(p) + " m=" + std::to_string(m));
        std::vector<StageSchedule> stages = generateSchedule(kind, p, m);
        ASSERT_EQ(static_cast<int>(stages.size()), p);
        for (int s = 0; s < p; ++s) {
          SCOPED_TRACE("stage " + std::to_string(s));
          std::vector<SchedOp> ops = stages[s].flatten();
          ASSERT_EQ(static_cast<int64_t>(ops.size()), 2 * m);

          // One F and one B per microbatch; F before B.
          std::map<int64_t, int> fwdAt, bwdAt;
          std::vector<int64_t> fwdOrder, bwdOrder;
          for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
            auto &at = ops[i].kind == PassKind::Forward ? fwdAt : bwdAt;
            ASSERT_TRUE(at.emplace(ops[i].microbatch, i).second)
                << "duplicate " << render({ops[i]});
            (ops[i].kind == PassKind::Forward ? fwdOrder : bwdOrder)
                .push_back(ops[i].microbatch);
          }
          for (int64_t k = 0; k < m; ++k) {
            ASSERT_TRUE(fwdAt.count(k) && bwdAt.count(k)) << "mb " << k;
            EXPECT_LT(fwdAt[k], bwdAt[k]) << "B before F for mb " << k;
          }
          // F in increasing microbatch order; B in the same order (FIFO).
          EXPECT_TRUE(std::is_sorted(fwdOrder.begin(), fwdOrder.end()));
          EXPECT_EQ(bwdOrder, fwdOrder);

          // Warm-up: forwards before the first backward.
          int64_t warmup = 0;
          while (ops[warmup].kind == PassKind::Forward)
            ++warmup;
          int64_t cooldown = 0;
          while (ops[ops.size() - 1 - cooldown].kind == PassKind::Backward)
            ++cooldown;
          if (kind == ScheduleKind::GPipe) {
            EXPECT_EQ(warmup, m);
            EXPECT_EQ(cooldown, m);
          } else {
            int64_t w = std::min<int64_t>(p - s - 1, m);
            // The first steady-state F follows the warm-up without a B in
            // between, so the leading forward run is w + 1 unless w == m.
            EXPECT_EQ(warmup, w == m ? m : w + 1);
            EXPECT_EQ(cooldown, w == m ? m : w + 1);
            if (w > 0) {
              EXPECT_EQ(stages[s].segments.front().trips, w);
              EXPECT_EQ(stages[s].segments.back().trips, w);
            }
            // Steady state alternates F, B exactly m - w times.
            for (int64_t i = 0; i < m - w; ++i) {
              EXPECT_EQ(ops[w + 2 * i].kind, PassKind::Forward);
              EXPECT_EQ(ops[w + 2 * i + 1].kind, PassKind::Backward);
            }
            // The last stage runs B(k) right after F(k) (§7 invariant 11).
            if (s == p - 1) {
              for (int64_t k = 0; k < m; ++k)
                EXPECT_EQ(bwdAt[k], fwdAt[k] + 1);
            }
          }

          // Peak in-flight against the closed form; the step ends with
          // nothing in flight.
          EXPECT_EQ(peakInflight(ops), closedFormInflight(kind, p, s, m));
        }
      }
}

TEST(ScheduleTest, ClosedFormInflight) {
  EXPECT_EQ(closedFormInflight(ScheduleKind::GPipe, 4, 0, 8), 8);
  EXPECT_EQ(closedFormInflight(ScheduleKind::GPipe, 4, 3, 2), 2);
  EXPECT_EQ(closedFormInflight(ScheduleKind::OneFOneBFlush, 4, 0, 8), 4);
  EXPECT_EQ(closedFormInflight(ScheduleKind::OneFOneBFlush, 4, 3, 8), 1);
  EXPECT_EQ(closedFormInflight(ScheduleKind::OneFOneBFlush, 8, 0, 3), 3);
}

TEST(ScheduleTest, PeakInflightOfHandWrittenPrograms) {
  using K = PassKind;
  EXPECT_EQ(peakInflight({}), 0);
  EXPECT_EQ(peakInflight({{K::Forward, 0},
                          {K::Backward, 0},
                          {K::Forward, 1},
                          {K::Backward, 1}}),
            1);
  EXPECT_EQ(peakInflight({{K::Forward, 0},
                          {K::Forward, 1},
                          {K::Backward, 1},
                          {K::Forward, 2},
                          {K::Forward, 3},
                          {K::Backward, 0}}),
            3);
}

//===----------------------------------------------------------------------===//
// Dependency simulation
//===----------------------------------------------------------------------===//

namespace {

/// Event-driven simulation of per-stage programs on uniform stages with
/// free communication: F(s, k) needs F(s-1, k); B(s, k) needs B(s+1, k), and
/// the last stage's B(k) its own F(k). Each stage runs its ops in program
/// order. Returns the makespan, or -1 if the programs deadlock.
double simulateMakespan(const std::vector<StageSchedule> &stages, double tf,
                        double tb) {
  int p = static_cast<int>(stages.size());
  std::vector<std::vector<SchedOp>> programs;
  for (const StageSchedule &stage : stages)
    programs.push_back(stage.flatten());
  std::vector<std::map<int64_t, double>> fwdDone(p), bwdDone(p);
  std::vector<size_t> pc(p, 0);
  std::vector<double> free(p, 0.0);
  bool progress = true;
  while (progress) {
    progress = false;
    for (int s = 0; s < p; ++s)
      while (pc[s] < programs[s].size()) {
        const SchedOp &op = programs[s][pc[s]];
        double ready = 0;
        if (op.kind == PassKind::Forward) {
          if (s > 0) {
            auto it = fwdDone[s - 1].find(op.microbatch);
            if (it == fwdDone[s - 1].end())
              break;
            ready = it->second;
          }
        } else {
          auto &producer = s + 1 < p ? bwdDone[s + 1] : fwdDone[s];
          auto it = producer.find(op.microbatch);
          if (it == producer.end())
            break;
          ready = it->second;
        }
        double start = std::max(ready, free[s]);
        double end = start + (op.kind == PassKind::Forward ? tf : tb);
        (op.kind == PassKind::Forward ? fwdDone : bwdDone)[s][op.microbatch] =
            end;
        free[s] = end;
        ++pc[s];
        progress = true;
      }
  }
  for (int s = 0; s < p; ++s)
    if (pc[s] != programs[s].size())
      return -1;
  return *std::max_element(free.begin(), free.end());
}

} // namespace

TEST(ScheduleTest, ThesisMakespanExample) {
  // p = 4, m = 8, t_f = 1, t_b = 2: makespan 33 = (8 + 3) * 3, bubble 3/8.
  for (ScheduleKind kind : kKinds) {
    double makespan = simulateMakespan(generateSchedule(kind, 4, 8), 1.0, 2.0);
    EXPECT_EQ(makespan, 33.0) << scheduleKindName(kind);
    double busy = 8 * 3.0;
    EXPECT_EQ((makespan - busy) / busy, 3.0 / 8.0);
  }
}

TEST(ScheduleTest, UniformMakespanClosedForm) {
  // (m + p - 1)(t_f + t_b), thesis.md §7 invariant 9, for any t_b / t_f.
  const std::pair<double, double> times[] = {{1, 1}, {1, 2}, {2, 3}, {3, 1}};
  for (ScheduleKind kind : kKinds)
    for (int p = 1; p <= 8; ++p)
      for (int64_t m = 1; m <= 12; ++m)
        for (auto [tf, tb] : times) {
          double makespan =
              simulateMakespan(generateSchedule(kind, p, m), tf, tb);
          EXPECT_EQ(makespan, (m + p - 1) * (tf + tb))
              << scheduleKindName(kind) << " p=" << p << " m=" << m
              << " tf=" << tf << " tb=" << tb;
        }
}

/// The checks every V schedule (two chunks per device) passes for p
/// devices and m microbatches: every (chunk, microbatch) once as F, B and W
/// on its device, in that order; deadlock free with every channel in
/// order; the in-flight peak equal to the closed form. Returns the result.
ScheduleResult checkVSchedule(ScheduleKind kind, int p, int64_t m) {
  ScheduleOptions options;
  options.chunks = 2;
  ScheduleResult r = generateSchedule(kind, p, m, options);
  EXPECT_TRUE(r.ok) << r.error;
  if (!r.ok)
    return r;
  EXPECT_EQ(r.placement, Placement::V);
  CommCheckResult check = checkCommunication(scheduleCommPrograms(r));
  EXPECT_TRUE(check.ok) << "p " << p << " m " << m << ": "
                        << (check.errors.empty() ? "" : check.errors.front());
  for (const RankSchedule &rank : r.ranks) {
    std::map<std::pair<int, int64_t>, std::vector<PassKind>> seen;
    for (const SchedOp &op : rank.schedule.flatten())
      seen[{op.chunk, op.microbatch}].push_back(op.kind);
    EXPECT_EQ(seen.size(), size_t(2 * m)) << "p " << p << " m " << m;
    for (const auto &[key, kinds] : seen)
      EXPECT_EQ(kinds,
                (std::vector<PassKind>{PassKind::Forward, PassKind::Backward,
                                       PassKind::BackwardWeight}))
          << "p " << p << " m " << m << " rank " << rank.stage;
    EXPECT_EQ(peakInflight(rank.schedule.flatten()),
              closedFormInflight(kind, p, rank.stage, m, options))
        << "p " << p << " m " << m << " rank " << rank.stage;
  }
  return r;
}

TEST(ScheduleTest, DualPipeVInvariants) {
  // checkVSchedule for p <= 12 and 2p <= m <= 40 (the peak: 2p + 1
  // chunk-microbatches on every device), with loops that do not grow with
  // m; fewer than 2p microbatches are refused.
  for (int p = 1; p <= 12; ++p)
    for (int64_t m = 2 * p; m <= 40; ++m) {
      ScheduleResult r = checkVSchedule(ScheduleKind::DualPipeV, p, m);
      ASSERT_TRUE(r.ok);
      for (const RankSchedule &rank : r.ranks)
        EXPECT_LE(rank.schedule.segments.size(), 12u);
    }
  ScheduleOptions two;
  two.chunks = 2;
  ScheduleResult few = generateSchedule(ScheduleKind::DualPipeV, 4, 7, two);
  EXPECT_FALSE(few.ok);
  EXPECT_NE(few.error.find("at least 2p microbatches"), std::string::npos)
      << few.error;
  // Device 0 of 2, m = 4: the phases of dualpipev.py (F0 F0; F0 F1;
  // B1 W F1; {F0 B1 F1 B0} pairs; B1 F1 B0; B1, B0 with its W deferred;
  // W, B0 deferred; the last W).
  ScheduleResult r2 = generateSchedule(ScheduleKind::DualPipeV, 2, 4, two);
  ASSERT_TRUE(r2.ok);
  std::string order;
  for (const SchedOp &op : r2.ranks[0].schedule.flatten())
    order += std::string(op.kind == PassKind::Forward    ? "F"
                         : op.kind == PassKind::Backward ? "B"
                                                         : "W") +
             std::to_string(op.microbatch) + "c" + std::to_string(op.chunk) +
             " ";
  EXPECT_EQ(order, "F0c0 F1c0 F2c0 F0c1 B0c1 W0c1 F1c1 F3c0 B1c1 W1c1 F2c1 "
                   "B0c0 W0c0 B2c1 W2c1 F3c1 B1c0 W1c0 B3c1 W3c1 B2c0 W2c0 "
                   "B3c0 W3c0 ");
}

TEST(ScheduleTest, ZeroBubbleVInvariants) {
  // checkVSchedule for p <= 16, m <= 40: the in-flight peak is
  // min(m + 1 + r, 2m, 2p).
  for (int p = 1; p <= 16; ++p)
    for (int64_t m = 1; m <= 40; ++m)
      ASSERT_TRUE(checkVSchedule(ScheduleKind::ZeroBubbleV, p, m).ok);
  ScheduleOptions one;
  EXPECT_FALSE(generateSchedule(ScheduleKind::ZeroBubbleV, 4, 8, one).ok);
  // The V: device 0 runs the first and the last of the 2p stages.
  EXPECT_EQ(positionOfStage(Placement::V, 4, 7), 0);
  EXPECT_EQ(positionOfStage(Placement::V, 4, 4), 3);
  EXPECT_EQ(stageOfChunk(Placement::V, 4, 1, 1), 6);
  EXPECT_EQ(chunkOfStage(Placement::V, 4, 5), 1);
  EXPECT_EQ(stageOfChunk(Placement::Loop, 4, 1, 1), 5);
}
