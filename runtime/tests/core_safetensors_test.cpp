//===- core_safetensors_test.cpp - safetensors reader/writer, weights -----===//
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

/// A file image from a literal header (as another writer would produce it)
/// and raw data.
std::string image(const std::string &header, const std::string &data) {
  std::string out;
  for (int i = 0; i < 8; ++i)
    out += char((uint64_t(header.size()) >> (8 * i)) & 0xff);
  return out + header + data;
}

std::string openError(const std::string &path) {
  safetensors::File f;
  std::string error;
  EXPECT_FALSE(f.open(path, error));
  return error;
}

} // namespace

TEST(CoreSafetensors, RoundTripsTensorsAndMetadata) {
  TempDir tmp;
  std::vector<float> w = {1.5f, -2, 3, 4, 5, 6};
  std::vector<int64_t> ids = {7, -8};
  std::vector<double> scalar = {3.25};
  std::vector<safetensors::TensorRef> tensors = {
      {"fc1.weight", "F32", {2, 3}, w.data()},
      {"ids", "I64", {2}, ids.data()},
      {"scale \"q\"", "F64", {}, scalar.data()},
      {"empty", "F32", {0, 4}, nullptr}};
  safetensors::Metadata meta = {{"format", "pt"}, {"step", "12"}};
  std::string error;
  ASSERT_TRUE(
      safetensors::writeFile(tmp / "w.safetensors", tensors, meta, error))
      << error;
  EXPECT_EQ(coretest::listDir(tmp.path()),
            (std::set<std::string>{"w.safetensors"}));

  // Layout: 8-byte little-endian length, then a header that keeps the data
  // 8-byte aligned, then 24 + 16 + 8 data bytes.
  std::string bytes = coretest::readBytes(tmp / "w.safetensors");
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 48);
  std::string inMemory;
  ASSERT_TRUE(safetensors::serialize(tensors, meta, inMemory, error));
  EXPECT_EQ(inMemory, bytes);

  safetensors::File f;
  ASSERT_TRUE(f.open(tmp / "w.safetensors", error)) << error;
  EXPECT_EQ(f.metadata(), meta);
  ASSERT_EQ(f.tensors().size(), 4u);
  const safetensors::TensorInfo *t = f.find("fc1.weight");
  ASSERT_TRUE(t);
  EXPECT_EQ(t->dtype, "F32");
  EXPECT_EQ(t->shape, (std::vector<int64_t>{2, 3}));
  std::vector<float> wBack(6);
  ASSERT_TRUE(f.read(*t, wBack.data(), error)) << error;
  EXPECT_EQ(wBack, w);
  std::vector<int64_t> idsBack(2);
  ASSERT_TRUE(f.read(*f.find("ids"), idsBack.data(), error));
  EXPECT_EQ(idsBack, ids);
  double s = 0;
  ASSERT_TRUE(f.find("scale \"q\""));
  ASSERT_TRUE(f.read(*f.find("scale \"q\""), &s, error));
  EXPECT_EQ(s, 3.25);
  EXPECT_EQ(f.find("empty")->bytes(), 0u);
  EXPECT_EQ(f.find("nope"), nullptr);
}

TEST(CoreSafetensors, ReadsForeignHeaderLayout) {
  // Key order, whitespace and metadata placement as Python's safetensors
  // writes them; offsets not in key order.
  TempDir tmp;
  std::string header = "{\"b\": {\"dtype\": \"F32\", \"shape\": [1], "
                       "\"data_offsets\": [8, 12]}, \"__metadata__\": "
                       "{\"format\": \"pt\"}, \"a\": {\"dtype\": \"I32\", "
                       "\"shape\": [2], \"data_offsets\": [0, 8]}}   ";
  float b = 2.5f;
  int32_t a[2] = {-1, 9};
  std::string data(reinterpret_cast<const char *>(a), 8);
  data.append(reinterpret_cast<const char *>(&b), 4);
  coretest::writeBytes(tmp / "x.safetensors", image(header, data));
  safetensors::File f;
  std::string error;
  ASSERT_TRUE(f.open(tmp / "x.safetensors", error)) << error;
  ASSERT_EQ(f.tensors().size(), 2u);
  EXPECT_EQ(f.tensors()[0].name, "a"); // data order
  float bBack = 0;
  ASSERT_TRUE(f.read(*f.find("b"), &bBack, error));
  EXPECT_EQ(bBack, 2.5f);
}

