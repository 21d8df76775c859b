//===- core_npy_test.cpp - .npy reader/writer and file feeds --------------===//
//
// Part of pipec's runtime tests. Files are built byte by byte the way
// numpy.save writes them, so the reader is checked against the format rather
// than against our own writer.
//
//===----------------------------------------------------------------------===//

#include "core/error.h"
#include "core/feed.h"
#include "pipec/formats/npy.h"
#include "core_test_util.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>

using namespace pipec;
using coretest::TempDir;

namespace {

/// A .npy image as numpy.save writes it: magic, version, little-endian
/// header length, the dict padded with spaces to a 64-byte boundary and a
/// newline, then the data.
std::string npyImage(const std::string &dict, const std::string &data,
                     int major = 1) {
  size_t prefix = major == 1 ? 10 : 12;
  std::string header = dict;
  while ((prefix + header.size() + 1) % 64 != 0)
    header += ' ';
  header += '\n';
  std::string out = "\x93NUMPY";
  out += char(major);
  out += char(0);
  for (size_t i = 0; i < prefix - 8; ++i)
    out += char((header.size() >> (8 * i)) & 0xff);
  return out + header + data;
}

template <typename T> std::string raw(std::initializer_list<T> values) {
  std::string s;
  for (T v : values)
    s.append(reinterpret_cast<const char *>(&v), sizeof(T));
  return s;
}

bool parseImage(const std::string &image, npy::Array &out, std::string &error) {
  return npy::parse(image.data(), image.size(), out, error);
}

} // namespace

TEST(CoreNpy, ReadsFloat32) {
  std::string image =
      npyImage("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
               raw<float>({1, 2, 3, 4, 5, 6.5f}));
  npy::Array a;
  std::string error;
  ASSERT_TRUE(parseImage(image, a, error)) << error;
  EXPECT_EQ(a.descr, "<f4");
  EXPECT_FALSE(a.fortranOrder);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
  std::vector<float> f;
  ASSERT_TRUE(npy::toFloat32(a, f, error)) << error;
  EXPECT_EQ(f, (std::vector<float>{1, 2, 3, 4, 5, 6.5f}));
}

TEST(CoreNpy, ConvertsFloat64ToFloat32) {
  std::string image =
      npyImage("{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }",
               raw<double>({0.5, -1.25, 1e-3}));
  npy::Array a;
  std::string error;
  ASSERT_TRUE(parseImage(image, a, error)) << error;
  std::vector<float> f;
  ASSERT_TRUE(npy::toFloat32(a, f, error)) << error;
  EXPECT_EQ(f, (std::vector<float>{0.5f, -1.25f, float(1e-3)}));
}

TEST(CoreNpy, ReadsInt64AndInt32Labels) {
  npy::Array a;
  std::string error;
  std::vector<int64_t> v;
  ASSERT_TRUE(parseImage(
      npyImage("{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }",
               raw<int64_t>({7, 0, int64_t(1) << 40})),
      a, error))
      << error;
  ASSERT_TRUE(npy::toInt64(a, v, error)) << error;
  EXPECT_EQ(v, (std::vector<int64_t>{7, 0, int64_t(1) << 40}));

  ASSERT_TRUE(parseImage(
      npyImage("{'descr': '<i4', 'fortran_order': False, 'shape': (2, 2), }",
               raw<int32_t>({1, -2, 3, 4})),
      a, error))
      << error;
  ASSERT_TRUE(npy::toInt64(a, v, error)) << error;
  EXPECT_EQ(v, (std::vector<int64_t>{1, -2, 3, 4}));
}

TEST(CoreNpy, ReadsVersion2HeaderAndScalarShape) {
  npy::Array a;
  std::string error;
  ASSERT_TRUE(parseImage(
      npyImage("{'descr': '<f4', 'fortran_order': False, 'shape': (), }",
               raw<float>({42}), /*major=*/2),
      a, error))
      << error;
  EXPECT_TRUE(a.shape.empty());
  EXPECT_EQ(a.numel(), 1);
}

TEST(CoreNpy, WriterRoundTrips) {
  TempDir tmp;
  std::vector<float> values = {1, -2, 3.25f, 4, 5, 6};
  std::string error;
  ASSERT_TRUE(npy::writeFile(tmp / "a.npy", "<f4", {3, 2}, values.data(),
                             values.size() * 4, error))
      << error;
  std::string bytes = coretest::readBytes(tmp / "a.npy");
  // numpy's layout: data starts on a 64-byte boundary, header ends in '\n'.
  size_t headerLen = size_t(uint8_t(bytes[8])) | size_t(uint8_t(bytes[9])) << 8;
  EXPECT_EQ((10 + headerLen) % 64, 0u);
  EXPECT_EQ(bytes[10 + headerLen - 1], '\n');
  npy::Array a;
  ASSERT_TRUE(npy::readFile(tmp / "a.npy", a, error)) << error;
  std::vector<float> back;
  ASSERT_TRUE(npy::toFloat32(a, back, error));
  EXPECT_EQ(back, values);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{3, 2}));
}

