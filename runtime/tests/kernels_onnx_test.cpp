//===- kernels_onnx_test.cpp - Kernels against ONNX's operator test data --===//
//
// Part of pipec. Runs a few of ONNX's own operator test cases
// (/usr/share/libonnx-testdata, Debian package libonnx-testdata) directly
// through the CPU kernels: Conv, MaxPool (with Indices), AveragePool,
// BatchNormalization in training mode, LayerNormalization and Gather. The
// full conformance suite runs through the importer elsewhere; these pin the
// kernels' conventions (padding, count_include_pad, running statistics,
// negative indices) to ONNX's reference outputs.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The test data are serialized onnx.TensorProto messages. To keep this test
/// free of protobuf / onnx link dependencies, it decodes the few fields it
/// needs (dims = 1, data_type = 2, float_data = 4, int64_data = 7,
/// raw_data = 9) with a minimal protobuf wire-format reader. The node
/// attributes are written out by hand below, as read from each model.onnx.
/// Cases whose files are missing are skipped.
///
//===----------------------------------------------------------------------===//

#include "kernels_nn_test_util.h"

#include <cstring>
#include <fstream>

using namespace pipec_test;

namespace {

const char *const kNodeDir = "/usr/share/libonnx-testdata/data/node/";

//===----------------------------------------------------------------------===//
// A minimal TensorProto reader
//===----------------------------------------------------------------------===//

/// A decoded tensor: its dims and its elements (float or int64).
struct Tensor {
  Dims dims;
  int32_t dataType = 0; ///< 1 float, 7 int64.
  Floats floats;
  std::vector<int64_t> ints;
};

class WireReader {
public:
  WireReader(const uint8_t *p, const uint8_t *end) : p(p), end(end) {}
  bool done() const { return p >= end; }
  bool ok() const { return good; }

  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64 && p < end; shift += 7) {
      uint8_t b = *p++;
      v |= uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80))
        return v;
    }
    good = false;
    return 0;
  }
  /// The bytes of a length-delimited field.
  WireReader sub() {
    uint64_t n = varint();
    if (n > uint64_t(end - p)) {
      good = false;
      return WireReader(end, end);
    }
    WireReader r(p, p + n);
    p += n;
    return r;
  }
  const uint8_t *begin() const { return p; }
  size_t size() const { return size_t(end - p); }
  void skip(uint32_t wireType) {
    switch (wireType) {
    case 0:
      varint();
      break;
    case 1:
      advance(8);
      break;
    case 2:
      sub();
      break;
    case 5:
      advance(4);
      break;
    default:
      good = false;
      p = end;
    }
  }
  uint32_t fixed32() {
    uint32_t v = 0;
    if (size() >= 4)
      std::memcpy(&v, p, 4); // little-endian host, as protobuf
    advance(4);
    return v;
  }

private:
  void advance(size_t n) {
    if (n > size()) {
      good = false;
      p = end;
    } else {
      p += n;
    }
  }
  const uint8_t *p, *end;
  bool good = true;
};

/// Reads `path` as a TensorProto; returns false (with a message) on error.
bool readTensor(const std::string &path, Tensor &t, std::string &error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    error = "cannot open " + path;
    return false;
  }
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  WireReader r(bytes.data(), bytes.data() + bytes.size());
  std::vector<uint8_t> raw;
  while (!r.done() && r.ok()) {
    uint64_t key = r.varint();
    uint32_t field = uint32_t(key >> 3), wire = uint32_t(key & 7);
    if (field == 1 && wire == 0) {
      t.dims.push_back(int64_t(r.varint()));
    } else if (field == 1 && wire == 2) { // packed dims
      WireReader s = r.sub();
      while (!s.done() && s.ok())
        t.dims.push_back(int64_t(s.varint()));
    } else if (field == 2 && wire == 0) {
      t.dataType = int32_t(r.varint());
    } else if (field == 4 && wire == 2) { // packed float_data
      WireReader s = r.sub();
      while (!s.done() && s.ok()) {
        uint32_t bits = s.fixed32();
        float f;
        std::memcpy(&f, &bits, 4);
        t.floats.push_back(f);
      }
    } else if (field == 7 && wire == 2) { // packed int64_data
      WireReader s = r.sub();
      while (!s.done() && s.ok())
        t.ints.push_back(int64_t(s.varint()));
    } else if (field == 9 && wire == 2) {
      WireReader s = r.sub();
      raw.assign(s.begin(), s.begin() + s.size());
    } else {
      r.skip(wire);
    }
  }
  if (!r.ok()) {
    error = "malformed TensorProto " + path;
    return false;
  }
  int64_t count = numel(t.dims);
  if (!raw.empty()) {
    if (t.dataType == 1 && raw.size() == size_t(count) * 4) {
      t.floats.resize(size_t(count));
      std::memcpy(t.floats.data(), raw.data(), raw.size());
    } else if (t.dataType == 7 && raw.size() == size_t(count) * 8) {
      t.ints.resize(size_t(count));
      std::memcpy(t.ints.data(), raw.data(), raw.size());
    } else {
      error = "unexpected raw_data in " + path;
      return false;
    }
  }
  size_t have = t.dataType == 7 ? t.ints.size() : t.floats.size();
  if (have != size_t(count)) {
    error = "element count mismatch in " + path;
    return false;
  }
  return true;
}

