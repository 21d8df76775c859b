//===- kernels_movement_test.cpp - Broadcast, strided copy, gather --------===//
//
// Part of pipec. Checks pipec_k_broadcast, pipec_k_strided_copy,
// pipec_k_gather and pipec_k_gather_grad against direct index references,
// the adjoint identity between broadcast and reduce_sum, and the gather
// backward against finite differences. Also checks that every kernel the
// ABI header declares is registered.
//
//===----------------------------------------------------------------------===//

#include "kernels_nn_test_util.h"

#include <fstream>
#include <limits>
#include <numeric>
#include <set>

using namespace pipec_test;

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();

//===----------------------------------------------------------------------===//
// Broadcast
//===----------------------------------------------------------------------===//

TEST(KernelBroadcast, MatchesIndexReference) {
  std::mt19937 rng(201);
  for (int trial = 0; trial < 200; ++trial) {
    int64_t rank = randomInt(rng, 0, 5);
    Dims out;
    for (int64_t i = 0; i < rank; ++i)
      out.push_back(randomInt(rng, 1, 5));
    Dims xShape = randomBroadcastShape(rng, out);
    Dims xs = broadcastStrides(xShape, out);
    SCOPED_TRACE(::testing::Message() << "out=" << dimsToString(out)
                                      << " x=" << dimsToString(xShape));
    Floats x = randomFloats(rng, numel(xShape));
    Floats y(size_t(numel(out)), kNaN);
    broadcast(x.data(), y.data(), out, xs);
    Dims ys = rowMajorStrides(out);
    forEachMultiIndex(out, [&](const Dims &idx) {
      EXPECT_EQ(y[size_t(dotIndex(idx, ys))], x[size_t(dotIndex(idx, xs))]);
    });
  }
}

TEST(KernelBroadcast, ReadsThroughArbitraryStrides) {
  // X strides need not be X's own row-major strides: a transposed view.
  Floats x = {0, 1, 2, 3, 4, 5}; // [2, 3]
  Floats y(6);
  broadcast(x.data(), y.data(), {3, 2}, {1, 3});
  EXPECT_EQ(y, (Floats{0, 3, 1, 4, 2, 5}));
  // Rank 0: one element.
  Floats one = {7}, o(1);
  broadcast(one.data(), o.data(), {}, {});
  EXPECT_EQ(o[0], 7.0f);
}

TEST(KernelBroadcast, IsAdjointOfReduceSum) {
  // <broadcast(x), y> == <x, reduce_sum(y)>.
  std::mt19937 rng(202);
  for (int trial = 0; trial < 200; ++trial) {
    int64_t rank = randomInt(rng, 0, 5);
    Dims out;
    for (int64_t i = 0; i < rank; ++i)
      out.push_back(randomInt(rng, 1, 6));
    Dims xShape = randomBroadcastShape(rng, out);
    Dims xs = broadcastStrides(xShape, out);
    Floats x = randomFloats(rng, numel(xShape));
    Floats y = randomFloats(rng, numel(out));
    Floats bx(y.size());
    broadcast(x.data(), bx.data(), out, xs);
    Floats ry(x.size());
    reduceSum(y.data(), ry.data(), out, xs, 1.0);
    double lhs = dot(bx, y), rhs = dot(x, ry), mag = 0;
    for (size_t i = 0; i < y.size(); ++i)
      mag += std::fabs(double(bx[i]) * y[i]);
    EXPECT_NEAR(lhs, rhs, 1e-6 * (1 + mag))
        << "out=" << dimsToString(out) << " x=" << dimsToString(xShape);
  }
}

//===----------------------------------------------------------------------===//
// Strided copy
//===----------------------------------------------------------------------===//

/// A random strided view of `dims` inside a dense buffer of `size`
/// elements: every dimension maps to a (permuted) dimension of the buffer,
/// with a step of 1 or 2 and a random direction (negative strides).
struct View {
  Dims strides;
  int64_t offset = 0;
  int64_t size = 0;
};

View randomView(std::mt19937 &rng, const Dims &dims) {
  size_t rank = dims.size();
  Dims perm(rank);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  // full[perm[k]] holds view dimension k with step[k] plus some slack.
  Dims full(rank), step(rank), sign(rank);
  for (size_t k = 0; k < rank; ++k) {
    step[k] = randomInt(rng, 1, 2);
    sign[k] = randomInt(rng, 0, 1) ? 1 : -1;
    full[size_t(perm[k])] = (dims[k] - 1) * step[k] + 1 + randomInt(rng, 0, 2);
  }
  Dims fullStrides = rowMajorStrides(full);
  View v;
  v.size = numel(full);
  v.strides.resize(rank);
  for (size_t k = 0; k < rank; ++k) {
    int64_t fs = fullStrides[size_t(perm[k])];
    int64_t span = (dims[k] - 1) * step[k];
    int64_t slack = full[size_t(perm[k])] - 1 - span;
    int64_t start = randomInt(rng, 0, slack);
    if (sign[k] < 0)
      start += span; // walk backwards from the far end
    v.strides[k] = sign[k] * step[k] * fs;
    v.offset += start * fs;
  }
  return v;
}

