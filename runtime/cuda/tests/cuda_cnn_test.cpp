//===- cuda_cnn_test.cpp - CUDA pooling, batch norm, resize, dropout ------===//
//
// Part of pipec's GPU tests (ctest label `gpu`). Runs the CUDA twins of
// maxpool2d(_grad), avgpool2d(_grad), batchnorm_train / _infer / _grad,
// resize_linear(_grad) and dropout against the CPU kernels on the same
// inputs (cuda_test_util.h): padding, strides, dilations, overlapping
// windows, windows entirely in the padding, ceil-mode output sizes, ties
// and NaN in max windows, NULL optional outputs, in-place outputs and
// aliased running statistics, every resize coordinate mode up and down,
// and dropout masks compared bit for bit across seeds, salts and ratios.
//
//===----------------------------------------------------------------------===//

#include "cuda_test_util.h"

#include "pipec_rt.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

using namespace pipec::cudatest;

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();

/// Pooling and resize add and multiply in the CPU's order with the CPU's
/// roundings (the sums of overlapping windows included), so they are
/// compared bit for bit.
constexpr double kPoolRtol = 0, kPoolAtol = 0;

//===----------------------------------------------------------------------===//
// Pooling
//===----------------------------------------------------------------------===//

struct Pool {
  int64_t n, c, h, w, kh, kw, sh, sw;
  int64_t pt = 0, pl = 0, pb = 0, pr = 0;
  int64_t dh = 1, dw = 1;
  /// Output sizes rounded up (ceil mode): the last window may leave the
  /// padded input.
  bool ceil = false;

  int64_t outLen(int64_t in, int64_t k, int64_t s, int64_t p0, int64_t p1,
                 int64_t d) const {
    const int64_t span = in + p0 + p1 - ((k - 1) * d + 1);
    return (ceil ? (span + s - 1) / s : span / s) + 1;
  }
  int64_t oh() const { return outLen(h, kh, sh, pt, pb, dh); }
  int64_t ow() const { return outLen(w, kw, sw, pl, pr, dw); }
  int64_t nX() const { return n * c * h * w; }
  int64_t nY() const { return n * c * oh() * ow(); }
  std::vector<int64_t> maxInts() const {
    return {n, c, h, w, kh, kw, oh(), ow(), sh, sw, pt, pl, dh, dw};
  }
  std::vector<int64_t> avgInts(bool countIncludePad) const {
    return {n, c, h, w, kh, kw, oh(), ow(), sh, sw, pt, pl, countIncludePad};
  }
};

::testing::Message describe(const Pool &p) {
  ::testing::Message m;
  m << "pool N=" << p.n << " C=" << p.c << " " << p.h << "x" << p.w
    << " k=" << p.kh << "x" << p.kw << " s=" << p.sh << "," << p.sw
    << " pads=" << p.pt << "," << p.pl << "," << p.pb << "," << p.pr
    << " d=" << p.dh << "," << p.dw << " ceil=" << p.ceil << " out=" << p.oh()
    << "x" << p.ow();
  return m;
}

/// Inputs with many ties (values on a grid of 0.5) and, optionally, a few
/// NaN.
std::vector<float> tiedInput(size_t n, unsigned seed, bool withNaN) {
  std::vector<float> v = randf(n, -2, 2, seed);
  for (float &x : v)
    x = std::round(x * 2) / 2;
  if (withNaN)
    for (size_t i = 5; i < n; i += 97)
      v[i] = kNaN;
  return v;
}

enum class Data { Random, Tied, TiedNaN };

std::vector<float> poolInput(const Pool &p, Data data, unsigned seed) {
  const size_t n = size_t(p.nX());
  return data == Data::Random ? randf(n, -1, 1, seed)
                              : tiedInput(n, seed, data == Data::TiedNaN);
}

void maxPoolCase(const Pool &p, bool withIndices, Data data = Data::Random) {
  SCOPED_TRACE(describe(p) << " indices=" << withIndices
                           << " data=" << int(data));
  expectSameAsCpu("maxpool2d",
                  {in(poolInput(p, data, 101)), out(size_t(p.nY())),
                   withIndices ? outI64(size_t(p.nY())) : null()},
                  p.maxInts(), {}, 0, 0);
}

