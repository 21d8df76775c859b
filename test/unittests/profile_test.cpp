//===- profile_test.cpp - profile.json reader/writer tests ----------------===//
//
// Round trips of `pipec.profile/1` and every rejection the reader makes.
//
//===----------------------------------------------------------------------===//

#include "pipec/Profile.h"

#include <gtest/gtest.h>

using namespace pipec;

namespace {

const char *kResidualProfile = R"({
  "format": "pipec.profile/1",
  "device": "a100",
  "microbatch": 8,
  "ops": [
    {"name": "x", "op": "Input", "fwd_s": 0, "bwd_s": 0, "out_bytes": 1024},
    {"name": "fc1", "op": "Gemm", "fwd_s": 0.5, "bwd_s": 1.0, "out_bytes": 2048,
     "param_bytes": 4096, "saved_bytes": 1024},
    {"name": "relu", "op": "Relu", "fwd_s": 0.125, "bwd_s": 0.25,
     "out_bytes": 2048, "saved_bytes": 2048, "inputs": []},
    {"name": "add", "op": "Add", "fwd_s": 0.0625, "bwd_s": 0.0625,
     "out_bytes": 1e9, "inputs": ["relu", 0]}
  ]
})";

/// Parses `text` and expects a failure whose message contains `needle`.
void expectRejected(const std::string &text, const std::string &needle) {
  ProfileResult result = profileFromJson(text);
  EXPECT_FALSE(result.ok) << "accepted: " << text;
  EXPECT_NE(result.error.find(needle), std::string::npos)
      << "error '" << result.error << "' does not mention '" << needle << "'";
}

/// A one-op-list profile around the given op entries.
std::string withOps(const std::string &ops) {
  return R"({"format": "pipec.profile/1", "ops": [)" + ops + "]}";
}

} // namespace

TEST(ProfileTest, ParsesAllFields) {
  ProfileResult result = profileFromJson(kResidualProfile);
  ASSERT_TRUE(result.ok) << result.error;
  const Profile &p = result.profile;
  EXPECT_EQ(p.device, "a100");
  EXPECT_EQ(p.microbatch, 8);
  ASSERT_EQ(p.ops.size(), 4u);
  EXPECT_EQ(p.ops[1].name, "fc1");
  EXPECT_EQ(p.ops[1].op, "Gemm");
  EXPECT_DOUBLE_EQ(p.ops[1].fwdSeconds, 0.5);
  EXPECT_DOUBLE_EQ(p.ops[1].bwdSeconds, 1.0);
  EXPECT_EQ(p.ops[1].outBytes, 2048);
  EXPECT_EQ(p.ops[1].paramBytes, 4096);
  EXPECT_EQ(p.ops[1].savedBytes, 1024);
  EXPECT_EQ(p.ops[2].savedBytes, 2048);
  // 1e9 is a float in JSON but a whole number of bytes.
  EXPECT_EQ(p.ops[3].outBytes, 1000000000);
  // Names and indices both resolve.
  EXPECT_EQ(p.ops[3].inputs, (std::vector<int>{2, 0}));
}

TEST(ProfileTest, ChainDefaultProducers) {
  ProfileResult result = profileFromJson(kResidualProfile);
  ASSERT_TRUE(result.ok) << result.error;
  const Profile &p = result.profile;
  EXPECT_TRUE(p.producersOf(0).empty());
  EXPECT_EQ(p.producersOf(1), std::vector<int>{0});
  EXPECT_EQ(p.producersOf(2), std::vector<int>{1}); // "inputs": [] = chain
  EXPECT_EQ(p.producersOf(3), (std::vector<int>{2, 0}));
  EXPECT_TRUE(p.producersOf(4).empty());
  EXPECT_TRUE(p.producersOf(-1).empty());
}

