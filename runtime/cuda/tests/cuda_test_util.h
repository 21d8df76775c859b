//===- cuda_test_util.h - CUDA kernels against the CPU kernels --*- C++ -*-===//
//
// Part of pipec's GPU tests (ctest label `gpu`).
//
//===----------------------------------------------------------------------===//
///
/// \file
/// `expectSameAsCpu` runs one kernel twice on the same inputs: the CPU
/// kernel (pipec_k_NAME, the reference) on host copies and its CUDA twin
/// (pipec_cuda_k_NAME) on device copies, then compares every output buffer.
/// Output buffers start with the same content on both sides (random unless
/// given), so accumulating kernels and "overwritten" contracts are checked
/// alike. Without a GPU the test is skipped with "skipped: no GPU".
///
//===----------------------------------------------------------------------===//

#ifndef PIPEC_RUNTIME_CUDA_TESTS_CUDA_TEST_UTIL_H
#define PIPEC_RUNTIME_CUDA_TESTS_CUDA_TEST_UTIL_H

#include "pipec_rt.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

/// The CUDA twin of a kernel (runtime/cuda/registry.cpp): "gemm",
/// "pipec_k_gemm" or "pipec_cuda_k_gemm"; NULL when there is none.
extern "C" pipec_kernel_fn pipec_cuda_find_kernel(const char *name);

namespace pipec {
namespace cudatest {

/// One entry of a kernel's `bufs`.
struct Arg {
  enum Kind { F32, I64, Null, Alias, BF16 } kind = F32;
  std::vector<float> f;
  std::vector<int64_t> i;
  /// BF16: bfloat16 bit patterns (compared widened, with the tolerance).
  std::vector<uint16_t> h;
  /// Compared after the call (an output of the kernel).
  bool output = false;
  /// Alias: the same pointer as argument `aliasOf`.
  int aliasOf = -1;
  /// Tolerance override for this output (negative: the call's).
  double rtol = -1, atol = -1;
};

/// float32 input / output (outputs are compared).
Arg in(std::vector<float> v);
Arg out(std::vector<float> v);
/// Output of n floats with random initial content (the kernel must
/// overwrite or accumulate into it as documented).
Arg out(size_t n);
Arg inI64(std::vector<int64_t> v);
Arg outI64(size_t n);
Arg null();
/// The pointer of argument k (an in-place output: compared through k).
Arg alias(int k);

/// bfloat16 input (`v` rounded to the nearest bfloat16) / output of n
/// values with random initial content.
Arg inBf16(const std::vector<float> &v);
Arg outBf16(size_t n);
/// `ints` of a `_bf16` kernel: the prefix describing `args` (a BF16 input
/// n, output -n, anything else 0; include/pipec_rt.h) before them.
std::vector<int64_t> bf16Ints(const std::vector<Arg> &args,
                              std::vector<int64_t> ints);

/// n floats uniform in [lo, hi), from a fixed seed per call site.
std::vector<float> randf(size_t n, float lo = -1.f, float hi = 1.f,
                         unsigned seed = 1);

/// True when a CUDA device is present (and the context could be created).
bool haveGpu();

/// The tests' CUDA kernel context (GPU 0; made by haveGpu()) and the CPU
/// kernel context of the reference kernels.
pipec_kctx *gpuContext();
pipec_kctx *cpuContext();

/// Runs pipec_k_<name> and pipec_cuda_k_<name> and compares outputs:
/// |gpu - cpu| <= atol + rtol |cpu| for floats, equality for int64.
void expectSameAsCpu(const std::string &name, std::vector<Arg> args,
                     std::vector<int64_t> ints, std::vector<double> reals = {},
                     double rtol = 1e-5, double atol = 1e-6);

/// `v` with every element rounded to the nearest bfloat16 value (ties to
/// even), kept as float32.
std::vector<float> roundedToBf16(std::vector<float> v);

/// The contexts' matrix products in bfloat16 for one test (what a
/// `--precision bf16` stage sets at start-up), the GPU's and the CPU
/// reference's: the CPU kernels round the operands the same way.
struct Bf16Matmuls {
  Bf16Matmuls();
  ~Bf16Matmuls();
};

} // namespace cudatest
} // namespace pipec

/// First statement of every GPU test.
#define PIPEC_REQUIRE_GPU()                                                    \
  do {                                                                         \
    if (!::pipec::cudatest::haveGpu())                                         \
      GTEST_SKIP() << "skipped: no GPU";                                       \
  } while (0)

#endif