/// maxpool2d_grad with the indices of the CPU forward.
void maxPoolGradCase(const Pool &p, Data data = Data::Random) {
  SCOPED_TRACE(describe(p) << " data=" << int(data));
  std::vector<float> x = poolInput(p, data, 102);
  std::vector<float> y(size_t(p.nY()));
  std::vector<int64_t> indices(size_t(p.nY()));
  void *fwd[] = {x.data(), y.data(), indices.data()};
  const std::vector<int64_t> ints = p.maxInts();
  pipec_k_maxpool2d(cpuContext(), fwd, ints.data(), nullptr);
  expectSameAsCpu("maxpool2d_grad",
                  {in(randf(size_t(p.nY()), -1, 1, 103)), inI64(indices),
                   out(size_t(p.nX()))},
                  {p.nX(), p.nY()}, {}, 0, 0);
}

void avgPoolCase(const Pool &p, bool countIncludePad) {
  SCOPED_TRACE(describe(p) << " countIncludePad=" << countIncludePad);
  expectSameAsCpu("avgpool2d",
                  {in(randf(size_t(p.nX()), -1, 1, 111)), out(size_t(p.nY()))},
                  p.avgInts(countIncludePad), {}, kPoolRtol, kPoolAtol);
  expectSameAsCpu("avgpool2d_grad",
                  {in(randf(size_t(p.nY()), -1, 1, 112)), out(size_t(p.nX()))},
                  p.avgInts(countIncludePad), {}, kPoolRtol, kPoolAtol);
}

/// The shapes every pooling test runs (max pooling adds dilations).
std::vector<Pool> poolShapes() {
  std::vector<Pool> shapes;
  shapes.push_back({2, 3, 8, 8, 2, 2, 2, 2});               // plain 2x2/2
  shapes.push_back({2, 3, 17, 17, 3, 3, 2, 2, 1, 1, 1, 1}); // ResNet stem
  shapes.push_back({1, 2, 9, 11, 3, 3, 1, 1, 1, 1, 1, 1});  // overlapping
  shapes.push_back({1, 2, 9, 11, 3, 3, 1, 1});              // overlapping
  shapes.push_back({2, 2, 7, 10, 2, 3, 1, 2, 0, 1, 1, 0});  // asymmetric
  shapes.push_back({1, 3, 6, 7, 3, 3, 2, 2, 0, 0, 0, 0});   // floor mode
  Pool ceilMode = {1, 3, 6, 7, 3, 3, 2, 2};                 // last window
  ceilMode.ceil = true;                                     // leaves X
  shapes.push_back(ceilMode);
  shapes.push_back({1, 1, 1, 1, 1, 1, 1, 1});                // one element
  shapes.push_back({4, 16, 56, 56, 3, 3, 2, 2, 1, 1, 1, 1}); // larger
  return shapes;
}

TEST(CudaMaxPool, ShapesAndIndices) {
  PIPEC_REQUIRE_GPU();
  for (const Pool &p : poolShapes()) {
    maxPoolCase(p, true);
    maxPoolCase(p, false); // Indices NULL
  }
}

TEST(CudaMaxPool, Dilations) {
  PIPEC_REQUIRE_GPU();
  Pool p = {2, 3, 13, 12, 3, 3, 1, 1, 2, 2, 2, 2};
  p.dh = p.dw = 2;
  maxPoolCase(p, true);
  maxPoolCase(p, false);
  Pool q = {1, 2, 15, 9, 2, 3, 2, 1, 1, 0, 1, 2};
  q.dh = 3;
  q.dw = 2;
  maxPoolCase(q, true);
  // Dilation gaps straddling a tiny image: some windows have no element.
  Pool r = {1, 1, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1};
  r.dh = r.dw = 3;
  maxPoolCase(r, true);
}