TEST(CoreNpy, RejectsMalformedHeaders) {
  const std::string data = raw<float>({1, 2});
  struct Case {
    std::string image, expected;
  };
  std::string good = npyImage(
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", data);
  std::string badMagic = good;
  badMagic[1] = 'X';
  std::string badVersion = good;
  badVersion[6] = 9;
  std::string longHeader =
      good.substr(0, 8) + std::string("\xff\xff", 2) + good.substr(10);
  Case cases[] = {
      {badMagic, "bad magic"},
      {badVersion, "unsupported .npy version 9"},
      {good.substr(0, 9), "truncated header"},
      {longHeader, "truncated header"},
      {npyImage("{'descr': '<f4', 'shape': (2,), }", data), "lacks"},
      {npyImage("['descr', '<f4']", data), "does not start with '{'"},
      {npyImage("{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2,), }",
                data),
       "fortran_order"},
      {npyImage("{'descr': '<f4', 'fortran_order': False, 'shape': (2, x), }",
                data),
       "'shape'"},
      {npyImage("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }",
                data),
       "'shape'"},
      {npyImage("{'descr': [('a', '<f4')], 'fortran_order': False, "
                "'shape': (2,), }",
                data),
       "structured"},
      {npyImage("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), } x",
                data),
       "after the header dict"},
      {npyImage("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), "
                "'extra': 1}",
                data),
       "unexpected key 'extra'"},
  };
  for (const Case &c : cases) {
    npy::Array a;
    std::string error;
    EXPECT_FALSE(parseImage(c.image, a, error)) << c.expected;
    EXPECT_NE(error.find(c.expected), std::string::npos)
        << "error '" << error << "' lacks '" << c.expected << "'";
  }
}

TEST(CoreNpy, RejectsTruncatedAndOverlongData) {
  std::string dict =
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }";
  npy::Array a;
  std::string error;
  EXPECT_FALSE(parseImage(npyImage(dict, raw<float>({1, 2, 3})), a, error));
  EXPECT_NE(error.find("truncated data"), std::string::npos) << error;
  EXPECT_NE(error.find("needs 16 bytes, the file has 12"), std::string::npos)
      << error;
  EXPECT_FALSE(
      parseImage(npyImage(dict, raw<float>({1, 2, 3, 4, 5})), a, error));
  EXPECT_NE(error.find("4 unexpected bytes"), std::string::npos) << error;
}

TEST(CoreNpy, RejectsWrongDtypes) {
  npy::Array a;
  std::string error;
  std::vector<float> f;
  std::vector<int64_t> i;
  // Big-endian data is refused by the parser.
  EXPECT_FALSE(parseImage(
      npyImage("{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }",
               raw<float>({1})),
      a, error));
  EXPECT_NE(error.find("unsupported dtype '>f4'"), std::string::npos) << error;
  // Integers are not inputs, floats are not labels.
  ASSERT_TRUE(parseImage(
      npyImage("{'descr': '<i8', 'fortran_order': False, 'shape': (1,), }",
               raw<int64_t>({1})),
      a, error));
  EXPECT_FALSE(npy::toFloat32(a, f, error));
  EXPECT_NE(error.find("'<i8' is not float32 or float64"), std::string::npos);
  ASSERT_TRUE(parseImage(
      npyImage("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }",
               raw<float>({1})),
      a, error));
  EXPECT_FALSE(npy::toInt64(a, i, error));
  EXPECT_NE(error.find("'<f4' is not int64 or int32"), std::string::npos);
}

TEST(CoreNpy, RejectsFortranOrder) {
  npy::Array a;
  std::string error;
  std::vector<float> f;
  ASSERT_TRUE(parseImage(
      npyImage("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }",
               raw<float>({1, 2, 3, 4})),
      a, error));
  EXPECT_TRUE(a.fortranOrder);
  EXPECT_FALSE(npy::toFloat32(a, f, error));
  EXPECT_NE(error.find("Fortran order"), std::string::npos) << error;
}

TEST(CoreNpy, ReadFileNamesTheFile) {
  TempDir tmp;
  npy::Array a;
  std::string error;
  EXPECT_FALSE(npy::readFile(tmp / "missing.npy", a, error));
  EXPECT_NE(error.find("missing.npy"), std::string::npos) << error;
  coretest::writeBytes(tmp / "bad.npy", "PK\x03\x04 not numpy");
  EXPECT_FALSE(npy::readFile(tmp / "bad.npy", a, error));
  EXPECT_NE(error.find("bad.npy' is not a valid .npy file"), std::string::npos)
      << error;
}