TEST(KernelStridedCopy, MatchesIndexReference) {
  std::mt19937 rng(203);
  int negative = 0;
  for (int trial = 0; trial < 300; ++trial) {
    int64_t rank = randomInt(rng, 0, 4);
    Dims dims;
    for (int64_t i = 0; i < rank; ++i)
      dims.push_back(randomInt(rng, 1, 5));
    View sv = randomView(rng, dims), dv = randomView(rng, dims);
    for (int64_t s : sv.strides)
      negative += s < 0;
    bool accumulate = trial % 2 == 1;
    SCOPED_TRACE(::testing::Message()
                 << "dims=" << dimsToString(dims)
                 << " src=" << dimsToString(sv.strides) << "+" << sv.offset
                 << " dst=" << dimsToString(dv.strides) << "+" << dv.offset
                 << " accumulate=" << accumulate);
    Floats src = randomFloats(rng, sv.size);
    Floats dst = randomFloats(rng, dv.size);
    Floats ref = dst;
    forEachMultiIndex(dims, [&](const Dims &idx) {
      float v = src[size_t(sv.offset + dotIndex(idx, sv.strides))];
      float &d = ref[size_t(dv.offset + dotIndex(idx, dv.strides))];
      d = accumulate ? d + v : v;
    });
    stridedCopy(src.data(), dst.data(), dims, sv.strides, sv.offset, dv.strides,
                dv.offset, accumulate);
    EXPECT_EQ(dst, ref); // also: everything outside the view is untouched
  }
  EXPECT_GT(negative, 50);
}

TEST(KernelStridedCopy, ReversesAndConcatenates) {
  // Reverse a row (Slice with step -1) into the second half of a buffer,
  // then accumulate the forward row on top (a Concat gradient piece).
  Floats src = {1, 2, 3, 4}, dst(8, 0);
  stridedCopy(src.data(), dst.data(), {4}, {-1}, 3, {1}, 4, false);
  EXPECT_EQ(dst, (Floats{0, 0, 0, 0, 4, 3, 2, 1}));
  stridedCopy(src.data(), dst.data(), {4}, {1}, 0, {1}, 4, true);
  EXPECT_EQ(dst, (Floats{0, 0, 0, 0, 5, 5, 5, 5}));
  // Rank 0 copies one element; an empty dimension copies nothing.
  stridedCopy(src.data(), dst.data(), {}, {}, 2, {}, 0, false);
  EXPECT_EQ(dst[0], 3.0f);
  stridedCopy(src.data(), dst.data(), {0, 3}, {1, 1}, 0, {1, 1}, 1, false);
  EXPECT_EQ(dst[1], 0.0f);
}

//===----------------------------------------------------------------------===//
// Gather
//===----------------------------------------------------------------------===//

struct GatherCase {
  int64_t outer, axisDim, inner, nIndices;
};

TEST(KernelGather, MatchesReferenceWithNegativeAndOutOfRangeIndices) {
  std::mt19937 rng(204);
  for (int trial = 0; trial < 60; ++trial) {
    GatherCase g{randomInt(rng, 1, 3), randomInt(rng, 1, 7),
                 randomInt(rng, 1, 5), randomInt(rng, 1, 9)};
    std::vector<int64_t> idx(size_t(g.nIndices));
    for (int64_t &i : idx)
      i = randomInt(rng, -g.axisDim - 1, g.axisDim); // some out of range
    Floats data = randomFloats(rng, g.outer * g.axisDim * g.inner);
    Floats y(size_t(g.outer * g.nIndices * g.inner), kNaN);
    gather(data.data(), idx.data(), y.data(), g.outer, g.axisDim, g.inner,
           g.nIndices);
    for (int64_t o = 0; o < g.outer; ++o)
      for (int64_t i = 0; i < g.nIndices; ++i)
        for (int64_t j = 0; j < g.inner; ++j) {
          int64_t k = idx[size_t(i)];
          if (k < 0)
            k += g.axisDim;
          float ref = (k >= 0 && k < g.axisDim)
                          ? data[size_t((o * g.axisDim + k) * g.inner + j)]
                          : 0.0f;
          EXPECT_EQ(y[size_t((o * g.nIndices + i) * g.inner + j)], ref)
              << "index " << idx[size_t(i)] << " axisDim " << g.axisDim;
        }
  }
}