TEST(CudaMaxPool, TiesNaNAndEmptyWindows) {
  PIPEC_REQUIRE_GPU();
  for (const Pool &p : poolShapes()) {
    maxPoolCase(p, true, Data::Tied);
    maxPoolCase(p, true, Data::TiedNaN);
  }
  // Pads as large as the kernel: the corner windows lie in the padding
  // (lowest float, index -1).
  maxPoolCase({1, 2, 5, 5, 2, 2, 1, 1, 2, 2, 2, 2}, true);
  maxPoolCase({1, 2, 5, 5, 2, 2, 1, 1, 2, 2, 2, 2}, false);
}

TEST(CudaMaxPool, MalformedParametersPoison) {
  PIPEC_REQUIRE_GPU();
  // Stride 0: Y is NaN, Indices -1, on both sides.
  expectSameAsCpu("maxpool2d",
                  {in(randf(2 * 16, -1, 1, 120)), out(2 * 9), outI64(2 * 9)},
                  {1, 2, 4, 4, 2, 2, 3, 3, 0, 1, 0, 0, 1, 1}, {}, 0, 0);
}

TEST(CudaMaxPoolGrad, FromForwardIndices) {
  PIPEC_REQUIRE_GPU();
  for (const Pool &p : poolShapes()) {
    maxPoolGradCase(p);
    maxPoolGradCase(p, Data::Tied); // many outputs share an input
  }
  Pool dilated = {2, 3, 13, 12, 3, 3, 1, 1, 2, 2, 2, 2};
  dilated.dh = dilated.dw = 2;
  maxPoolGradCase(dilated);
  // Windows in the padding: index -1, skipped.
  maxPoolGradCase({1, 2, 5, 5, 2, 2, 1, 1, 2, 2, 2, 2});
  // Overlapping windows over a larger batch (several sort passes).
  maxPoolGradCase({4, 8, 32, 32, 3, 3, 1, 1, 1, 1, 1, 1}, Data::Tied);
}

TEST(CudaMaxPoolGrad, HandMadeIndices) {
  PIPEC_REQUIRE_GPU();
  // Repeated indices (added in output order), -1 and nX (skipped), and
  // untouched elements (zero).
  expectSameAsCpu("maxpool2d_grad",
                  {in({0.5f, -1.25f, 3.f, 7.f, 100.f, 1e-7f, 2.f, -7.f, 1.f}),
                   inI64({3, 3, -1, 9, 10, 3, 0, 9, 3}), out(10)},
                  {10, 9}, {}, 0, 0);
  // No outputs: dX is zeroed.
  expectSameAsCpu("maxpool2d_grad", {in({}), inI64({}), out(6)}, {6, 0}, {}, 0,
                  0);
}

TEST(CudaAvgPool, CountIncludePadBothWays) {
  PIPEC_REQUIRE_GPU();
  for (const Pool &p : poolShapes()) {
    avgPoolCase(p, true);
    avgPoolCase(p, false);
  }
  // Pads as large as the kernel: windows with no element in the image.
  avgPoolCase({1, 2, 5, 5, 2, 2, 1, 1, 2, 2, 2, 2}, true);
  avgPoolCase({1, 2, 5, 5, 2, 2, 1, 1, 2, 2, 2, 2}, false);
}

TEST(CudaAvgPool, MalformedParametersPoison) {
  PIPEC_REQUIRE_GPU();
  const std::vector<int64_t> ints = {1, 2, 4, 4, 0, 2, 3, 3, 1, 1, 0, 0, 1};
  expectSameAsCpu("avgpool2d", {in(randf(32, -1, 1, 121)), out(18)}, ints, {},
                  0, 0);
  expectSameAsCpu("avgpool2d_grad", {in(randf(18, -1, 1, 122)), out(32)}, ints,
                  {}, 0, 0);
}

//===----------------------------------------------------------------------===//
// BatchNormalization
//===----------------------------------------------------------------------===//

struct BatchNorm {
  int64_t n, c, s;
  float offset = 0; ///< added to X: |mean| >> std
  double eps = 1e-5, momentum = 0.9;

  size_t total() const { return size_t(n * c * s); }
  std::vector<float> x() const {
    return randf(total(), offset - 1, offset + 1, 201);
  }
  std::vector<float> scale() const { return randf(size_t(c), 0.5f, 1.5f, 202); }
  std::vector<float> bias() const { return randf(size_t(c), -1, 1, 203); }
  std::vector<float> runMean() const { return randf(size_t(c), -1, 1, 204); }
  std::vector<float> runVar() const { return randf(size_t(c), 0.1f, 2, 205); }
};

