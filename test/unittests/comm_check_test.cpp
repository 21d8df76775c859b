//===- comm_check_test.cpp - message-level rank program checker tests -----===//
//
// checkCommunication on rank programs derived from the generated schedules
// (which must pass), and on deliberately broken ones: a missing receive, a
// missing send, swapped order on one link, a type mismatch, receive-before-
// send cycles, and an invalid peer.
//
//===----------------------------------------------------------------------===//

#include "pipec/Schedule.h"

#include <gtest/gtest.h>

#include <algorithm>

using namespace pipec;

namespace {

constexpr int64_t kActivation = 0; ///< forward boundary channel
constexpr int64_t kGradient = 1;   ///< backward boundary channel

/// The rank programs of a one-replica-per-stage pipeline: a forward
/// receives from the previous stage and sends to the next, a backward
/// receives from the next and sends to the previous.
std::vector<std::vector<CommEvent>>
commPrograms(const std::vector<StageSchedule> &stages) {
  int p = static_cast<int>(stages.size());
  std::vector<std::vector<CommEvent>> programs(p);
  for (int s = 0; s < p; ++s) {
    int opIndex = 0;
    for (const SchedOp &op : stages[s].flatten()) {
      std::string where =
          "stage" + std::to_string(s) + " op " + std::to_string(opIndex++);
      int64_t mb = op.microbatch;
      if (op.kind == PassKind::Forward) {
        if (s > 0)
          programs[s].push_back({CommEvent::Recv, s - 1, kActivation, mb,
                                 "tensor<4x16xf32>", where});
        if (s + 1 < p)
          programs[s].push_back({CommEvent::Send, s + 1, kActivation, mb,
                                 "tensor<4x16xf32>", where});
      } else {
        if (s + 1 < p)
          programs[s].push_back({CommEvent::Recv, s + 1, kGradient, mb,
                                 "tensor<4x16xf32>", where});
        if (s > 0)
          programs[s].push_back({CommEvent::Send, s - 1, kGradient, mb,
                                 "tensor<4x16xf32>", where});
      }
    }
  }
  return programs;
}

/// Index of the event of `rank` matching the given description.
size_t findEvent(const std::vector<CommEvent> &program, CommEvent::Kind kind,
                 int peer, int64_t channel, int64_t mb) {
  for (size_t i = 0; i < program.size(); ++i)
    if (program[i].kind == kind && program[i].peer == peer &&
        program[i].channel == channel && program[i].microbatch == mb)
      return i;
  ADD_FAILURE() << "no such event";
  return 0;
}

std::string joined(const CommCheckResult &result) {
  std::string text;
  for (const std::string &error : result.errors)
    text += error + "\n";
  return text;
}

bool contains(const std::string &text, const std::string &needle) {
  return text.find(needle) != std::string::npos;
}

std::vector<std::vector<CommEvent>> oneFOneB4() {
  return commPrograms(generateSchedule(ScheduleKind::OneFOneBFlush, 4, 8));
}

} // namespace

TEST(CommCheckTest, GeneratedSchedulesPass) {
  for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneBFlush})
    for (int p = 1; p <= 8; ++p)
      for (int64_t m = 1; m <= 10; ++m) {
        CommCheckResult result =
            checkCommunication(commPrograms(generateSchedule(kind, p, m)));
        EXPECT_TRUE(result.ok)
            << scheduleKindName(kind) << " p=" << p << " m=" << m << "\n"
            << joined(result);
      }
  EXPECT_TRUE(checkCommunication({}).ok);
}

TEST(CommCheckTest, CorrectOneFOneBFourStages) {
  CommCheckResult result = checkCommunication(oneFOneB4());
  EXPECT_TRUE(result.ok) << joined(result);
  EXPECT_TRUE(result.errors.empty());
}

TEST(CommCheckTest, MissingReceive) {
  auto programs = oneFOneB4();
  auto &rank1 = programs[1];
  rank1.erase(rank1.begin() +
              findEvent(rank1, CommEvent::Recv, 0, kActivation, 3));
  CommCheckResult result = checkCommunication(programs);
  EXPECT_FALSE(result.ok);
  ASSERT_EQ(result.errors.size(), 1u) << joined(result);
  EXPECT_TRUE(contains(result.errors[0],
                       "send never received: rank 0 sends 'tensor<4x16xf32>' "
                       "to rank 1 (channel 0, mb 3, at 'stage0 op 3')"))
      << result.errors[0];
}

