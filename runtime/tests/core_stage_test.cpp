//===- core_stage_test.cpp - Stage description, manifest, flags -----------===//
//
// Part of pipec's runtime tests.
//
//===----------------------------------------------------------------------===//

#include "core/error.h"
#include "core/options.h"
#include "core/stage.h"
#include "core_test_util.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

using namespace pipec;
using namespace pipec::rt;
using Json = nlohmann::json;

namespace {

Json validDesc() {
  return Json::parse(R"({
    "format": "pipec.stage/2", "abi": 3, "build_id": "3f9a",
    "stage": 1, "num_stages": 2,
    "microbatches": 4, "microbatch": 2, "global_batch": 8,
    "schedule": "gpipe", "arena_bytes": 1024,
    "policy": {"update": "flush", "flush": true, "versions_kept": 1},
    "weights": [{"name": "fc.weight", "offset": 0, "shape": [4, 3], "dtype": "f32"},
                {"name": "fc.bias", "offset": 64, "shape": [3]}],
    "feeds": [{"kind": "labels", "name": "labels", "shape": [2], "dtype": "i64", "classes": 3}],
    "loss": true,
    "ops": [{"name": "/fc/Gemm", "op": "Gemm", "out_bytes": 24, "param_bytes": 60,
             "saved_bytes": 32, "inputs": ["/in"]}, {"name": "/loss", "op": "SCE"}]
  })");
}

Json validManifest() {
  return Json::parse(R"({
    "format": "pipec.manifest/1", "build_id": "3f9a", "num_ranks": 2,
    "microbatches": 4, "microbatch": 2, "global_batch": 8,
    "stages": [{"stage": 0, "binary": "stage0", "weights": "weights/stage0.safetensors", "ranks": [0]},
               {"stage": 1, "binary": "stage1", "weights": "weights/stage1.safetensors", "ranks": [1]}],
    "inputs": [{"name": "x", "shape": [8, 4], "dtype": "f32"}]
  })");
}

std::string descError(const Json &j) {
  try {
    parseStageDesc(j.dump());
  } catch (const RtError &e) {
    return e.what();
  }
  return "(no error)";
}

/// Writes `m` as manifest.json into `dir` and checks it against `desc`.
std::string manifestError(const coretest::TempDir &dir, const Json &m,
                          const Json &desc, int rank, int worldSize) {
  coretest::writeBytes(dir / "manifest.json", m.dump());
  try {
    checkManifest(parseStageDesc(desc.dump()),
                  readManifest(dir / "manifest.json"), rank, worldSize);
  } catch (const RtError &e) {
    return e.what();
  }
  return "(no error)";
}

bool contains(const std::string &s, const std::string &part) {
  return s.find(part) != std::string::npos;
}

} // namespace

TEST(CoreStageDesc, ParsesTheDocumentedExample) {
  StageDesc d = parseStageDesc(validDesc().dump());
  EXPECT_EQ(d.buildId, "3f9a");
  EXPECT_EQ(d.stage, 1);
  EXPECT_EQ(d.numStages, 2);
  EXPECT_EQ(d.globalBatch, 8);
  ASSERT_EQ(d.weights.size(), 2u);
  EXPECT_EQ(d.weights[0].bytes, 48);
  EXPECT_EQ(d.weights[1].offset, 64);
  ASSERT_EQ(d.feeds.size(), 1u);
  EXPECT_EQ(d.feeds[0].kind, FeedSpec::Kind::Labels);
  EXPECT_EQ(d.feeds[0].bytes, 16);
  EXPECT_EQ(d.feeds[0].classes, 3);
  EXPECT_TRUE(d.loss);
  ASSERT_EQ(d.ops.size(), 2u);
  EXPECT_EQ(d.ops[0].savedBytes, 32);
  EXPECT_EQ(d.ops[0].inputs, std::vector<std::string>{"/in"});
  EXPECT_TRUE(d.ops[1].inputs.empty());
  EXPECT_EQ(d.policy.update, formats::UpdateRule::Flush);
  EXPECT_TRUE(d.policy.flush);
  EXPECT_EQ(d.policy.versionsKept, 1);
  // A continuous stage: 2BW keeps two versions.
  Json j = validDesc();
  j["policy"] = Json::parse(R"({"update": "2bw", "flush": false, "versions_kept": 2})");
  StageDesc c = parseStageDesc(j.dump());
  EXPECT_EQ(c.policy.update, formats::UpdateRule::TwoBW);
  EXPECT_FALSE(c.policy.flush);
  EXPECT_EQ(c.policy.versionsKept, 2);
}

