//===- cuda_multi_tensor_test.cpp - pipec_cuda_k_*_multi ------------------===//
//
// Part of pipec's GPU tests (ctest label `gpu`). Every multi-tensor kernel
// of include/pipec_multi_tensor.def, in one launch over tensors of 1000,
// 300007 (several chunks), 5 and 0 elements, equals the one-tensor CUDA
// kernel on each tensor bit for bit, and the CPU's multi-tensor kernel
// within the one-tensor tests' tolerance; a second call reuses the
// uploaded table.
//
//===----------------------------------------------------------------------===//

#include "cuda_test_util.h"

#include "cuda_rt.h"

#include <cmath>
#include <cstring>
#include <random>
#include <string>

using namespace pipec::cudatest;

namespace {

struct Kind {
  std::string name;
  int buffers, ints, firstOutput;
  unsigned shared;
};

std::vector<double> realsOf(const std::string &name) {
  if (name == "fill")
    return {0.25};
  if (name == "momentum")
    return {0.9, 0.8, 0.01};
  if (name == "adam")
    return {0.9, 0.999, 0.01, 0.001, 1e-8};
  if (name == "adagrad")
    return {0.01, 1e-6, 0.01};
  return {};
}

/// Device copies of every tensor buffer, the shared scalars, the kernels'
/// buffer pointers (multi layout) and ints.
struct Tensors {
  std::vector<void *> owned, bufs;
  std::vector<int64_t> ints;
  std::vector<std::vector<float>> host; // per tensor buffer, in bufs order
  ~Tensors() {
    for (void *p : owned)
      cudaFree(p);
  }
};

void upload(const Kind &kind, const std::vector<int64_t> &lengths, Tensors &t) {
  std::mt19937 rng(5);
  float rate = 0.05f;
  int64_t count = 3;
  void *ratePtr = nullptr, *countPtr = nullptr;
  ASSERT_EQ(cudaMalloc(&ratePtr, sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&countPtr, sizeof(int64_t)), cudaSuccess);
  cudaMemcpy(ratePtr, &rate, sizeof rate, cudaMemcpyHostToDevice);
  cudaMemcpy(countPtr, &count, sizeof count, cudaMemcpyHostToDevice);
  t.owned = {ratePtr, countPtr};
  t.ints = {int64_t(lengths.size())};
  for (int64_t n : lengths) {
    for (int b = 0; b < kind.buffers; ++b) {
      if ((kind.shared >> b) & 1u) {
        t.bufs.push_back(b == 1 ? countPtr : ratePtr);
        continue;
      }
      std::vector<float> v(static_cast<size_t>(n));
      for (float &x : v)
        x = std::uniform_real_distribution<float>(0, 1)(rng);
      void *p = nullptr;
      ASSERT_EQ(cudaMalloc(&p, v.size() * 4 + 4), cudaSuccess);
      cudaMemcpy(p, v.data(), v.size() * 4, cudaMemcpyHostToDevice);
      t.owned.push_back(p);
      t.bufs.push_back(p);
      t.host.push_back(std::move(v));
    }
    t.ints.push_back(n);
    if (kind.ints == 2)
      t.ints.push_back(1); // momentum: Nesterov
  }
  // (The kernels run on the test context's non-blocking stream, which the
  // copies above do not order.)
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

std::vector<std::vector<float>> download(const Kind &kind, const Tensors &t) {
  std::vector<std::vector<float>> out;
  size_t h = 0;
  for (size_t k = 0; k < t.bufs.size(); ++k) {
    if ((kind.shared >> (k % size_t(kind.buffers))) & 1u)
      continue;
    std::vector<float> v(t.host[h++].size());
    cudaMemcpy(v.data(), t.bufs[k], v.size() * 4, cudaMemcpyDeviceToHost);
    out.push_back(std::move(v));
  }
  return out;
}

} // namespace

TEST(CudaMultiTensor, OneLaunchEqualsOneTensorKernels) {
  PIPEC_REQUIRE_GPU();
  const std::vector<Kind> kinds = {
#define PIPEC_MULTI_TENSOR(name, bufs, ints, firstOutput, shared)              \
  {#name, bufs, ints, firstOutput, shared},
#include "pipec_multi_tensor.def"
  };
  const std::vector<int64_t> lengths = {1000, 300007, 5, 0};
  for (const Kind &kind : kinds) {
    SCOPED_TRACE(kind.name);
    const std::vector<double> reals = realsOf(kind.name);
    pipec_kernel_fn multiGpu =
        pipec_cuda_find_kernel((kind.name + "_multi").c_str());
    pipec_kernel_fn oneGpu = pipec_cuda_find_kernel(kind.name.c_str());
    pipec_kernel_fn multiCpu =
        pipec_rt_find_kernel(("pipec_k_" + kind.name + "_multi").c_str());
    ASSERT_NE(multiGpu, nullptr);
    ASSERT_NE(oneGpu, nullptr);
    ASSERT_NE(multiCpu, nullptr);
    Tensors multi, single;
    upload(kind, lengths, multi);
    upload(kind, lengths, single);
    // Twice: the second call finds its table uploaded.
    for (int call = 0; call < 2; ++call) {
      multiGpu(gpuContext(), multi.bufs.data(), multi.ints.data(),
               reals.data());
      const int intsPer = kind.ints;
      for (size_t t = 0; t < lengths.size(); ++t)
        oneGpu(gpuContext(), single.bufs.data() + t * size_t(kind.buffers),
               single.ints.data() + 1 + t * size_t(intsPer), reals.data());
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<std::vector<float>> a = download(kind, multi),
                                    b = download(kind, single);
    ASSERT_EQ(a.size(), b.size());
    for (size_t k = 0; k < a.size(); ++k)
      EXPECT_EQ(0, std::memcmp(a[k].data(), b[k].data(), a[k].size() * 4))
          << "buffer " << k;
    // Against the CPU's multi-tensor kernel, from the same inputs (one
    // call).
    Tensors once;
    upload(kind, lengths, once);
    multiGpu(gpuContext(), once.bufs.data(), once.ints.data(), reals.data());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<std::vector<float>> gpu = download(kind, once);
    std::vector<std::vector<float>> cpu = once.host;
    float rate = 0.05f;
    int64_t count = 3;
    std::vector<void *> cpuBufs;
    size_t h = 0;
    for (size_t k = 0; k < once.bufs.size(); ++k) {
      const int b = int(k % size_t(kind.buffers));
      if ((kind.shared >> b) & 1u)
        cpuBufs.push_back(b == 1 ? static_cast<void *>(&count)
                                 : static_cast<void *>(&rate));
      else
        cpuBufs.push_back(cpu[h++].data());
    }
    multiCpu(cpuContext(), cpuBufs.data(), once.ints.data(), reals.data());
    for (size_t k = 0; k < gpu.size(); ++k)
      for (size_t i = 0; i < gpu[k].size(); ++i)
        ASSERT_NEAR(gpu[k][i], cpu[k][i], 1e-6 + 1e-5 * std::fabs(cpu[k][i]))
            << "buffer " << k << " element " << i;
  }
}

TEST(CudaMultiTensor, RefusesBuffersThatShouldBeShared) {
  PIPEC_REQUIRE_GPU();
  Tensors t;
  const Kind sgd = {"sgd", 4, 1, 3, 0x4};
  upload(sgd, {10, 10}, t);
  void *otherRate = nullptr;
  ASSERT_EQ(cudaMalloc(&otherRate, 4), cudaSuccess);
  t.owned.push_back(otherRate);
  t.bufs[4 + 2] = otherRate; // the second tensor's rate differs
  EXPECT_THROW(pipec_cuda_find_kernel("sgd_multi")(gpuContext(), t.bufs.data(),
                                                   t.ints.data(), nullptr),
               std::exception);
}