TEST(CommCheckTest, MissingSendOfLastMessage) {
  // Rank 2 finishes without sending the last gradient to rank 1: rank 1's
  // receive is never matched, and rank 0 waits on rank 1.
  auto programs = oneFOneB4();
  auto &rank2 = programs[2];
  rank2.erase(rank2.begin() +
              findEvent(rank2, CommEvent::Send, 1, kGradient, 7));
  CommCheckResult result = checkCommunication(programs);
  EXPECT_FALSE(result.ok);
  std::string text = joined(result);
  EXPECT_TRUE(contains(text, "receive never matched: rank 1 waits for rank 2 "
                             "(channel 1, mb 7"))
      << text;
  EXPECT_TRUE(contains(text, "rank 2 finished without sending it")) << text;
  EXPECT_TRUE(contains(text, "deadlock: rank 0 waits for rank 1 (channel 1, "
                             "mb 7"))
      << text;
  EXPECT_TRUE(contains(text, "blocked itself")) << text;
  EXPECT_EQ(result.errors.size(), 2u) << text;
}

TEST(CommCheckTest, SwappedOrderOnOneLink) {
  // Rank 1 receives mb 1 before mb 0 from rank 0. Matching is by key, so
  // execution completes, but an in-order transport would pair them wrongly.
  auto programs = oneFOneB4();
  auto &rank1 = programs[1];
  size_t a = findEvent(rank1, CommEvent::Recv, 0, kActivation, 0);
  size_t b = findEvent(rank1, CommEvent::Recv, 0, kActivation, 1);
  std::swap(rank1[a], rank1[b]);
  CommCheckResult result = checkCommunication(programs);
  EXPECT_FALSE(result.ok);
  ASSERT_EQ(result.errors.size(), 1u) << joined(result);
  EXPECT_TRUE(contains(result.errors[0],
                       "link order mismatch on rank 0 -> rank 1 channel 0: "
                       "message 0 sent is (channel 0, mb 0"))
      << result.errors[0];
  EXPECT_TRUE(contains(result.errors[0], "message 0 received is (channel 0, "
                                         "mb 1"))
      << result.errors[0];
}

TEST(CommCheckTest, TypeMismatch) {
  auto programs = oneFOneB4();
  auto &rank3 = programs[3];
  rank3[findEvent(rank3, CommEvent::Recv, 2, kActivation, 5)].type =
      "tensor<4x16xf16>";
  CommCheckResult result = checkCommunication(programs);
  EXPECT_FALSE(result.ok);
  ASSERT_EQ(result.errors.size(), 1u) << joined(result);
  EXPECT_TRUE(contains(result.errors[0],
                       "type mismatch: rank 2 sends 'tensor<4x16xf32>' to "
                       "rank 3 (channel 0, mb 5"))
      << result.errors[0];
  EXPECT_TRUE(
      contains(result.errors[0], "but the receive expects 'tensor<4x16xf16>'"))
      << result.errors[0];
}

TEST(CommCheckTest, ReceiveBeforeSendCycleBetweenTwoRanks) {
  std::vector<std::vector<CommEvent>> programs = {
      {{CommEvent::Recv, 1, 7, 0, "f32", "r0 recv"},
       {CommEvent::Send, 1, 5, 0, "f32", "r0 send"}},
      {{CommEvent::Recv, 0, 5, 0, "f32", "r1 recv"},
       {CommEvent::Send, 0, 7, 0, "f32", "r1 send"}},
  };
  CommCheckResult result = checkCommunication(programs);
  EXPECT_FALSE(result.ok);
  ASSERT_EQ(result.errors.size(), 1u) << joined(result);
  EXPECT_EQ(result.errors[0],
            "deadlock: rank 0 waits for rank 1 (channel 7, mb 0, at 'r0 "
            "recv') -> rank 1 waits for rank 0 (channel 5, mb 0, at 'r1 "
            "recv') -> back to rank 0");
}

TEST(CommCheckTest, CycleInsideFourStagePipeline) {
  // Rank 1 waits for the gradient of mb 0 before sending the activation of
  // mb 1, but rank 2 computes F1 before B0: ranks 1 and 2 wait for each
  // other, ranks 0 and 3 wait on them.
  auto programs = oneFOneB4();
  auto &rank1 = programs[1];
  size_t recvGrad = findEvent(rank1, CommEvent::Recv, 2, kGradient, 0);
  CommEvent moved = rank1[recvGrad];
  rank1.erase(rank1.begin() + recvGrad);
  size_t sendAct = findEvent(rank1, CommEvent::Send, 2, kActivation, 1);
  rank1.insert(rank1.begin() + sendAct, moved);

  CommCheckResult result = checkCommunication(programs);
  EXPECT_FALSE(result.ok);
  std::string text = joined(result);
  EXPECT_TRUE(contains(text, "deadlock: rank 1 waits for rank 2 (channel 1, "
                             "mb 0, at 'stage1 op 3') -> rank 2 waits for "
                             "rank 1 (channel 0, mb 1"))
      << text;
  EXPECT_TRUE(contains(text, "deadlock: rank 0 waits for rank 1")) << text;
  EXPECT_TRUE(contains(text, "deadlock: rank 3 waits for rank 2")) << text;
  // Sends stuck behind the deadlock are not reported as unmatched.
  EXPECT_FALSE(contains(text, "never received")) << text;
  EXPECT_EQ(result.errors.size(), 3u) << text;
}