::testing::Message describe(const BatchNorm &b) {
  ::testing::Message m;
  m << "batchnorm N=" << b.n << " C=" << b.c << " S=" << b.s
    << " offset=" << b.offset << " eps=" << b.eps << " momentum=" << b.momentum;
  return m;
}

/// batchnorm_train; `aliasRun`: runMeanOut / runVarOut are runMean /
/// runVar; `nullStats`: the four statistics outputs are NULL.
void batchNormTrainCase(const BatchNorm &b, bool aliasRun, bool nullStats,
                        bool inPlace) {
  SCOPED_TRACE(describe(b) << " aliasRun=" << aliasRun << " nullStats="
                           << nullStats << " inPlace=" << inPlace);
  const size_t c = size_t(b.c);
  expectSameAsCpu("batchnorm_train",
                  {in(b.x()), in(b.scale()), in(b.bias()), in(b.runMean()),
                   in(b.runVar()), inPlace ? alias(0) : out(b.total()),
                   nullStats ? null() : out(c), nullStats ? null() : out(c),
                   nullStats  ? null()
                   : aliasRun ? alias(3)
                              : out(c),
                   nullStats  ? null()
                   : aliasRun ? alias(4)
                              : out(c)},
                  {b.n, b.c, b.s}, {b.eps, b.momentum});
}

TEST(CudaBatchNorm, Train) {
  PIPEC_REQUIRE_GPU();
  for (int64_t n : {1, 4})
    for (int64_t s : {1, 49}) {
      BatchNorm b = {n, 6, s};
      batchNormTrainCase(b, false, false, false);
      batchNormTrainCase(b, true, false, false);
      batchNormTrainCase(b, true, false, true);
    }
  batchNormTrainCase({8, 32, 196}, true, false, false);  // a block's worth
  batchNormTrainCase({3, 5, 4000}, false, false, false); // > 1024 per channel
  batchNormTrainCase({4, 7, 49, 100.f}, true, false, false); // large mean
  // Few channels of many values: each channel split across blocks
  // (batchnorm.cu, splitParts), in place too, with a last part shorter
  // than the others, and with a large mean.
  batchNormTrainCase({8, 4, 4096}, false, false, false);
  batchNormTrainCase({8, 4, 4096}, true, false, true);
  batchNormTrainCase({3, 5, 7001}, false, false, false);
  batchNormTrainCase({16, 3, 2048, 100.f}, true, false, false);
  batchNormTrainCase({8, 4, 4096}, false, true, false);
  batchNormTrainCase({4096, 3, 7}, false, false, false); // rows < a block
  BatchNorm other = {4, 3, 25};
  other.eps = 1e-3;
  other.momentum = 0.1;
  batchNormTrainCase(other, false, false, false);
}

TEST(CudaBatchNorm, TrainNullStatistics) {
  PIPEC_REQUIRE_GPU();
  batchNormTrainCase({4, 6, 49}, false, true, false);
  batchNormTrainCase({1, 6, 1}, false, true, true);
}

TEST(CudaBatchNorm, Infer) {
  PIPEC_REQUIRE_GPU();
  for (int64_t n : {1, 4})
    for (int64_t s : {1, 49})
      for (int inPlace = 0; inPlace < 2; ++inPlace) {
        const BatchNorm b = {n, 6, s};
        SCOPED_TRACE(describe(b) << " inPlace=" << inPlace);
        expectSameAsCpu("batchnorm_infer",
                        {in(b.x()), in(b.scale()), in(b.bias()),
                         in(b.runMean()), in(b.runVar()),
                         inPlace ? alias(0) : out(b.total())},
                        {b.n, b.c, b.s}, {b.eps});
      }
}