TEST(ProfileTest, RoundTripWritesNames) {
  ProfileResult first = profileFromJson(kResidualProfile);
  ASSERT_TRUE(first.ok) << first.error;
  std::string text = profileToJson(first.profile);
  EXPECT_NE(text.find("\"pipec.profile/1\""), std::string::npos);
  // The index input 0 comes back as the name "x".
  EXPECT_NE(text.find("\"x\""), std::string::npos);
  EXPECT_NE(text.find("\"relu\""), std::string::npos);

  ProfileResult second = profileFromJson(text);
  ASSERT_TRUE(second.ok) << second.error << "\n" << text;
  const Profile &a = first.profile, &b = second.profile;
  EXPECT_EQ(a.device, b.device);
  EXPECT_EQ(a.microbatch, b.microbatch);
  ASSERT_EQ(a.ops.size(), b.ops.size());
  for (size_t i = 0; i < a.ops.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(a.ops[i].name, b.ops[i].name);
    EXPECT_EQ(a.ops[i].op, b.ops[i].op);
    EXPECT_EQ(a.ops[i].fwdSeconds, b.ops[i].fwdSeconds);
    EXPECT_EQ(a.ops[i].bwdSeconds, b.ops[i].bwdSeconds);
    EXPECT_EQ(a.ops[i].outBytes, b.ops[i].outBytes);
    EXPECT_EQ(a.ops[i].paramBytes, b.ops[i].paramBytes);
    EXPECT_EQ(a.ops[i].savedBytes, b.ops[i].savedBytes);
    EXPECT_EQ(a.ops[i].inputs, b.ops[i].inputs);
  }
  // Serialising again is a fixed point.
  EXPECT_EQ(profileToJson(b), text);
}

TEST(ProfileTest, RoundTripPreservesInexactDoubles) {
  Profile p;
  p.ops.push_back({"a", "MatMul", 0.1, 1.0 / 3.0, 7, 0, 0, {}});
  p.ops.push_back({"b", "Relu", 1e-7, 2.5e-9, 7, 0, 0, {0}});
  ProfileResult back = profileFromJson(profileToJson(p));
  ASSERT_TRUE(back.ok) << back.error;
  EXPECT_EQ(back.profile.ops[0].fwdSeconds, 0.1);
  EXPECT_EQ(back.profile.ops[0].bwdSeconds, 1.0 / 3.0);
  EXPECT_EQ(back.profile.ops[1].fwdSeconds, 1e-7);
  EXPECT_EQ(back.profile.ops[1].inputs, std::vector<int>{0});
}

TEST(ProfileTest, ArenaMemoryModelRoundTrips) {
  ProfileResult read = profileFromJson(
      R"({"format": "pipec.profile/1", "memory_model": "arena", "ops": [
        {"name": "fc", "op": "gemm", "out_bytes": 64, "saved_bytes": 128,
         "fwd_scratch_bytes": 192, "bwd_scratch_bytes": 256,
         "saved_reads": [[1, 64], [0, 64]],
         "bwd_scratch_recomputed_bytes": 320},
        {"name": "relu", "op": "relu", "out_bytes": 64}]})");
  ASSERT_TRUE(read.ok) << read.error;
  const Profile &p = read.profile;
  EXPECT_EQ(p.memoryModel, "arena");
  EXPECT_EQ(p.ops[0].fwdScratchBytes, 192);
  EXPECT_EQ(p.ops[0].bwdScratchBytes, 256);
  EXPECT_EQ(p.ops[0].bwdRecomputedScratchBytes, 320);
  EXPECT_EQ(p.ops[0].savedReads,
            (std::vector<std::pair<int, int64_t>>{{1, 64}, {0, 64}}));
  EXPECT_EQ(p.ops[1].fwdScratchBytes, 0); // absent: unknown
  EXPECT_TRUE(p.ops[1].savedReads.empty());
  ProfileResult back = profileFromJson(profileToJson(p));
  ASSERT_TRUE(back.ok) << back.error;
  EXPECT_EQ(back.profile.memoryModel, "arena");
  EXPECT_EQ(back.profile.ops[0].bwdScratchBytes, 256);
  EXPECT_EQ(back.profile.ops[0].savedReads, p.ops[0].savedReads);
  EXPECT_EQ(back.profile.ops[0].bwdRecomputedScratchBytes, 320);
  EXPECT_EQ(profileToJson(back.profile), profileToJson(p));
  // A profile without it stays the estimate model, and writes none.
  ProfileResult plain = profileFromJson(withOps(R"({"name": "a"})"));
  ASSERT_TRUE(plain.ok) << plain.error;
  EXPECT_EQ(plain.profile.memoryModel, "");
  EXPECT_EQ(profileToJson(plain.profile).find("memory_model"),
            std::string::npos);
  expectRejected(R"({"format": "pipec.profile/1", "memory_model": "peak",
                     "ops": [{"name": "a"}]})",
                 "'memory_model' must be \"arena\"");
  expectRejected(withOps(R"({"name": "a", "bwd_scratch_bytes": -1})"),
                 "op 0 ('a'): 'bwd_scratch_bytes' must be non-negative");
  // A reader outside the profile, a negative size, a bad shape.
  for (const char *reads : {"[[1, 64]]", "[[0, -64]]", "[[0]]", "{}"})
    expectRejected(
        withOps(std::string(R"({"name": "a", "saved_reads": )") + reads + "}"),
        "op 0 ('a'): 'saved_reads' must list [op offset, bytes]");
}