TEST(CoreStageDesc, SplitReplicasHoldFloorSlices) {
  // 7 samples over 3 replicas: [0, 2), [2, 4), [4, 7).
  Json j = validDesc();
  j["microbatches"] = 1;
  j["microbatch"] = 7;
  j["global_batch"] = 7;
  j["replicas"] = 3;
  j["replica_split"] = true;
  const int64_t first[] = {0, 2, 4}, size[] = {2, 2, 3};
  for (int r = 0; r < 3; ++r) {
    j["replica"] = r;
    j["feeds"][0]["shape"] = {size[r]};
    StageDesc d = parseStageDesc(j.dump());
    EXPECT_TRUE(d.replicaSplit);
    EXPECT_EQ(d.sliceFirst, first[r]);
    EXPECT_EQ(d.sliceSize, size[r]);
    EXPECT_EQ(d.feeds[0].bytes, size[r] * 8);
  }
  // A feed of the whole microbatch on a split replica is refused.
  j["feeds"][0]["shape"] = {7};
  EXPECT_TRUE(contains(descError(j), "split over 3 replicas (3)"));
  // More replicas than samples.
  j["replicas"] = 8;
  j["replica"] = 0;
  EXPECT_TRUE(contains(descError(j), "8 split replicas but a microbatch has "
                                     "only 7 samples"));
  // Without the flag the slice is the whole microbatch.
  StageDesc rr = parseStageDesc(validDesc().dump());
  EXPECT_FALSE(rr.replicaSplit);
  EXPECT_EQ(rr.sliceFirst, 0);
  EXPECT_EQ(rr.sliceSize, 2);
}

TEST(CoreStageDesc, RejectsInconsistentDescriptions) {
  Json j = validDesc();
  j["format"] = "pipec.stage/1";
  EXPECT_TRUE(contains(descError(j), "this runtime reads \"pipec.stage/2\""));
  // The policy: required, a known update rule, agreeing with "flush".
  j = validDesc();
  j.erase("policy");
  EXPECT_TRUE(contains(descError(j), "lacks \"policy\""));
  j = validDesc();
  j["policy"]["update"] = "sometimes";
  EXPECT_TRUE(contains(descError(j), "unknown update rule \"sometimes\""));
  j = validDesc();
  j["policy"]["flush"] = false;
  EXPECT_TRUE(contains(descError(j), "\"flush\" and \"flush\": false disagree"));
  j = validDesc();
  j["abi"] = 7;
  EXPECT_TRUE(contains(descError(j), "runtime ABI 7"));
  j = validDesc();
  j["global_batch"] = 9;
  EXPECT_TRUE(contains(descError(j), "!= global_batch (9)"));
  j = validDesc();
  j["weights"][1]["offset"] = 1020;
  EXPECT_TRUE(contains(descError(j), "'fc.bias' at offset 1020"));
  j = validDesc();
  j["feeds"][0]["shape"] = {3};
  EXPECT_TRUE(contains(descError(j), "microbatch size 2"));
  j = validDesc();
  j["feeds"][0]["dtype"] = "f32";
  EXPECT_TRUE(contains(descError(j), "labels must be i64"));
  j = validDesc();
  j.erase("arena_bytes");
  EXPECT_TRUE(contains(descError(j), "lacks \"arena_bytes\""));
  EXPECT_TRUE(contains(descError(Json::array()), "not a JSON object"));
}