/// batchnorm_grad with the saved statistics of the CPU forward.
void batchNormGradCase(const BatchNorm &b, bool withDx, bool withScale,
                       bool withBias, bool inPlace) {
  SCOPED_TRACE(describe(b) << " dX=" << withDx << " dScale=" << withScale
                           << " dBias=" << withBias << " inPlace=" << inPlace);
  std::vector<float> x = b.x(), scale = b.scale(), bias = b.bias();
  std::vector<float> y(b.total()), savedMean(size_t(b.c)),
      savedInvStd(size_t(b.c));
  void *fwd[] = {x.data(), scale.data(), bias.data(),      nullptr,
                 nullptr,  y.data(),     savedMean.data(), savedInvStd.data(),
                 nullptr,  nullptr};
  const int64_t ints[] = {b.n, b.c, b.s};
  const double reals[] = {b.eps, b.momentum};
  pipec_k_batchnorm_train(cpuContext(), fwd, ints, reals);
  const size_t c = size_t(b.c);
  expectSameAsCpu("batchnorm_grad",
                  {in(x), in(scale), in(savedMean), in(savedInvStd),
                   in(randf(b.total(), -1, 1, 206)),
                   !withDx   ? null()
                   : inPlace ? alias(4)
                             : out(b.total()),
                   withScale ? out(c) : null(), withBias ? out(c) : null()},
                  {b.n, b.c, b.s});
}

TEST(CudaBatchNormGrad, AllOutputs) {
  PIPEC_REQUIRE_GPU();
  for (int64_t n : {1, 4})
    for (int64_t s : {1, 49}) {
      const BatchNorm b = {n, 6, s};
      batchNormGradCase(b, true, true, true, false);
      batchNormGradCase(b, true, true, true, true);
    }
  batchNormGradCase({8, 32, 196}, true, true, true, false);
  batchNormGradCase({3, 5, 4000}, true, true, true, true);
  batchNormGradCase({4, 7, 49, 100.f}, true, true, true, false);
  // Channels split across blocks (see CudaBatchNorm.Train).
  batchNormGradCase({8, 4, 4096}, true, true, true, false);
  batchNormGradCase({8, 4, 4096}, true, true, true, true);
  batchNormGradCase({3, 5, 7001}, true, true, true, false);
  batchNormGradCase({16, 3, 2048, 100.f}, true, true, true, false);
  batchNormGradCase({8, 4, 4096}, false, true, false, false);
  batchNormGradCase({8, 4, 4096}, true, false, false, false);
  batchNormGradCase({4096, 3, 7}, true, true, true, false); // rows < a block
}

TEST(CudaBatchNormGrad, OptionalOutputs) {
  PIPEC_REQUIRE_GPU();
  const BatchNorm b = {4, 6, 49};
  batchNormGradCase(b, false, true, true, false);
  batchNormGradCase(b, true, false, false, false);
  batchNormGradCase(b, false, false, true, false);
  batchNormGradCase(b, true, false, true, true);
}

TEST(CudaBatchNormGrad, NoElementsZeroParameterGradients) {
  PIPEC_REQUIRE_GPU();
  expectSameAsCpu("batchnorm_grad",
                  {in({}), in(randf(3)), in(randf(3)), in(randf(3)), in({}),
                   out(0), out(3), out(3)},
                  {0, 3, 5});
}

//===----------------------------------------------------------------------===//
// Resize
//===----------------------------------------------------------------------===//

/// resize_linear and its backward for every coordinate mode.
void resizeCase(int64_t n, int64_t c, int64_t h, int64_t w, int64_t oh,
                int64_t ow, double scaleH, double scaleW) {
  for (int64_t mode = PIPEC_RESIZE_HALF_PIXEL; mode <= PIPEC_RESIZE_ASYMMETRIC;
       ++mode) {
    SCOPED_TRACE(::testing::Message()
                 << "resize N=" << n << " C=" << c << " " << h << "x" << w
                 << " -> " << oh << "x" << ow << " scales=" << scaleH << ","
                 << scaleW << " mode=" << mode);
    const std::vector<int64_t> ints = {n, c, h, w, oh, ow, mode};
    expectSameAsCpu("resize_linear",
                    {in(randf(size_t(n * c * h * w), -1, 1, 301)),
                     out(size_t(n * c * oh * ow))},
                    ints, {scaleH, scaleW}, kPoolRtol, kPoolAtol);
    expectSameAsCpu("resize_linear_grad",
                    {in(randf(size_t(n * c * oh * ow), -1, 1, 302)),
                     out(size_t(n * c * h * w))},
                    ints, {scaleH, scaleW}, kPoolRtol, kPoolAtol);
  }
}