TEST(ProfileTest, OptimizerAndCopyTimesRoundTrip) {
  ProfileResult read = profileFromJson(
      R"({"format": "pipec.profile/1", "copy_bytes_per_s": 1.5e10, "ops": [
        {"name": "fc", "op": "gemm", "param_bytes": 64, "opt_s": 2.5e-4},
        {"name": "relu", "op": "relu"}]})");
  ASSERT_TRUE(read.ok) << read.error;
  const Profile &p = read.profile;
  EXPECT_EQ(p.copyBytesPerSecond, 1.5e10);
  EXPECT_EQ(p.ops[0].optSeconds, 2.5e-4);
  EXPECT_EQ(p.ops[1].optSeconds, 0); // absent: free
  std::string text = profileToJson(p);
  EXPECT_EQ(text.find("opt_s"), text.rfind("opt_s")); // written once
  ProfileResult back = profileFromJson(text);
  ASSERT_TRUE(back.ok) << back.error;
  EXPECT_EQ(back.profile.copyBytesPerSecond, 1.5e10);
  EXPECT_EQ(back.profile.ops[0].optSeconds, 2.5e-4);
  EXPECT_EQ(profileToJson(back.profile), text);
  expectRejected(withOps(R"({"name": "fc", "opt_s": -1})"),
                 "op 0 ('fc'): 'opt_s' must be a non-negative number");
  expectRejected(R"({"format": "pipec.profile/1", "copy_bytes_per_s": -3,
                     "ops": [{"name": "a"}]})",
                 "top level: 'copy_bytes_per_s' must be a non-negative");
}

TEST(ProfileTest, OpOverheadRoundTrips) {
  ProfileResult read = profileFromJson(
      R"({"format": "pipec.profile/1", "op_overhead_s": 3e-6, "step_s": 0.01,
          "ops": [{"name": "fc", "op": "gemm"}]})");
  ASSERT_TRUE(read.ok) << read.error;
  EXPECT_EQ(read.profile.opOverheadSeconds, 3e-6);
  ProfileResult back = profileFromJson(profileToJson(read.profile));
  ASSERT_TRUE(back.ok) << back.error;
  EXPECT_EQ(back.profile.opOverheadSeconds, 3e-6);
  expectRejected(R"({"format": "pipec.profile/1", "op_overhead_s": -1,
                     "ops": [{"name": "a"}]})",
                 "top level: 'op_overhead_s' must be a non-negative");
}

TEST(ProfileTest, MinimalChain) {
  ProfileResult result =
      profileFromJson(withOps(R"({"name": "a"}, {"name": "b"})"));
  ASSERT_TRUE(result.ok) << result.error;
  EXPECT_EQ(result.profile.device, "cpu");
  EXPECT_EQ(result.profile.microbatch, 1);
  EXPECT_EQ(result.profile.ops[1].fwdSeconds, 0);
  EXPECT_EQ(result.profile.producersOf(1), std::vector<int>{0});
}