TEST(CoreManifest, AcceptsAMatchingJob) {
  coretest::TempDir tmp;
  EXPECT_EQ(manifestError(tmp, validManifest(), validDesc(), 1, 2),
            "(no error)");
  Manifest m = readManifest(tmp / "manifest.json");
  EXPECT_EQ(m.numInputs, 1);
  EXPECT_EQ(manifestStage(m, 1).weights, tmp / "weights/stage1.safetensors");
}

TEST(CoreManifest, EachMismatchNamesBothValues) {
  coretest::TempDir tmp;
  Json m = validManifest();
  m["build_id"] = "77c1";
  std::string e = manifestError(tmp, m, validDesc(), 1, 2);
  EXPECT_TRUE(contains(e, "stage binary was built for build 3f9a but "));
  EXPECT_TRUE(contains(e, "manifest.json is for build 77c1")) << e;

  e = manifestError(tmp, validManifest(), validDesc(), 1, 3);
  EXPECT_TRUE(contains(e, "is for 2 ranks (num_ranks) but the job has 3")) << e;

  e = manifestError(tmp, validManifest(), validDesc(), 0, 2);
  EXPECT_TRUE(contains(e, "this is stage 1 on rank 0 but")) << e;
  EXPECT_TRUE(contains(e, "runs stage 1 on ranks [1]")) << e;

  m = validManifest();
  m["microbatch"] = 4;
  e = manifestError(tmp, m, validDesc(), 1, 2);
  EXPECT_TRUE(contains(e, "microbatch 2 but")) << e;

  m = validManifest();
  m["format"] = "pipec.plan/1";
  EXPECT_TRUE(
      contains(manifestError(tmp, m, validDesc(), 1, 2), "\"pipec.plan/1\""));

  m = validManifest();
  m["stages"][1]["ranks"] = {1, 0};
  e = manifestError(tmp, m, validDesc(), 1, 2);
  EXPECT_TRUE(contains(e, "gives rank 0 to two stages")) << e;

  // A replicated stage: the binary of one replica against a manifest that
  // runs the stage on one rank.
  Json replica = validDesc();
  replica["replicas"] = 2;
  replica["replica"] = 1;
  e = manifestError(tmp, validManifest(), replica, 1, 2);
  EXPECT_TRUE(contains(e, "one of 2 replicas of stage 1")) << e;
  EXPECT_TRUE(contains(e, "runs that stage on 1 ranks")) << e;

  coretest::writeBytes(tmp / "broken.json", "{\"format\": ");
  try {
    readManifest(tmp / "broken.json");
    FAIL();
  } catch (const RtError &err) {
    EXPECT_TRUE(contains(err.what(), "broken.json' is not valid JSON"));
  }
  EXPECT_THROW(readManifest(tmp / "absent.json"), RtError);
}

//===----------------------------------------------------------------------===//
// Command line
//===----------------------------------------------------------------------===//

namespace {

Options parse(std::vector<std::string> args) {
  std::vector<char *> argv = {const_cast<char *>("stage0")};
  for (std::string &a : args)
    argv.push_back(a.data());
  return parseOptions(int(argv.size()), argv.data());
}

std::string usageError(std::vector<std::string> args) {
  try {
    parse(std::move(args));
  } catch (const UsageError &e) {
    return e.what();
  }
  return "(no error)";
}

} // namespace

TEST(CoreOptions, DefaultsAndBothFlagSyntaxes) {
  Options d = parse({});
  EXPECT_EQ(d.steps, 10);
  EXPECT_DOUBLE_EQ(d.lr, 0.01);
  EXPECT_EQ(d.seed, 0u);
  EXPECT_EQ(d.checkpointEvery, 0);
  EXPECT_EQ(d.profileWarmup, 1);
  EXPECT_FALSE(d.quiet);

  Options o =
      parse({"--steps", "50", "--lr=0.5", "--inputs", "a.npy,b.npy",
             "--labels=y.npy", "--seed", "18446744073709551615", "--manifest",
             "/x/manifest.json", "--checkpoint-every=5", "--profile-out",
             "p.json", "--profile-warmup", "0", "--quiet"});
  EXPECT_EQ(o.steps, 50);
  EXPECT_DOUBLE_EQ(o.lr, 0.5);
  EXPECT_EQ(o.inputs, (std::vector<std::string>{"a.npy", "b.npy"}));
  EXPECT_EQ(o.labels, "y.npy");
  EXPECT_EQ(o.seed, 18446744073709551615ull);
  EXPECT_EQ(o.checkpointEvery, 5);
  EXPECT_EQ(o.profileOut, "p.json");
  EXPECT_EQ(o.profileWarmup, 0);
  EXPECT_TRUE(o.quiet);

  resolveDefaultPaths(o, "stage0");
  EXPECT_EQ(o.metrics, "/x/metrics.jsonl");
  EXPECT_EQ(o.checkpointDir, "/x/checkpoints");
}