TEST(KernelGatherGrad, MatchesFiniteDifferencesWithRepeatedIndices) {
  std::mt19937 rng(205);
  for (int trial = 0; trial < 20; ++trial) {
    GatherCase g{randomInt(rng, 1, 3), randomInt(rng, 2, 5),
                 randomInt(rng, 1, 4), randomInt(rng, 3, 10)};
    std::vector<int64_t> idx(size_t(g.nIndices));
    for (int64_t &i : idx)
      i = randomInt(rng, -g.axisDim, g.axisDim - 1);
    idx[1] = idx[0]; // a repeat for sure (and its negative twin, maybe)
    idx[2] = idx[0] < 0 ? idx[0] + g.axisDim : idx[0] - g.axisDim;
    if (trial % 3 == 0)
      idx.back() = g.axisDim + 3; // out of range: no gradient
    Floats data = randomFloats(rng, g.outer * g.axisDim * g.inner);
    Floats r = randomFloats(rng, g.outer * g.nIndices * g.inner);
    Floats dData(data.size(), kNaN);
    gatherGrad(r.data(), idx.data(), dData.data(), g.outer, g.axisDim, g.inner,
               g.nIndices);
    auto loss = [&](const Floats &d) {
      Floats y(r.size());
      gather(d.data(), idx.data(), y.data(), g.outer, g.axisDim, g.inner,
             g.nIndices);
      return dot(r, y);
    };
    // Linear: a large step is exact up to rounding.
    expectGradMatchesFiniteDifferences(data, dData, loss, 0.25, 1e-5, 1e-5,
                                       "gather grad trial " +
                                           std::to_string(trial));
  }
}

//===----------------------------------------------------------------------===//
// Registry
//===----------------------------------------------------------------------===//

TEST(KernelRegistry, EveryKernelDeclaredInTheHeaderIsRegistered) {
  // The header is the ABI: every `void pipec_k_*(` it declares must be
  // found by name (the table in cpu/registry.cpp is kept by hand).
  std::string path = std::string(__FILE__);
  path = path.substr(0, path.rfind('/')) + "/../include/pipec_rt.h";
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << path;
  std::string text((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  std::set<std::string> names;
  const std::string prefix = "void pipec_k_";
  for (size_t at = text.find(prefix); at != std::string::npos;
       at = text.find(prefix, at + 1)) {
    size_t begin = at + 5, end = text.find('(', begin);
    if (end != std::string::npos)
      names.insert(text.substr(begin, end - begin));
  }
  EXPECT_GE(names.size(), 34u); // as of ABI version 1
  for (const std::string &name : names)
    EXPECT_NE(pipec_rt_find_kernel(name.c_str()), nullptr) << name;
  // The multi-tensor kernels, declared by a macro over their list.
  for (const char *name : {
#define PIPEC_MULTI_TENSOR(name, bufs, ints, firstOutput, shared)              \
  "pipec_k_" #name "_multi", "pipec_k_" #name "_multi_f64",
#include "pipec_multi_tensor.def"
       })
    EXPECT_NE(pipec_rt_find_kernel(name), nullptr) << name;
  EXPECT_EQ(pipec_rt_find_kernel("pipec_k_conv2d"), &pipec_k_conv2d);
  EXPECT_EQ(pipec_rt_find_kernel("pipec_k_gather_grad"), &pipec_k_gather_grad);
}

} // namespace

TEST(KernelReduceSum, BiasGradientAddsRowsInChunksOf64) {
  // [R, C] onto [C] adds rows in chunks of 64 (each chunk in order from 0,
  // then the chunk sums in order from 0): the order the CUDA kernel
  // reproduces in parallel, so the two agree to the bit. Values of very
  // different magnitudes make another order visible in the float result.
  const int64_t rows = 200, cols = 3;
  std::mt19937 rng(77);
  Floats x = randomFloats(rng, rows * cols);
  for (int64_t i = 0; i < rows * cols; i += 7)
    x[size_t(i)] *= 1e6f;
  Floats chunked(cols, 0.0f), serial(cols, 0.0f);
  for (int64_t j = 0; j < cols; ++j) {
    for (int64_t r0 = 0; r0 < rows; r0 += 64) {
      float s = 0.0f;
      for (int64_t r = r0; r < std::min<int64_t>(rows, r0 + 64); ++r)
        s += x[size_t(r * cols + j)];
      chunked[size_t(j)] += s;
    }
    for (int64_t r = 0; r < rows; ++r)
      serial[size_t(j)] += x[size_t(r * cols + j)];
  }
  Floats y(cols);
  reduceSum(x.data(), y.data(), {rows, cols}, {0, 1}, 1.0);
  EXPECT_EQ(y, chunked);
  EXPECT_NE(chunked, serial) << "the data does not tell the orders apart";
  reduceSum(x.data(), y.data(), {rows, cols}, {0, 1}, 0.5);
  for (int64_t j = 0; j < cols; ++j)
    EXPECT_EQ(y[size_t(j)], chunked[size_t(j)] * 0.5f);
}