/// The inputs and outputs of test_data_set_0 of one node test case.
struct OnnxCase {
  std::vector<Tensor> inputs, outputs;
};

/// Loads case `name`; returns false when its folder is absent (skip).
bool loadCase(const std::string &name, size_t numInputs, size_t numOutputs,
              OnnxCase &c) {
  std::string dir = std::string(kNodeDir) + name + "/test_data_set_0/";
  if (!std::ifstream(dir + "input_0.pb"))
    return false;
  std::string error;
  auto load = [&](const std::string &prefix, size_t n,
                  std::vector<Tensor> &out) {
    for (size_t i = 0; i < n; ++i) {
      Tensor t;
      EXPECT_TRUE(
          readTensor(dir + prefix + std::to_string(i) + ".pb", t, error))
          << error;
      out.push_back(t);
    }
  };
  load("input_", numInputs, c.inputs);
  load("output_", numOutputs, c.outputs);
  return true;
}

#define LOAD_OR_SKIP(name, nIn, nOut, c)                                       \
  OnnxCase c;                                                                  \
  if (!loadCase(name, nIn, nOut, c))                                           \
    GTEST_SKIP() << "ONNX test data not installed: " << name;                  \
  ASSERT_EQ(c.inputs.size(), size_t(nIn));                                     \
  ASSERT_EQ(c.outputs.size(), size_t(nOut))

/// ONNX's backend tests compare with rtol 1e-3, atol 1e-7; a little
/// tighter in relative terms here, a little looser in absolute.
void expectClose(const Floats &got, const Tensor &want, const char *what) {
  ASSERT_EQ(got.size(), want.floats.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want.floats[i], 1e-5 + 1e-4 * std::fabs(want.floats[i]))
        << what << " element " << i;
}

//===----------------------------------------------------------------------===//
// Cases
//===----------------------------------------------------------------------===//

/// Conv with kernel 3x3, strides 2 and the given pads [top, left, bottom,
/// right]; X [1, 1, 7, 5], W [1, 1, 3, 3].
void runConvCase(const char *name, int64_t pt, int64_t pl, int64_t pb,
                 int64_t pr) {
  LOAD_OR_SKIP(name, 2, 1, c);
  const Tensor &x = c.inputs[0], &w = c.inputs[1];
  ConvParams p;
  p.n = x.dims[0], p.c = x.dims[1], p.h = x.dims[2], p.w = x.dims[3];
  p.m = w.dims[0], p.kh = w.dims[2], p.kw = w.dims[3];
  p.sh = p.sw = 2, p.pt = pt, p.pl = pl, p.pb = pb, p.pr = pr;
  ASSERT_EQ(p.oh(), c.outputs[0].dims[2]);
  ASSERT_EQ(p.ow(), c.outputs[0].dims[3]);
  Floats y(size_t(p.yCount()));
  conv2d(p, x.floats.data(), w.floats.data(), nullptr, y.data());
  expectClose(y, c.outputs[0], name);
}

TEST(KernelOnnxData, ConvWithStridesPadding) {
  runConvCase("test_conv_with_strides_padding", 1, 1, 1, 1);
}

TEST(KernelOnnxData, ConvWithStridesAndAsymmetricPadding) {
  // ONNX pads [1, 0, 1, 0] = [top, left, bottom, right].
  runConvCase("test_conv_with_strides_and_asymmetric_padding", 1, 0, 1, 0);
}

PoolParams poolFor(const Tensor &x, int64_t k, int64_t pad, int64_t dil) {
  PoolParams p;
  p.n = x.dims[0], p.c = x.dims[1], p.h = x.dims[2], p.w = x.dims[3];
  p.kh = p.kw = k, p.dh = p.dw = dil;
  p.pt = p.pl = p.pb = p.pr = pad;
  return p;
}

TEST(KernelOnnxData, MaxPool2dPads) {
  LOAD_OR_SKIP("test_maxpool_2d_pads", 1, 1, c); // kernel 3, pads 2
  PoolParams p = poolFor(c.inputs[0], 3, 2, 1);
  Floats y(size_t(p.yCount()));
  maxpool2d(p, c.inputs[0].floats.data(), y.data(), nullptr);
  expectClose(y, c.outputs[0], "maxpool pads");
}