TEST(CoreOptions, RejectsBadFlagsWithOneClearMessage) {
  EXPECT_EQ(usageError({"--step", "3"}), "unknown flag '--step'");
  EXPECT_EQ(usageError({"--steps"}), "missing value for --steps");
  EXPECT_TRUE(contains(usageError({"--steps", "0"}), "integer >= 1"));
  EXPECT_TRUE(contains(usageError({"--steps", "3x"}), "invalid value '3x'"));
  EXPECT_TRUE(contains(usageError({"--lr", "nan"}), "finite number"));
  EXPECT_TRUE(contains(usageError({"--seed", "-1"}), "--seed"));
  EXPECT_TRUE(contains(usageError({"--inputs", "a.npy,,b.npy"}),
                       "without empty entries"));
  EXPECT_EQ(usageError({"--quiet=1"}), "--quiet takes no value");
  EXPECT_EQ(usageError({"--metrics="}), "empty path for --metrics");
  EXPECT_TRUE(contains(usageText("stage3"), "usage: stage3 "));
}

// The formats library writes what it reads: the compiler's writer and the
// runtime's reader are one schema.
TEST(CoreStageDesc, WriterRoundTrips) {
  Json j = validDesc();
  j["policy"] = Json::parse(R"({"update": "per-microbatch", "flush": false, "versions_kept": 2})");
  j["tie_groups"] = Json::parse("[[0, 1]]");
  j["slots"] = 3;
  j["versioned_bytes"] = 256;
  j["memory_model"] = "arena";
  j["ops"][0]["fwd_scratch_bytes"] = 128;
  j["ops"][0]["bwd_scratch_bytes"] = 192;
  j["ops"][0]["carried_bytes"] = 64;
  j["ops"][0]["saved_reads"] = Json::parse("[[0, 32]]");
  j["ops"][0]["bwd_scratch_recomputed_bytes"] = 224;
  j["fused_updates"] = Json::parse(R"([{"ops": [0], "elements": [12]}])");
  StageDesc a = parseStageDesc(j.dump());
  std::string text = formats::writeStageDesc(a);
  EXPECT_TRUE(contains(text, "\"format\":\"pipec.stage/2\"")) << text;
  StageDesc b = parseStageDesc(text);
  EXPECT_EQ(b.buildId, a.buildId);
  EXPECT_EQ(b.stage, a.stage);
  EXPECT_EQ(b.globalBatch, a.globalBatch);
  EXPECT_EQ(b.policy.update, formats::UpdateRule::PerMicrobatch);
  EXPECT_FALSE(b.policy.flush);
  EXPECT_EQ(b.policy.versionsKept, 2);
  EXPECT_EQ(b.tieGroups, a.tieGroups);
  EXPECT_EQ(b.slots, 3);
  EXPECT_EQ(b.versionedBytes, 256);
  ASSERT_EQ(b.weights.size(), a.weights.size());
  for (size_t i = 0; i < a.weights.size(); ++i) {
    EXPECT_EQ(b.weights[i].name, a.weights[i].name);
    EXPECT_EQ(b.weights[i].offset, a.weights[i].offset);
    EXPECT_EQ(b.weights[i].bytes, a.weights[i].bytes);
  }
  ASSERT_EQ(b.feeds.size(), 1u);
  EXPECT_EQ(b.feeds[0].kind, FeedSpec::Kind::Labels);
  EXPECT_EQ(b.feeds[0].classes, 3);
  ASSERT_EQ(b.ops.size(), a.ops.size());
  EXPECT_EQ(b.ops[0].inputs, a.ops[0].inputs);
  EXPECT_EQ(b.ops[0].savedBytes, 32);
  // The memory figures a profile is written from.
  EXPECT_EQ(b.memoryModel, "arena");
  EXPECT_EQ(b.ops[0].fwdScratchBytes, 128);
  EXPECT_EQ(b.ops[0].bwdScratchBytes, 192);
  EXPECT_EQ(b.ops[0].carriedBytes, 64);
  EXPECT_EQ(b.ops[0].savedReads,
            (std::vector<std::pair<int64_t, int64_t>>{{0, 32}}));
  EXPECT_EQ(b.ops[0].bwdRecomputedScratchBytes, 224);
  ASSERT_EQ(b.fusedUpdates.size(), 1u);
  EXPECT_EQ(b.fusedUpdates[0].ops, std::vector<int64_t>{0});
  EXPECT_EQ(b.fusedUpdates[0].elements, std::vector<int64_t>{12});
  // A multi-tensor call naming an op the stage does not have, or lists of
  // two lengths, is refused.
  for (const char *bad : {R"([{"ops": [7], "elements": [1]}])",
                          R"([{"ops": [0], "elements": [1, 2]}])"}) {
    Json k = j;
    k["fused_updates"] = Json::parse(bad);
    EXPECT_THROW(parseStageDesc(k.dump()), std::exception) << bad;
  }
  // Absent: none (a stage whose figures are not the whole model's).
  EXPECT_EQ(parseStageDesc(validDesc().dump()).memoryModel, "");
  EXPECT_FALSE(
      contains(formats::writeStageDesc(parseStageDesc(validDesc().dump())),
               "memory_model"));
}