TEST(ProfileTest, RejectsFormat) {
  expectRejected(R"({"ops": []})", "missing \"format\"");
  expectRejected(R"({"format": "pipec.profile/2", "ops": []})",
                 "unsupported format \"pipec.profile/2\"");
  expectRejected(R"({"format": "pipec.plan/1", "ops": []})",
                 "unsupported format");
  expectRejected(R"({"format": 1, "ops": []})", "unsupported format");
}

TEST(ProfileTest, RejectsMalformedDocuments) {
  expectRejected("{ not json", "not valid JSON");
  expectRejected("[1, 2]", "top level must be a JSON object");
  expectRejected(R"({"format": "pipec.profile/1"})", "'ops' must be a list");
  expectRejected(R"({"format": "pipec.profile/1", "ops": {}})",
                 "'ops' must be a list");
  expectRejected(R"({"format": "pipec.profile/1", "microbatch": 0, "ops": []})",
                 "'microbatch' must be at least 1");
  expectRejected(withOps("3"), "op 0 must be a JSON object");
  expectRejected(withOps(R"({"op": "Relu"})"), "op 0: 'name'");
}

TEST(ProfileTest, RejectsNegativeNumbersNamingTheOp) {
  expectRejected(withOps(R"({"name": "a"}, {"name": "conv", "fwd_s": -1})"),
                 "op 1 ('conv'): 'fwd_s' must be a non-negative number");
  expectRejected(withOps(R"({"name": "conv", "bwd_s": -0.5})"),
                 "op 0 ('conv'): 'bwd_s'");
  expectRejected(withOps(R"({"name": "conv", "out_bytes": -4})"),
                 "op 0 ('conv'): 'out_bytes' must be non-negative");
  expectRejected(withOps(R"({"name": "conv", "param_bytes": -4})"),
                 "'param_bytes'");
  expectRejected(withOps(R"({"name": "conv", "saved_bytes": -4.0})"),
                 "'saved_bytes'");
  expectRejected(withOps(R"({"name": "conv", "out_bytes": 1.5})"),
                 "whole number of bytes");
  expectRejected(withOps(R"({"name": "conv", "fwd_s": "fast"})"),
                 "op 0 ('conv'): 'fwd_s' must be a number");
}

TEST(ProfileTest, RejectsDuplicateNames) {
  expectRejected(withOps(R"({"name": "a"}, {"name": "b"}, {"name": "a"})"),
                 "op 2 ('a'): duplicate name (also op 0)");
}

TEST(ProfileTest, RejectsBadInputs) {
  expectRejected(withOps(R"({"name": "a"}, {"name": "b", "inputs": ["zz"]})"),
                 "op 1 ('b'): input \"zz\" is not the name of an op");
  expectRejected(withOps(R"({"name": "a", "inputs": ["b"]}, {"name": "b"})"),
                 "op 0 ('a'): input \"b\" is not an earlier op");
  expectRejected(withOps(R"({"name": "a"}, {"name": "b", "inputs": ["b"]})"),
                 "op 1 ('b'): input \"b\" is not an earlier op");
  expectRejected(withOps(R"({"name": "a"}, {"name": "b", "inputs": [1]})"),
                 "op 1 ('b'): input 1 is not an earlier op");
  expectRejected(withOps(R"({"name": "a"}, {"name": "b", "inputs": [7]})"),
                 "op 1 ('b'): input index 7 is out of range");
  expectRejected(withOps(R"({"name": "a"}, {"name": "b", "inputs": [-1]})"),
                 "input index -1 is out of range");
  expectRejected(withOps(R"({"name": "a"}, {"name": "b", "inputs": [true]})"),
                 "must be an op name or index");
  expectRejected(withOps(R"({"name": "a"}, {"name": "b", "inputs": "a"})"),
                 "'inputs' must be a list");
}
