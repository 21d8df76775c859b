//===- export_test.cpp - Plans for Megatron-Core and torch ----------------===//
//
// Layer recognition in profiles (layer-level kinds, exporters' op names),
// the Megatron-Core layout string (E first, L last, runs grouped, layers cut
// by a stage boundary moved whole) and the torch schedule CSV of a plan.
//
//===----------------------------------------------------------------------===//

#include "pipec/Export.h"
#include "pipec/Schedule.h"

#include <gtest/gtest.h>

using namespace pipec;

namespace {

Profile layerProfile(int layers) {
  Profile profile;
  profile.ops.push_back({"embedding", "embedding", 1, 2, 8, 8, 8, {}});
  for (int l = 0; l < layers; ++l)
    profile.ops.push_back(
        {"layer" + std::to_string(l + 1), "transformer", 1, 2, 8, 8, 8, {}});
  profile.ops.push_back({"head", "linear_loss", 1, 2, 8, 8, 8, {}});
  return profile;
}

Plan planOf(std::vector<std::pair<int, int>> ranges, int chunks = 1,
            const std::string &schedule = "1f1b-flush") {
  Plan plan;
  plan.algorithm = "test";
  plan.schedule = schedule;
  plan.microbatches = 8;
  plan.microbatchSize = 2;
  plan.chunks = chunks;
  int device = 0;
  for (auto [first, last] : ranges)
    plan.stages.push_back({first, last, 1, {device++}, ""});
  return plan;
}

std::string layoutOf(const std::string &text) {
  const std::string key = "--pipeline-model-parallel-layout \"";
  size_t at = text.find(key);
  if (at == std::string::npos)
    return "";
  at += key.size();
  return text.substr(at, text.find('"', at) - at);
}

} // namespace

TEST(ExportTest, LayersFromKindsAndNames) {
  EXPECT_EQ(transformerLayerOfOps(layerProfile(3)),
            (std::vector<int>{-1, 0, 1, 2, -2}));
  Profile named;
  for (const char *name :
       {"/wte/Gather_1", "/h.0.ln_1/LayerNorm", "/h.0.attn/MatMul", "/Add_7",
        "/h.1/attn/MatMul", "model.layers.2.mlp", "/ln_f/LayerNorm", "loss"})
    named.ops.push_back({name, "x", 1, 1, 1, 0, 0, {}});
  EXPECT_EQ(transformerLayerOfOps(named),
            (std::vector<int>{-1, 0, 0, 0, 1, 2, -2, -2}));
  Profile cnn;
  cnn.ops.push_back({"conv1", "conv", 1, 1, 1, 0, 0, {}});
  cnn.ops.push_back({"layer1.0.conv1x", "conv", 1, 1, 1, 0, 0, {}});
  // torchvision's "layer1.0" is a ResNet stage, not a layer index.
  EXPECT_TRUE(transformerLayerOfOps(cnn).empty());
}

TEST(ExportTest, MegatronLayoutGroupsRuns) {
  Profile profile = layerProfile(8); // ops 0 (E), 1..8 (t), 9 (L)
  ExportResult r =
      exportMegatronLayout(profile, planOf({{0, 2}, {3, 4}, {5, 6}, {7, 9}}));
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(layoutOf(r.text), "Ett|(tt|)*2,ttL") << r.text;
  EXPECT_NE(r.text.find("--pipeline-model-parallel-size 4"), std::string::npos);
  EXPECT_NE(r.text.find("--num-layers 8"), std::string::npos);
  EXPECT_NE(r.text.find("--global-batch-size 16"), std::string::npos);
  EXPECT_TRUE(r.notes.empty());
  // Interleaved: 2 devices x 2 chunks, stages in virtual-stage order.
  r = exportMegatronLayout(
      profile, planOf({{0, 4}, {5, 5}, {6, 6}, {7, 9}}, 2, "interleaved"));
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(layoutOf(r.text), "Et*4|(t|)*2,ttL") << r.text;
  EXPECT_NE(r.text.find("--pipeline-model-parallel-size 2"), std::string::npos);
  // One stage.
  r = exportMegatronLayout(profile, planOf({{0, 9}}));
  EXPECT_EQ(layoutOf(r.text), "Et*8L") << r.text;
}

TEST(ExportTest, MegatronMovesCutLayersWhole) {
  Profile profile;
  profile.ops.push_back({"/wte/Gather", "gather", 1, 1, 1, 0, 0, {}});
  for (int l = 0; l < 2; ++l)
    for (double t : {1.0, 3.0})
      profile.ops.push_back(
          {"/h." + std::to_string(l) + "/op", "matmul", t, t, 1, 0, 0, {}});
  profile.ops.push_back({"loss", "loss", 1, 1, 1, 0, 0, {}});
  // Ops: 0 E, 1-2 layer 0 (1 s, 3 s), 3-4 layer 1, 5 L. The cut after op 3
  // splits layer 1: its 3 s op is on stage 1, so the layer goes there.
  ExportResult r = exportMegatronLayout(profile, planOf({{0, 3}, {4, 5}}));
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(layoutOf(r.text), "Et|tL") << r.text;
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_NE(
      r.notes[0].find("transformer layer 1 is cut between stages 0 and 1"),
      std::string::npos)
      << r.notes[0];
}

TEST(ExportTest, MegatronRefusals) {
  Profile profile = layerProfile(4);
  Plan plan = planOf({{0, 2}, {3, 5}});
  plan.stages[0].replicas = 2;
  plan.stages[0].devices = {0, 2};
  ExportResult r = exportMegatronLayout(profile, plan);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("same count"), std::string::npos) << r.error;
  Profile cnn;
  cnn.ops.push_back({"conv", "conv", 1, 1, 1, 0, 0, {}});
  r = exportMegatronLayout(cnn, planOf({{0, 0}}));
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("no transformer layers"), std::string::npos);
  r = exportMegatronLayout(profile, planOf({{0, 2}}));
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("does not fit the profile"), std::string::npos);
}

TEST(ExportTest, TorchScheduleReadsBack) {
  ExportResult r =
      exportTorchSchedule(planOf({{0, 1}, {2, 3}, {4, 5}}, 1, "zb-h1"));
  ASSERT_TRUE(r.ok) << r.error;
  CsvSchedule back = parseScheduleCsv(r.text);
  ASSERT_TRUE(back.ok) << back.error;
  EXPECT_TRUE(back.splitBackward);
  EXPECT_EQ(back.schedule.stages, 3);
  EXPECT_EQ(back.schedule.microbatches, 8);
  ScheduleResult zb = generateSchedule(ScheduleKind::ZeroBubbleH1, 3, 8, {});
  for (size_t rank = 0; rank < 3; ++rank)
    EXPECT_EQ(back.schedule.ranks[rank].schedule.flatten(),
              zb.ranks[rank].schedule.flatten());
  r = exportTorchSchedule(planOf({{0, 1}, {2, 5}}, 1, "2bw"));
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("1f1b-flush"), std::string::npos) << r.error;
}
