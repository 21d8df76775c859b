//===- kernels_multi_tensor_test.cpp - pipec_k_*_multi --------------------===//
//
// Part of pipec's runtime tests. Every multi-tensor kernel of
// include/pipec_multi_tensor.def equals its one-tensor kernel called on
// each tensor, bit for bit, in float32 and float64; the update count T
// and the learning rate are shared.
//
//===----------------------------------------------------------------------===//

#include "kernels_test_util.h"

#include <cstring>
#include <random>
#include <string>

using namespace pipec_test;

namespace {

struct Kind {
  std::string name;
  int buffers, ints, firstOutput;
  unsigned shared;
};

const std::vector<Kind> &kinds() {
  static const std::vector<Kind> all = {
#define PIPEC_MULTI_TENSOR(name, bufs, ints, firstOutput, shared)              \
  {#name, bufs, ints, firstOutput, shared},
#include "pipec_multi_tensor.def"
  };
  return all;
}

/// The ints and reals of one tensor of `kind`.
std::vector<int64_t> tensorInts(const Kind &kind, int64_t n, int64_t flag) {
  std::vector<int64_t> ints = {n};
  if (kind.ints == 2)
    ints.push_back(flag); // momentum's nesterov
  return ints;
}

std::vector<double> realsOf(const Kind &kind) {
  if (kind.name == "fill")
    return {0.25};
  if (kind.name == "momentum")
    return {0.9, 0.8, 0.01};
  if (kind.name == "adam")
    return {0.9, 0.999, 0.01, 0.001, 1e-8};
  if (kind.name == "adagrad")
    return {0.01, 1e-6, 0.01};
  return {};
}

template <typename T> void runKind(const Kind &kind, int64_t flag) {
  const std::vector<int64_t> lengths = {7, 1, 4099, 0, 33};
  std::mt19937 rng(11);
  // Shared scalars: the rate (float) at index 0 or 2, the count (int64) at
  // index 1.
  T rate = T(0.05);
  int64_t count = 3;
  // Per tensor and buffer, two identical copies: one for the multi call,
  // one for the one-tensor calls.
  std::vector<std::vector<std::vector<T>>> multi, single;
  std::vector<void *> multiBufs;
  std::vector<int64_t> multiInts = {int64_t(lengths.size())};
  for (int64_t n : lengths) {
    std::vector<std::vector<T>> buffers;
    for (int b = 0; b < kind.buffers; ++b) {
      std::vector<T> v(static_cast<size_t>(n));
      for (T &x : v)
        x = T(std::uniform_real_distribution<double>(0, 1)(rng));
      buffers.push_back(std::move(v));
    }
    multi.push_back(buffers);
    single.push_back(buffers);
    std::vector<int64_t> ints = tensorInts(kind, n, flag);
    multiInts.insert(multiInts.end(), ints.begin(), ints.end());
  }
  auto pointers = [&](std::vector<std::vector<T>> &buffers) {
    std::vector<void *> p;
    for (int b = 0; b < kind.buffers; ++b) {
      if ((kind.shared >> b) & 1u)
        p.push_back(b == 1 ? static_cast<void *>(&count)
                           : static_cast<void *>(&rate));
      else
        p.push_back(buffers[size_t(b)].data());
    }
    return p;
  };
  for (auto &buffers : multi) {
    std::vector<void *> p = pointers(buffers);
    multiBufs.insert(multiBufs.end(), p.begin(), p.end());
  }
  const std::string suffix = sizeof(T) == 8 ? "_f64" : "";
  pipec_kernel_fn one =
      pipec_rt_find_kernel(("pipec_k_" + kind.name + suffix).c_str());
  pipec_kernel_fn all = pipec_rt_find_kernel(
      ("pipec_k_" + kind.name + "_multi" + suffix).c_str());
  ASSERT_NE(one, nullptr);
  ASSERT_NE(all, nullptr);
  const std::vector<double> reals = realsOf(kind);
  all(kctx(), multiBufs.data(), multiInts.data(), reals.data());
  for (size_t t = 0; t < lengths.size(); ++t) {
    std::vector<void *> p = pointers(single[t]);
    std::vector<int64_t> ints = tensorInts(kind, lengths[t], flag);
    one(kctx(), p.data(), ints.data(), reals.data());
  }
  for (size_t t = 0; t < lengths.size(); ++t)
    for (int b = 0; b < kind.buffers; ++b)
      EXPECT_EQ(0, std::memcmp(multi[t][size_t(b)].data(),
                               single[t][size_t(b)].data(),
                               multi[t][size_t(b)].size() * sizeof(T)))
          << kind.name << suffix << " tensor " << t << " buffer " << b;
  // Something was written.
  EXPECT_NE(multi[2][size_t(kind.firstOutput)],
            std::vector<T>(multi[2][size_t(kind.firstOutput)].size(), T(0)));
}

} // namespace

TEST(KernelMultiTensor, EqualsTheOneTensorKernelOnEachTensor) {
  ASSERT_EQ(kinds().size(), 5u);
  for (const Kind &kind : kinds())
    for (int64_t flag : {0, 1}) {
      SCOPED_TRACE(kind.name + " flag " + std::to_string(flag));
      runKind<float>(kind, flag);
      runKind<double>(kind, flag);
    }
}

TEST(KernelMultiTensor, NoTensorsIsNothing) {
  int64_t ints[] = {0};
  pipec_k_sgd_multi(kctx(), nullptr, ints, nullptr);
  pipec_k_fill_multi(kctx(), nullptr, ints, nullptr);
}