TEST(CoreSafetensors, RejectsTruncatedFiles) {
  TempDir tmp;
  std::vector<float> w(16, 1.0f);
  std::string error;
  ASSERT_TRUE(safetensors::writeFile(
      tmp / "w.safetensors", {{"w", "F32", {4, 4}, w.data()}}, {}, error));
  std::string bytes = coretest::readBytes(tmp / "w.safetensors");
  coretest::writeBytes(tmp / "data.safetensors",
                       bytes.substr(0, bytes.size() - 4));
  coretest::writeBytes(tmp / "header.safetensors", bytes.substr(0, 20));
  coretest::writeBytes(tmp / "len.safetensors", bytes.substr(0, 5));
  EXPECT_NE(openError(tmp / "data.safetensors").find("outside the"),
            std::string::npos);
  EXPECT_NE(openError(tmp / "header.safetensors").find("exceeds the file size"),
            std::string::npos);
  EXPECT_NE(openError(tmp / "len.safetensors").find("shorter than"),
            std::string::npos);
  EXPECT_NE(openError(tmp / "missing.safetensors").find("cannot open"),
            std::string::npos);
}

TEST(CoreSafetensors, RejectsCorruptHeaders) {
  TempDir tmp;
  const std::string data8(8, '\0');
  struct Case {
    std::string header, data, expected;
  };
  Case cases[] = {
      {"{not json", data8, "not a JSON object"},
      {"[1, 2]", data8, "not a JSON object"},
      {R"({"w": {"dtype": "F32", "shape": [2]}})", data8, "needs"},
      {R"({"w": {"dtype": "Q7", "shape": [2], "data_offsets": [0, 8]}})", data8,
       "unknown dtype 'Q7'"},
      {R"({"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})",
       data8, "non-negative"},
      {R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})",
       data8, "need 12"},
      {R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
           "v": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}})",
       data8, "overlaps"},
      {R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
       data8, "gap"},
      {R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})",
       data8, "4 bytes that no tensor covers"},
      {R"({"__metadata__": {"k": 1}})", "", "not a string"},
  };
  int i = 0;
  for (const Case &c : cases) {
    std::string path = tmp / ("c" + std::to_string(i++) + ".safetensors");
    coretest::writeBytes(path, image(c.header, c.data));
    std::string error = openError(path);
    EXPECT_NE(error.find(c.expected), std::string::npos)
        << "error '" << error << "' lacks '" << c.expected << "'";
    EXPECT_NE(error.find(path), std::string::npos) << error;
  }
}

TEST(CoreSafetensors, WriterRejectsBadTensors) {
  TempDir tmp;
  float x = 0;
  std::string error;
  EXPECT_FALSE(safetensors::writeFile(
      tmp / "a.safetensors", {{"w", "F32", {1}, &x}, {"w", "F32", {1}, &x}}, {},
      error));
  EXPECT_NE(error.find("duplicate tensor name 'w'"), std::string::npos);
  EXPECT_FALSE(safetensors::writeFile(tmp / "a.safetensors",
                                      {{"w", "X9", {1}, &x}}, {}, error));
  EXPECT_NE(error.find("unknown dtype"), std::string::npos);
  // Nothing was left behind.
  EXPECT_TRUE(coretest::listDir(tmp.path()).empty());
}

//===----------------------------------------------------------------------===//
// Loading a stage's weights into the arena
//===----------------------------------------------------------------------===//

