//===- schedule_csv_test.cpp - torch compute-only schedule CSVs -----------===//
//
// Every synchronous generator's schedule written as a CSV and read back is
// the same program; hand-written files in torch's format are read, and each
// malformed, misplaced, incomplete or deadlocking one is refused naming the
// rank and step.
//
//===----------------------------------------------------------------------===//

#include "pipec/Schedule.h"

#include <gtest/gtest.h>

using namespace pipec;

namespace {

void expectSamePrograms(const ScheduleResult &a, const ScheduleResult &b) {
  ASSERT_EQ(a.ranks.size(), b.ranks.size());
  for (size_t r = 0; r < a.ranks.size(); ++r)
    EXPECT_EQ(a.ranks[r].schedule.flatten(), b.ranks[r].schedule.flatten())
        << "rank " << r;
}

std::string errorOf(const std::string &csv) {
  CsvSchedule parsed = parseScheduleCsv(csv);
  EXPECT_FALSE(parsed.ok) << csv;
  return parsed.error;
}

} // namespace

TEST(ScheduleCsvTest, CustomKindName) {
  EXPECT_EQ(parseScheduleKind("custom"), ScheduleKind::Custom);
  EXPECT_TRUE(isFlushSchedule(ScheduleKind::Custom));
  ScheduleResult none = generateSchedule(ScheduleKind::Custom, 2, 4, {});
  EXPECT_FALSE(none.ok);
  EXPECT_NE(none.error.find("--schedule-csv"), std::string::npos);
}

TEST(ScheduleCsvTest, RoundTripOfEveryFlushGenerator) {
  struct Case {
    ScheduleKind kind;
    int p, chunks;
    int64_t m;
  };
  const Case cases[] = {{ScheduleKind::GPipe, 4, 1, 8},
                        {ScheduleKind::OneFOneBFlush, 4, 1, 8},
                        {ScheduleKind::OneFOneBFlush, 3, 1, 2},
                        {ScheduleKind::Interleaved, 4, 2, 8},
                        {ScheduleKind::Interleaved, 2, 3, 4},
                        {ScheduleKind::ZeroBubbleH1, 4, 1, 8},
                        {ScheduleKind::ZeroBubbleH2, 4, 1, 8},
                        {ScheduleKind::ZeroBubbleH2, 3, 1, 2},
                        {ScheduleKind::GPipe, 1, 1, 3}};
  for (const Case &c : cases) {
    ScheduleOptions options;
    options.chunks = c.chunks;
    ScheduleResult generated = generateSchedule(c.kind, c.p, c.m, options);
    ASSERT_TRUE(generated.ok) << generated.error;
    std::string error;
    std::string csv = scheduleToCsv(generated, error);
    ASSERT_TRUE(error.empty()) << error;
    CsvSchedule parsed = parseScheduleCsv(csv);
    ASSERT_TRUE(parsed.ok) << scheduleKindName(c.kind) << ": " << parsed.error
                           << "\n"
                           << csv;
    EXPECT_EQ(parsed.schedule.kind, ScheduleKind::Custom);
    EXPECT_EQ(parsed.schedule.stages, c.p);
    EXPECT_EQ(parsed.schedule.chunks, c.chunks);
    EXPECT_EQ(parsed.schedule.microbatches, c.m);
    EXPECT_EQ(parsed.splitBackward, c.kind == ScheduleKind::ZeroBubbleH1 ||
                                        c.kind == ScheduleKind::ZeroBubbleH2);
    expectSamePrograms(parsed.schedule, generated);
    // And out again, byte for byte.
    EXPECT_EQ(scheduleToCsv(parsed.schedule, error), csv);
  }
}