TEST(CoreManifest, WriterRoundTrips) {
  coretest::TempDir tmp;
  Manifest m;
  m.buildId = "3f9a";
  m.model = "m.onnx";
  m.schedule = "1f1b";
  m.numRanks = 3;
  m.microbatches = 4;
  m.microbatch = 2;
  m.globalBatch = 8;
  m.stages.push_back({0, "stage0r0", {"stage0r0", "stage0r1"}, "weights/stage0.safetensors", {0, 1}});
  m.stages.push_back({1, "stage1", {}, "weights/stage1.safetensors", {2}});
  m.stages[1].arenaBytes = 4096;
  m.inputs.push_back({"x", {8, 4}, "f32", 0});
  m.hasLabels = true;
  m.labels = {"labels", {8}, "i64", 10};
  coretest::writeBytes(tmp / "manifest.json", formats::writeManifest(m));
  Manifest r = readManifest(tmp / "manifest.json");
  EXPECT_EQ(r.buildId, "3f9a");
  EXPECT_EQ(r.model, "m.onnx");
  EXPECT_EQ(r.schedule, "1f1b");
  EXPECT_EQ(r.numRanks, 3);
  EXPECT_EQ(r.globalBatch, 8);
  ASSERT_EQ(r.stages.size(), 2u);
  EXPECT_EQ(r.stages[0].binaries, m.stages[0].binaries);
  EXPECT_EQ(r.stages[0].ranks, m.stages[0].ranks);
  EXPECT_EQ(r.stages[0].arenaBytes, 0); // not recorded
  EXPECT_EQ(r.stages[1].arenaBytes, 4096);
  EXPECT_EQ(r.stages[1].weights, std::string(tmp / "weights/stage1.safetensors"));
  EXPECT_EQ(r.numInputs, 1);
  ASSERT_EQ(r.inputs.size(), 1u);
  EXPECT_EQ(r.inputs[0].shape, std::vector<int64_t>({8, 4}));
  EXPECT_TRUE(r.hasLabels);
  EXPECT_EQ(r.labels.classes, 10);
}
