//===- cuda_test_util.cpp - CUDA kernels against the CPU kernels ----------===//
#include "cuda_test_util.h"

#include "cpu/real.h"
#include "cuda_rt.h"
#include "pipec_rt.h"

#include <cmath>
#include <cstring>
#include <dlfcn.h>

namespace pipec {
namespace cudatest {

Arg in(std::vector<float> v) {
  Arg a;
  a.f = std::move(v);
  return a;
}
Arg out(std::vector<float> v) {
  Arg a = in(std::move(v));
  a.output = true;
  return a;
}
Arg out(size_t n) {
  static unsigned seed = 1000;
  return out(randf(n, -1.f, 1.f, seed++));
}
Arg inI64(std::vector<int64_t> v) {
  Arg a;
  a.kind = Arg::I64;
  a.i = std::move(v);
  return a;
}
Arg outI64(size_t n) {
  Arg a = inI64(std::vector<int64_t>(n, 12345));
  a.output = true;
  return a;
}
Arg null() {
  Arg a;
  a.kind = Arg::Null;
  return a;
}
Arg alias(int k) {
  Arg a;
  a.kind = Arg::Alias;
  a.aliasOf = k;
  return a;
}

Arg inBf16(const std::vector<float> &v) {
  Arg a;
  a.kind = Arg::BF16;
  for (float x : v)
    a.h.push_back(cpu::bf16Bits(x));
  return a;
}
Arg outBf16(size_t n) {
  static unsigned seed = 2000;
  Arg a = inBf16(randf(n, -1.f, 1.f, seed++));
  a.output = true;
  return a;
}
std::vector<int64_t> bf16Ints(const std::vector<Arg> &args,
                              std::vector<int64_t> ints) {
  std::vector<int64_t> out{int64_t(args.size())};
  for (const Arg &a : args) {
    const int64_t n = int64_t(a.h.size());
    out.push_back(a.kind != Arg::BF16 ? 0 : a.output ? -n : n);
  }
  out.insert(out.end(), ints.begin(), ints.end());
  return out;
}

std::vector<float> randf(size_t n, float lo, float hi, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float &x : v)
    x = d(gen);
  return v;
}

namespace {
cuda::Context &testContext() {
  static cuda::Context context;
  return context;
}
} // namespace

pipec_kctx *gpuContext() { return &testContext(); }

pipec_kctx *cpuContext() {
  static pipec_kctx *context = pipec_rt_cpu_kernel_context_new(nullptr);
  return context;
}

bool haveGpu() {
  static int state = -1;
  if (state < 0) {
    int n = 0;
    state = cudaGetDeviceCount(&n) == cudaSuccess && n > 0 ? 1 : 0;
    if (state) {
      try {
        cuda::initContext(testContext(), 0, false);
      } catch (const std::exception &e) {
        ADD_FAILURE() << "a GPU is present but the CUDA context failed: "
                      << e.what();
        state = 0;
      }
    }
  }
  return state == 1;
}

static size_t bytesOf(const Arg &a) {
  return a.kind == Arg::F32    ? a.f.size() * 4
         : a.kind == Arg::BF16 ? a.h.size() * 2
                               : a.i.size() * 8;
}
static bool hasData(const Arg &a) {
  return a.kind == Arg::F32 || a.kind == Arg::I64 || a.kind == Arg::BF16;
}
static void *dataOf(Arg &a) {
  return a.kind == Arg::F32    ? static_cast<void *>(a.f.data())
         : a.kind == Arg::BF16 ? static_cast<void *>(a.h.data())
                               : static_cast<void *>(a.i.data());
}

void expectSameAsCpu(const std::string &name, std::vector<Arg> args,
                     std::vector<int64_t> ints, std::vector<double> reals,
                     double rtol, double atol) {
  pipec_kernel_fn cpu = pipec_rt_find_kernel(("pipec_k_" + name).c_str());
  pipec_kernel_fn gpu = pipec_cuda_find_kernel(name.c_str());
  if (!gpu) // defined but not (yet) listed in cuda_kernels.def
    gpu = reinterpret_cast<pipec_kernel_fn>(
        dlsym(RTLD_DEFAULT, ("pipec_cuda_k_" + name).c_str()));
  ASSERT_NE(cpu, nullptr) << "no CPU kernel pipec_k_" << name;
  ASSERT_NE(gpu, nullptr) << "no CUDA kernel pipec_cuda_k_" << name;

  // CPU side: host copies (outputs start with the same content as on GPU).
  std::vector<Arg> host = args;
  std::vector<void *> cpuBufs(args.size(), nullptr),
      gpuBufs(args.size(), nullptr);
  for (size_t k = 0; k < host.size(); ++k) {
    if (hasData(host[k]))
      cpuBufs[k] = dataOf(host[k]);
  }
  for (size_t k = 0; k < host.size(); ++k)
    if (host[k].kind == Arg::Alias)
      cpuBufs[k] = cpuBufs[host[k].aliasOf];

  for (size_t k = 0; k < args.size(); ++k) {
    Arg &a = args[k];
    if (!hasData(a))
      continue;
    size_t n = bytesOf(a);
    ASSERT_EQ(cudaMalloc(&gpuBufs[k], n ? n : 1), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(gpuBufs[k], dataOf(a), n, cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  for (size_t k = 0; k < args.size(); ++k)
    if (args[k].kind == Arg::Alias)
      gpuBufs[k] = gpuBufs[args[k].aliasOf];

  cpu(cpuContext(), cpuBufs.data(), ints.data(), reals.data());
  try {
    gpu(gpuContext(), gpuBufs.data(), ints.data(), reals.data());
    cuda::check(cudaStreamSynchronize(testContext().stream), name.c_str());
  } catch (const std::exception &e) {
    ADD_FAILURE() << name << ": " << e.what();
  }

  for (size_t k = 0; k < args.size(); ++k) {
    const Arg &a = args[k];
    bool compared = a.output;
    for (const Arg &other : args)
      if (other.kind == Arg::Alias && other.aliasOf == int(k))
        compared = true;
    if (!compared || !hasData(a))
      continue;
    size_t n = bytesOf(a);
    std::vector<char> back(n);
    ASSERT_EQ(cudaMemcpy(back.data(), gpuBufs[k], n, cudaMemcpyDeviceToHost),
              cudaSuccess);
    if (a.kind == Arg::I64) {
      const int64_t *g = reinterpret_cast<const int64_t *>(back.data());
      for (size_t e = 0; e < host[k].i.size(); ++e)
        ASSERT_EQ(g[e], host[k].i[e])
            << name << " buffer " << k << " element " << e;
      continue;
    }
    double rt = a.rtol >= 0 ? a.rtol : rtol, at = a.atol >= 0 ? a.atol : atol;
    const bool bf16 = a.kind == Arg::BF16;
    const size_t count = bf16 ? host[k].h.size() : host[k].f.size();
    int bad = 0;
    for (size_t e = 0; e < count; ++e) {
      uint16_t gh = 0;
      float gf = 0;
      std::memcpy(bf16 ? static_cast<void *>(&gh) : static_cast<void *>(&gf),
                  back.data() + e * (bf16 ? 2 : 4), bf16 ? 2 : 4);
      double c = bf16 ? cpu::fromBf16Bits(host[k].h[e]) : host[k].f[e],
             v = bf16 ? cpu::fromBf16Bits(gh) : gf;
      bool same = (std::isnan(c) && std::isnan(v)) || v == c ||
                  std::fabs(v - c) <= at + rt * std::fabs(c);
      if (!same && bad++ < 5)
        ADD_FAILURE() << name << " buffer " << k << " element " << e
                      << ": cuda " << v << ", cpu " << c;
    }
    EXPECT_EQ(bad, 0) << name << " buffer " << k << ": " << bad << " of "
                      << count << " elements differ";
  }
  for (size_t k = 0; k < args.size(); ++k)
    if (hasData(args[k]))
      cudaFree(gpuBufs[k]);
}

std::vector<float> roundedToBf16(std::vector<float> v) {
  for (float &x : v) {
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    bits = (bits + 0x7FFFu + ((bits >> 16) & 1u)) & 0xFFFF0000u;
    std::memcpy(&x, &bits, 4);
  }
  return v;
}

Bf16Matmuls::Bf16Matmuls() {
  testContext().matmulBf16 = true;
  cpuContext()->matmulBf16 = true;
}
Bf16Matmuls::~Bf16Matmuls() {
  testContext().matmulBf16 = false;
  cpuContext()->matmulBf16 = false;
}

} // namespace cudatest
} // namespace pipec