TEST(ScheduleCsvTest, WritesTorchActions) {
  ScheduleResult gpipe = generateSchedule(ScheduleKind::GPipe, 2, 2, {});
  std::string error;
  EXPECT_EQ(scheduleToCsv(gpipe, error), "0F0,0F1,0B0,0B1\n1F0,1F1,1B0,1B1\n");
  ScheduleOptions two;
  two.chunks = 2;
  ScheduleResult interleaved =
      generateSchedule(ScheduleKind::Interleaved, 2, 2, two);
  std::string csv = scheduleToCsv(interleaved, error);
  // Rank 1 runs stages 1 and 3.
  EXPECT_NE(csv.find("3F0"), std::string::npos) << csv;
  EXPECT_EQ(csv.substr(0, csv.find('\n')).find('3'), std::string::npos) << csv;
  ScheduleResult zb = generateSchedule(ScheduleKind::ZeroBubbleH1, 2, 2, {});
  csv = scheduleToCsv(zb, error);
  EXPECT_NE(csv.find("1I0"), std::string::npos) << csv;
  EXPECT_NE(csv.find("1W0"), std::string::npos) << csv;
  EXPECT_EQ(csv.find('B'), std::string::npos) << csv;
}

TEST(ScheduleCsvTest, RefusesWhatTorchCannotRun) {
  std::string error;
  ScheduleResult pipedream = generateSchedule(ScheduleKind::OneFOneB, 2, 4, {});
  EXPECT_EQ(scheduleToCsv(pipedream, error), "");
  EXPECT_NE(error.find("1f1b-flush"), std::string::npos) << error;
  ScheduleOptions replicas;
  replicas.replicas = {2, 1};
  ScheduleResult rr =
      generateSchedule(ScheduleKind::OneFOneBFlush, 2, 4, replicas);
  ASSERT_TRUE(rr.ok) << rr.error;
  error.clear();
  EXPECT_EQ(scheduleToCsv(rr, error), "");
  EXPECT_NE(error.find("stage 0 has 2 replicas"), std::string::npos) << error;
}

TEST(ScheduleCsvTest, ReadsIdleCellsSplitBackwardsAndQuotes) {
  // Idle slots (empty cells) as torch's own dumps have them; B mixed with
  // I/W across stages: a B of a split schedule is I then W.
  CsvSchedule parsed = parseScheduleCsv(",0F0,,0F1,0B0,0I1,0W1\r\n"
                                        "1F0, 1I0 ,1F1,'1W0',1B1\n\n");
  ASSERT_TRUE(parsed.ok) << parsed.error;
  EXPECT_TRUE(parsed.splitBackward);
  EXPECT_EQ(parsed.schedule.stages, 2);
  EXPECT_EQ(parsed.schedule.microbatches, 2);
  const std::vector<SchedOp> rank0 =
      parsed.schedule.ranks[0].schedule.flatten();
  ASSERT_EQ(rank0.size(), 6u);
  EXPECT_EQ(rank0[2], (SchedOp{PassKind::Backward, 0, 0}));
  EXPECT_EQ(rank0[3], (SchedOp{PassKind::BackwardWeight, 0, 0}));
  EXPECT_EQ(parsed.columns[0], (std::vector<int>{1, 3, 4, 4, 5, 6}));
  EXPECT_EQ(peakInflight(rank0), 2);
}

TEST(ScheduleCsvTest, DeadlockNamesRanksAndSteps) {
  // Rank 1 wants microbatch 1 first; rank 0 sends it only after the
  // backward of microbatch 0, which waits for rank 1.
  std::string error = errorOf("0F0,0B0,0F1,0B1\n1F1,1B1,1F0,1B0\n");
  EXPECT_NE(error.find("deadlock"), std::string::npos) << error;
  EXPECT_NE(error.find("rank 0 step 1 (0B0)"), std::string::npos) << error;
  EXPECT_NE(error.find("rank 1 step 0 (1F1)"), std::string::npos) << error;
}