TEST(KernelOnnxData, MaxPool2dDilations) {
  LOAD_OR_SKIP("test_maxpool_2d_dilations", 1, 1, c); // kernel 2, dil 2
  PoolParams p = poolFor(c.inputs[0], 2, 0, 2);
  Floats y(size_t(p.yCount()));
  maxpool2d(p, c.inputs[0].floats.data(), y.data(), nullptr);
  expectClose(y, c.outputs[0], "maxpool dilations");
}

TEST(KernelOnnxData, MaxPoolWithArgmaxPrecomputedPads) {
  // kernel 5, pads 2; outputs Y and Indices (int64, storage_order 0).
  LOAD_OR_SKIP("test_maxpool_with_argmax_2d_precomputed_pads", 1, 2, c);
  PoolParams p = poolFor(c.inputs[0], 5, 2, 1);
  Floats y(size_t(p.yCount()));
  std::vector<int64_t> idx(y.size());
  maxpool2d(p, c.inputs[0].floats.data(), y.data(), idx.data());
  expectClose(y, c.outputs[0], "maxpool argmax");
  EXPECT_EQ(idx, c.outputs[1].ints);
}

TEST(KernelOnnxData, AveragePool2dPadsBothModes) {
  {
    LOAD_OR_SKIP("test_averagepool_2d_pads_count_include_pad", 1, 1, c);
    PoolParams p = poolFor(c.inputs[0], 3, 2, 1);
    p.countIncludePad = true;
    Floats y(size_t(p.yCount()));
    avgpool2d(p, c.inputs[0].floats.data(), y.data());
    expectClose(y, c.outputs[0], "avgpool count_include_pad");
  }
  {
    LOAD_OR_SKIP("test_averagepool_2d_pads", 1, 1, c);
    PoolParams p = poolFor(c.inputs[0], 3, 2, 1);
    Floats y(size_t(p.yCount()));
    avgpool2d(p, c.inputs[0].floats.data(), y.data());
    expectClose(y, c.outputs[0], "avgpool exclude pad");
  }
}

/// BatchNormalization training mode: inputs X, scale, B, input_mean,
/// input_var; outputs Y, running_mean, running_var (momentum 0.9).
void runBatchNormCase(const char *name, double epsilon) {
  LOAD_OR_SKIP(name, 5, 3, c);
  const Tensor &x = c.inputs[0];
  int64_t n = x.dims[0], ch = x.dims[1], s = x.dims[2] * x.dims[3];
  BatchNormOut out = batchnormTrain(x.floats, c.inputs[1].floats,
                                    c.inputs[2].floats, c.inputs[3].floats,
                                    c.inputs[4].floats, n, ch, s, epsilon, 0.9);
  expectClose(out.y, c.outputs[0], "Y");
  expectClose(out.runMean, c.outputs[1], "running_mean");
  expectClose(out.runVar, c.outputs[2], "running_var");
}

TEST(KernelOnnxData, BatchNormTrainingMode) {
  runBatchNormCase("test_batchnorm_epsilon_training_mode", 1e-2);
  runBatchNormCase("test_batchnorm_example_training_mode", 1e-5);
}

/// LayerNormalization over the trailing dims from `axis` (epsilon 1e-5):
/// outputs Y, Mean, InvStdDev.
void runLayerNormCase(const char *name, int64_t axis) {
  LOAD_OR_SKIP(name, 3, 3, c);
  const Tensor &x = c.inputs[0];
  int64_t rank = int64_t(x.dims.size());
  if (axis < 0)
    axis += rank;
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < rank; ++i)
    (i < axis ? outer : inner) *= x.dims[size_t(i)];
  Floats y(x.floats.size()), mean(static_cast<size_t>(outer)),
      invStd(static_cast<size_t>(outer));
  layernorm(x.floats.data(), c.inputs[1].floats.data(),
            c.inputs[2].floats.data(), y.data(), mean.data(), invStd.data(),
            outer, inner, 1e-5);
  expectClose(y, c.outputs[0], "Y");
  expectClose(mean, c.outputs[1], "Mean");
  expectClose(invStd, c.outputs[2], "InvStdDev");
}

TEST(KernelOnnxData, LayerNormalization) {
  runLayerNormCase("test_layer_normalization_2d_axis1", 1);
  runLayerNormCase("test_layer_normalization_4d_axis_negative_2", -2);
}

TEST(KernelOnnxData, GatherNegativeIndices) {
  LOAD_OR_SKIP("test_gather_negative_indices", 2, 1, c); // axis 0
  const Tensor &data = c.inputs[0], &indices = c.inputs[1];
  ASSERT_EQ(indices.dataType, 7);
  Floats y(indices.ints.size());
  gather(data.floats.data(), indices.ints.data(), y.data(), 1, data.dims[0], 1,
         int64_t(indices.ints.size()));
  expectClose(y, c.outputs[0], "gather");
}

} // namespace