namespace {

rt::StageDesc twoWeightStage() {
  rt::StageDesc d;
  d.stage = 0;
  d.arenaBytes = 256;
  d.weights = {{"fc.weight", 64, {2, 2}, 16}, {"fc.bias", 128, {2}, 8}};
  return d;
}

std::string loadError(const rt::StageDesc &d, const std::string &path,
                      char *arena) {
  try {
    rt::loadWeights(d, path, arena);
  } catch (const rt::RtError &e) {
    return e.what();
  }
  return "(no error)";
}

} // namespace

TEST(CoreWeights, LoadsAtOffsetsAndChecksNamesShapesDtypes) {
  TempDir tmp;
  float w[4] = {1, 2, 3, 4}, b[2] = {-1, -2};
  int64_t bInt[2] = {0, 0};
  double w64[4] = {1.5, 2, 3, 0.1}, b64[2] = {-1, -2};
  std::string error;
  ASSERT_TRUE(safetensors::writeFile(tmp / "ok.safetensors",
                                     {{"fc.bias", "F32", {2}, b},
                                      {"fc.weight", "F32", {2, 2}, w},
                                      {"unused", "F32", {1}, w}},
                                     {}, error));
  ASSERT_TRUE(safetensors::writeFile(tmp / "missing.safetensors",
                                     {{"fc.weight", "F32", {2, 2}, w}}, {},
                                     error));
  ASSERT_TRUE(safetensors::writeFile(
      tmp / "shape.safetensors",
      {{"fc.weight", "F32", {4}, w}, {"fc.bias", "F32", {2}, b}}, {}, error));
  ASSERT_TRUE(safetensors::writeFile(
      tmp / "dtype.safetensors",
      {{"fc.weight", "F32", {2, 2}, w}, {"fc.bias", "I64", {2}, bInt}}, {},
      error));
  ASSERT_TRUE(safetensors::writeFile(
      tmp / "f64.safetensors",
      {{"fc.weight", "F64", {2, 2}, w64}, {"fc.bias", "F64", {2}, b64}}, {},
      error));

  rt::StageDesc d = twoWeightStage();
  alignas(64) char arena[256] = {};
  rt::loadWeights(d, tmp / "ok.safetensors", arena);
  float got[6];
  std::memcpy(got, arena + 64, 16);
  std::memcpy(got + 4, arena + 128, 8);
  EXPECT_EQ(std::vector<float>(got, got + 6),
            (std::vector<float>{1, 2, 3, 4, -1, -2}));
  EXPECT_EQ(arena[0], 0);

  EXPECT_NE(loadError(d, tmp / "missing.safetensors", arena)
                .find("has no tensor 'fc.bias'"),
            std::string::npos);
  EXPECT_NE(loadError(d, tmp / "shape.safetensors", arena)
                .find("'fc.weight' is F32 [4] but the stage needs F32 [2, 2]"),
            std::string::npos);
  EXPECT_NE(loadError(d, tmp / "dtype.safetensors", arena)
                .find("'fc.bias' is I64 [2] but the stage needs F32 [2]"),
            std::string::npos);

  // The other float type converts: F64 rounds into a float32 stage...
  rt::loadWeights(d, tmp / "f64.safetensors", arena);
  std::memcpy(got, arena + 64, 16);
  std::memcpy(got + 4, arena + 128, 8);
  EXPECT_EQ(std::vector<float>(got, got + 6),
            (std::vector<float>{1.5f, 2, 3, 0.1f, -1, -2}));
  // ... and F32 widens exactly into a float64 stage (--precision f64).
  rt::StageDesc d64 = twoWeightStage();
  d64.realBytes = 8;
  d64.weights = {{"fc.weight", 64, {2, 2}, 32}, {"fc.bias", 128, {2}, 16}};
  rt::loadWeights(d64, tmp / "ok.safetensors", arena);
  double got64[6];
  std::memcpy(got64, arena + 64, 32);
  std::memcpy(got64 + 4, arena + 128, 16);
  EXPECT_EQ(std::vector<double>(got64, got64 + 6),
            (std::vector<double>{1, 2, 3, 4, -1, -2}));
  EXPECT_NE(loadError(d64, tmp / "shape.safetensors", arena)
                .find("but the stage needs F64 [2, 2]"),
            std::string::npos);
}