TEST(ScheduleCsvTest, RefusesMalformedAndIncompleteFiles) {
  EXPECT_NE(errorOf("").find("no actions"), std::string::npos);
  std::string e = errorOf("0F0,0SEND_F0,0B0\n");
  EXPECT_NE(e.find("rank 0 step 1"), std::string::npos) << e;
  EXPECT_NE(e.find("compute_only"), std::string::npos) << e;
  e = errorOf("0F0,0X0\n");
  EXPECT_NE(e.find("'0X0' is not an action"), std::string::npos) << e;
  // Neither a loop nor a V: rank 0 holds stages 0 and 1.
  e = errorOf("0F0,1F0,1B0,0B0\n2F0,3F0,3B0,2B0\n");
  EXPECT_NE(e.find("rank 0 step 1: 1F0 runs stage 1 on rank 0"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("in a V"), std::string::npos) << e;
  e = errorOf("0F0,2F0,2B0,0B0\n1F0,1B0\n");
  EXPECT_NE(e.find("3 stages on 2 ranks"), std::string::npos) << e;
  e = errorOf("0F0,0F1,0B0\n1F0,1F1,1B0,1B1\n");
  EXPECT_NE(e.find("rank 0: no backward (0B1, or 0I1 and 0W1) of stage 0 "
                   "microbatch 1"),
            std::string::npos)
      << e;
  e = errorOf("0F0,0B0\n1F0,1B0\n0F0\n");
  EXPECT_NE(e.find("rank 2 step 0: 0F0 runs stage 0 on rank 2"),
            std::string::npos)
      << e;
  e = errorOf("0F0,0B0,0F0\n");
  EXPECT_NE(e.find("rank 0 step 2: 0F0 runs a second time (first at step 0)"),
            std::string::npos)
      << e;
  e = errorOf("0B0,0F0\n");
  EXPECT_NE(e.find("rank 0 step 0: 0B0 runs before the forward 0F0"),
            std::string::npos)
      << e;
  e = errorOf("0F0,0W0,0I0\n");
  EXPECT_NE(e.find("0W0 runs before its input gradient 0I0"), std::string::npos)
      << e;
  e = errorOf("0F0,0I0,0B0\n");
  EXPECT_NE(e.find("both a full backward (B) and a split one"),
            std::string::npos)
      << e;
  e = errorOf("0F0,0I0\n");
  EXPECT_NE(e.find("no weight gradient (0W0)"), std::string::npos) << e;
  e = errorOf("0F0,0B0\n\n1F0,1B0\n");
  EXPECT_NE(e.find("rank 1 has no actions"), std::string::npos) << e;
}

TEST(ScheduleCsvTest, ReadsAVPlacement) {
  // Rank 0 holds stages 0 and 3, rank 1 stages 1 and 2.
  CsvSchedule v = parseScheduleCsv("0F0,3F0,3B0,0B0\n1F0,2F0,2B0,1B0\n");
  ASSERT_TRUE(v.ok) << v.error;
  EXPECT_EQ(v.schedule.placement, Placement::V);
  EXPECT_EQ(v.schedule.chunks, 2);
  EXPECT_EQ(v.schedule.ranks[0].schedule.flatten()[1],
            (SchedOp{PassKind::Forward, 0, 1}));
  // zb-v written out and read back is the same program, in a V.
  ScheduleOptions two;
  two.chunks = 2;
  ScheduleResult zbv = generateSchedule(ScheduleKind::ZeroBubbleV, 4, 8, two);
  ASSERT_TRUE(zbv.ok) << zbv.error;
  std::string error;
  std::string csv = scheduleToCsv(zbv, error);
  EXPECT_NE(csv.substr(0, csv.find('\n')).find("7F0"), std::string::npos)
      << csv; // rank 0 runs the last stage
  CsvSchedule back = parseScheduleCsv(csv);
  ASSERT_TRUE(back.ok) << back.error;
  EXPECT_EQ(back.schedule.placement, Placement::V);
  EXPECT_TRUE(back.splitBackward);
  expectSamePrograms(back.schedule, zbv);
  // So is dualpipev.
  ScheduleResult dpv = generateSchedule(ScheduleKind::DualPipeV, 4, 8, two);
  ASSERT_TRUE(dpv.ok) << dpv.error;
  CsvSchedule dpvBack = parseScheduleCsv(scheduleToCsv(dpv, error));
  ASSERT_TRUE(dpvBack.ok) << dpvBack.error;
  EXPECT_EQ(dpvBack.schedule.placement, Placement::V);
  EXPECT_TRUE(dpvBack.splitBackward);
  expectSamePrograms(dpvBack.schedule, dpv);
}