//===----------------------------------------------------------------------===//
// Feeds from .npy files
//===----------------------------------------------------------------------===//

namespace {

rt::FeedSpec inputSpec(int64_t b, std::vector<int64_t> sampleDims) {
  rt::FeedSpec s;
  s.kind = rt::FeedSpec::Kind::Input;
  s.name = "x";
  s.shape = {b};
  s.shape.insert(s.shape.end(), sampleDims.begin(), sampleDims.end());
  s.sampleElems = 1;
  for (int64_t d : sampleDims)
    s.sampleElems *= d;
  s.bytes = b * s.sampleElems * 4;
  return s;
}

rt::FeedSpec labelSpec(int64_t b, int64_t classes) {
  rt::FeedSpec s;
  s.kind = rt::FeedSpec::Kind::Labels;
  s.name = "y";
  s.shape = {b};
  s.classes = classes;
  s.bytes = b * 8;
  return s;
}

std::string messageOf(const std::function<void()> &fn) {
  try {
    fn();
  } catch (const rt::RtError &e) {
    return e.what();
  }
  return "(no error)";
}

} // namespace

TEST(CoreNpyFeed, RowsCycleByGlobalSampleIndex) {
  TempDir tmp;
  // 5 rows of 2 features: row r is (r, -r).
  std::vector<double> rows;
  for (int r = 0; r < 5; ++r)
    rows.insert(rows.end(), {double(r), double(-r)});
  std::string error;
  ASSERT_TRUE(npy::writeFile(tmp / "x.npy", "<f8", {5, 2}, rows.data(),
                             rows.size() * 8, error));
  // B = 4, b = 2: step 1, microbatch 1 holds global samples 6, 7 -> rows 1, 2.
  rt::Feed feed = rt::Feed::fromNpy(inputSpec(2, {2}), 4, tmp / "x.npy");
  EXPECT_EQ(feed.rows(), 5);
  float out[4];
  feed.fill(1, 1, out);
  EXPECT_EQ(std::vector<float>(out, out + 4),
            (std::vector<float>{1, -1, 2, -2}));
}

TEST(CoreNpyFeed, RejectsWrongShape) {
  TempDir tmp;
  std::vector<float> v(12);
  std::string error;
  ASSERT_TRUE(
      npy::writeFile(tmp / "x.npy", "<f4", {4, 3}, v.data(), 48, error));
  std::string msg = messageOf(
      [&] { rt::Feed::fromNpy(inputSpec(2, {4}), 4, tmp / "x.npy"); });
  EXPECT_NE(msg.find("x.npy"), std::string::npos) << msg;
  EXPECT_NE(msg.find("has shape [4, 3] but the model needs [N, 4]"),
            std::string::npos)
      << msg;
}

TEST(CoreNpyFeed, RejectsLabelsOutsideTheClasses) {
  TempDir tmp;
  std::vector<int32_t> labels = {0, 3, 9, 10, 2};
  std::string error;
  ASSERT_TRUE(
      npy::writeFile(tmp / "y.npy", "<i4", {5}, labels.data(), 20, error));
  std::string msg =
      messageOf([&] { rt::Feed::fromNpy(labelSpec(2, 10), 4, tmp / "y.npy"); });
  EXPECT_NE(msg.find("y.npy"), std::string::npos) << msg;
  EXPECT_NE(msg.find("row 3 has label 10 outside [0, 10)"), std::string::npos)
      << msg;
}

TEST(CoreNpyFeed, RejectsFloatLabelsAndMalformedFiles) {
  TempDir tmp;
  std::vector<float> v(4);
  std::string error;
  ASSERT_TRUE(npy::writeFile(tmp / "y.npy", "<f4", {4}, v.data(), 16, error));
  std::string msg =
      messageOf([&] { rt::Feed::fromNpy(labelSpec(2, 10), 4, tmp / "y.npy"); });
  EXPECT_NE(msg.find("'<f4' is not int64 or int32"), std::string::npos) << msg;
  std::string image = coretest::readBytes(tmp / "y.npy");
  coretest::writeBytes(tmp / "cut.npy", image.substr(0, image.size() - 3));
  msg = messageOf(
      [&] { rt::Feed::fromNpy(inputSpec(2, {}), 4, tmp / "cut.npy"); });
  EXPECT_NE(msg.find("cut.npy' is not a valid .npy file: truncated data"),
            std::string::npos)
      << msg;
}