TEST(CommCheckTest, SameRankPairBothDirections) {
  // p = 2: one rank pair carries activations one way and gradients the
  // other; channels keep them apart.
  for (int64_t m = 1; m <= 6; ++m) {
    auto programs =
        commPrograms(generateSchedule(ScheduleKind::OneFOneBFlush, 2, m));
    EXPECT_TRUE(checkCommunication(programs).ok);
    // A gradient received on the activation channel never matches.
    auto &rank0 = programs[0];
    rank0[findEvent(rank0, CommEvent::Recv, 1, kGradient, 0)].channel =
        kActivation;
    CommCheckResult broken = checkCommunication(programs);
    EXPECT_FALSE(broken.ok);
    EXPECT_TRUE(
        contains(joined(broken), "rank 0 waits for rank 1 (channel 0, mb 0"))
        << joined(broken);
  }
}

TEST(CommCheckTest, InvalidPeer) {
  std::vector<std::vector<CommEvent>> programs = {
      {{CommEvent::Send, 3, 0, 0, "f32", "bad send"}}, {}};
  CommCheckResult result = checkCommunication(programs);
  EXPECT_FALSE(result.ok);
  ASSERT_EQ(result.errors.size(), 1u) << joined(result);
  EXPECT_TRUE(contains(result.errors[0], "names peer 3 but there are 2 ranks"))
      << result.errors[0];
}

TEST(CommCheckTest, DuplicateMessagesMatchInOrder) {
  // Two identical sends and two identical receives: both match, no error.
  std::vector<std::vector<CommEvent>> programs = {
      {{CommEvent::Send, 1, 0, 0, "a", "s1"},
       {CommEvent::Send, 1, 0, 0, "a", "s2"}},
      {{CommEvent::Recv, 0, 0, 0, "a", "r1"},
       {CommEvent::Recv, 0, 0, 0, "a", "r2"}}};
  EXPECT_TRUE(checkCommunication(programs).ok);
  // A third receive has no partner.
  programs[1].push_back({CommEvent::Recv, 0, 0, 0, "a", "r3"});
  CommCheckResult result = checkCommunication(programs);
  ASSERT_EQ(result.errors.size(), 1u) << joined(result);
  EXPECT_TRUE(contains(result.errors[0], "receive never matched"));
}

TEST(CommCheckTest, ManyErrorsAreCapped) {
  // Rank 1 of a 2-stage GPipe with 100 microbatches receives nothing.
  auto programs = commPrograms(generateSchedule(ScheduleKind::GPipe, 2, 100));
  auto &rank1 = programs[1];
  rank1.erase(std::remove_if(
                  rank1.begin(), rank1.end(),
                  [](const CommEvent &e) { return e.kind == CommEvent::Recv; }),
              rank1.end());
  CommCheckResult result = checkCommunication(programs);
  EXPECT_FALSE(result.ok);
  ASSERT_EQ(result.errors.size(), 21u) << joined(result);
  EXPECT_EQ(result.errors.back(), "... and 80 more unmatched send errors");
}

TEST(CommCheckTest, LargePipeline) {
  // 100 ranks x 2,000 microbatches: ~800,000 events. Must finish quickly
  // (linear-time checker); no timing assertion here.
  auto programs =
      commPrograms(generateSchedule(ScheduleKind::OneFOneBFlush, 100, 2000));
  CommCheckResult result = checkCommunication(programs);
  EXPECT_TRUE(result.ok) << joined(result);
}

// A schedule that failed to generate (gpipe with two steps) has no programs
// (it used to index its empty replica list).
TEST(CommCheckTest, FailedScheduleHasNoPrograms) {
  ScheduleOptions options;
  options.steps = 2;
  ScheduleResult failed = generateSchedule(ScheduleKind::GPipe, 3, 4, options);
  ASSERT_FALSE(failed.ok);
  EXPECT_TRUE(scheduleCommPrograms(failed).empty());
}