TEST(CudaResize, UpScale) {
  PIPEC_REQUIRE_GPU();
  resizeCase(2, 3, 5, 7, 10, 14, 2.0, 2.0);
  resizeCase(2, 3, 5, 7, 10, 17, 2.0, 2.5); // floored width: L = 17.5
  resizeCase(1, 2, 6, 4, 10, 6, 1.7, 1.6);  // non-integral scales
  resizeCase(1, 2, 1, 3, 4, 9, 4.0, 3.0);   // one input row
  resizeCase(2, 4, 28, 28, 56, 56, 2.0, 2.0);
}

TEST(CudaResize, DownScaleAndIdentity) {
  PIPEC_REQUIRE_GPU();
  resizeCase(2, 3, 12, 9, 6, 4, 0.5, 0.5);            // floored width
  resizeCase(1, 2, 6, 9, 4, 6, 4.0 / 6.0, 6.0 / 9.0); // given sizes
  resizeCase(1, 2, 5, 5, 1, 1, 0.2, 0.2);             // one output: L = 1
  resizeCase(1, 2, 7, 8, 7, 8, 1.0, 1.0);
  resizeCase(2, 3, 31, 17, 9, 5, 0.3, 0.3); // reads past the last row
}

TEST(CudaResize, InconsistentSizes) {
  PIPEC_REQUIRE_GPU();
  // Output sizes larger than in * scale (L < 1 with several outputs):
  // align_corners then maps outputs backwards; the backward scans all.
  resizeCase(1, 2, 4, 5, 3, 4, 0.2, 0.15);
}

TEST(CudaResize, MalformedParametersPoison) {
  PIPEC_REQUIRE_GPU();
  const std::vector<int64_t> ints = {1, 2, 4, 4, 8, 8, 9}; // unknown mode
  expectSameAsCpu("resize_linear", {in(randf(32)), out(128)}, ints, {2.0, 2.0},
                  0, 0);
  expectSameAsCpu("resize_linear_grad", {in(randf(128)), out(32)}, ints,
                  {2.0, 2.0}, 0, 0);
}

//===----------------------------------------------------------------------===//
// Dropout
//===----------------------------------------------------------------------===//

void dropoutCase(int64_t n, int64_t sampleElems, int64_t salt, int64_t seed,
                 int64_t firstSample, double ratio, bool inPlace) {
  SCOPED_TRACE(::testing::Message()
               << "dropout n=" << n << " sampleElems=" << sampleElems
               << " salt=" << salt << " seed=" << seed << " firstSample="
               << firstSample << " ratio=" << ratio << " inPlace=" << inPlace);
  expectSameAsCpu("dropout",
                  {in(randf(size_t(n), -1, 1, 401)), inI64({seed, firstSample}),
                   inPlace ? alias(0) : out(size_t(n)), out(size_t(n))},
                  {n, sampleElems, salt}, {ratio}, 0, 0);
}

TEST(CudaDropout, MaskBitForBit) {
  PIPEC_REQUIRE_GPU();
  for (double ratio : {0.1, 0.5})
    for (int64_t salt : {0, 7, -3})
      for (int64_t seed : {int64_t(42), int64_t(-5), int64_t(1234567890123)}) {
        dropoutCase(6 * 75, 75, salt, seed, 0, ratio, false);
        dropoutCase(6 * 75, 75, salt, seed, 96, ratio, false);
      }
  dropoutCase(100003, 1000, 11, 42, 8, 0.5, false); // several blocks
  dropoutCase(1000, 0, 3, 42, 5, 0.1, false);       // sampleElems 0 -> 1
  dropoutCase(1000, 10, 3, 42, 5, 0.3, true);       // Y aliases X
  dropoutCase(500, 10, 3, 42, 5, 0.0, false);       // keep everything
  dropoutCase(500, 10, 3, 42, 5, 1.0, false);       // drop everything
}

} // namespace
