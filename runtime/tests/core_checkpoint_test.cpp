//===- core_checkpoint_test.cpp - Atomic checkpoints
//-----------------------===//
//
// Part of pipec's runtime tests.
//
//===----------------------------------------------------------------------===//

#include "core/checkpoint.h"
#include "core/error.h"
#include "pipec/formats/safetensors.h"
#include "core_test_util.h"

#include <gtest/gtest.h>

#include <cstring>

using namespace pipec;
using coretest::TempDir;

namespace {

rt::StageDesc stageWithWeights() {
  rt::StageDesc d;
  d.buildId = "b1d";
  d.stage = 2;
  d.arenaBytes = 128;
  d.weights = {{"w", 0, {2, 3}, 24}, {"b", 64, {3}, 12}};
  return d;
}

} // namespace

TEST(CoreCheckpoint, WritesStepFolderWithWeightsFromTheArena) {
  TempDir tmp;
  rt::StageDesc d = stageWithWeights();
  alignas(64) float arena[32] = {};
  for (int i = 0; i < 6; ++i)
    arena[i] = float(i) + 0.5f;
  arena[16] = -1, arena[17] = -2, arena[18] = -3;
  std::string folder = rt::writeStageCheckpoint(
      tmp / "ckpt", 42, d, reinterpret_cast<const char *>(arena));
  EXPECT_EQ(folder, tmp / "ckpt/step-000042");
  // Only the final file: no temporary left behind.
  EXPECT_EQ(coretest::listDir(folder),
            (std::set<std::string>{"stage2.safetensors"}));

  safetensors::File f;
  std::string error;
  ASSERT_TRUE(f.open(folder + "/stage2.safetensors", error)) << error;
  EXPECT_EQ(f.metadata().at("build_id"), "b1d");
  EXPECT_EQ(f.metadata().at("step"), "42");
  ASSERT_TRUE(f.find("w") && f.find("b"));
  EXPECT_EQ(f.find("w")->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(f.find("b")->dtype, "F32");
  float w[6], b[3];
  ASSERT_TRUE(f.read(*f.find("w"), w, error));
  ASSERT_TRUE(f.read(*f.find("b"), b, error));
  EXPECT_EQ(std::vector<float>(w, w + 6),
            (std::vector<float>{0.5f, 1.5f, 2.5f, 3.5f, 4.5f, 5.5f}));
  EXPECT_EQ(std::vector<float>(b, b + 3), (std::vector<float>{-1, -2, -3}));

  // The checkpoint loads back into a fresh arena.
  alignas(64) float again[32] = {};
  rt::loadWeights(d, folder + "/stage2.safetensors",
                  reinterpret_cast<char *>(again));
  EXPECT_EQ(std::memcmp(again, arena, sizeof(arena)), 0);
}

TEST(CoreCheckpoint, LatestNamesTheStepFolder) {
  TempDir tmp;
  rt::writeLatest(tmp.path().string(), 7);
  EXPECT_EQ(coretest::readBytes(tmp / "latest"), "step-000007\n");
  rt::writeLatest(tmp.path().string(), 1234567);
  EXPECT_EQ(coretest::readBytes(tmp / "latest"), "step-1234567\n");
  EXPECT_EQ(coretest::listDir(tmp.path()), (std::set<std::string>{"latest"}));
}

TEST(CoreCheckpoint, PartialFileIsNeverVisible) {
  TempDir tmp;
  std::string path = tmp / "stage0.safetensors";
  coretest::writeBytes(path, "old complete file");
  std::string error;
  // While the new content is being written, readers still see the old file;
  // the new one appears only once complete.
  bool ok = safetensors::writeFileAtomic(
      path,
      [&](std::FILE *f, std::string &) {
        std::fputs("new ", f);
        std::fflush(f);
        EXPECT_EQ(coretest::readBytes(path), "old complete file");
        std::fputs("complete file", f);
        return true;
      },
      error);
  ASSERT_TRUE(ok) << error;
  EXPECT_EQ(coretest::readBytes(path), "new complete file");
  EXPECT_EQ(coretest::listDir(tmp.path()),
            (std::set<std::string>{"stage0.safetensors"}));
}

TEST(CoreCheckpoint, FailedWriteLeavesNoTraceAndKeepsTheOldFile) {
  TempDir tmp;
  std::string fresh = tmp / "fresh.safetensors", old = tmp / "old.safetensors";
  coretest::writeBytes(old, "previous checkpoint");
  auto failHalfway = [](std::FILE *f, std::string &why) {
    std::fputs("half a fi", f);
    why = "disk full (simulated)";
    return false;
  };
  std::string error;
  EXPECT_FALSE(safetensors::writeFileAtomic(fresh, failHalfway, error));
  EXPECT_NE(error.find("disk full (simulated)"), std::string::npos) << error;
  EXPECT_NE(error.find("fresh.safetensors"), std::string::npos) << error;
  EXPECT_FALSE(safetensors::writeFileAtomic(old, failHalfway, error));
  EXPECT_EQ(coretest::readBytes(old), "previous checkpoint");
  EXPECT_EQ(coretest::listDir(tmp.path()),
            (std::set<std::string>{"old.safetensors"}));
}

TEST(CoreCheckpoint, UnwritableFolderIsAnError) {
  TempDir tmp;
  coretest::writeBytes(tmp / "file", "x");
  rt::StageDesc d = stageWithWeights();
  alignas(64) char arena[128] = {};
  try {
    // A regular file where the checkpoint folder should be.
    rt::writeStageCheckpoint(tmp / "file", 1, d, arena);
    FAIL() << "expected an error";
  } catch (const rt::RtError &e) {
    EXPECT_NE(std::string(e.what()).find("cannot create checkpoint folder"),
              std::string::npos)
        << e.what();
  }
}
