//===- shadow_check.cpp - Every CUDA kernel call checked against the CPU --===//
//
// Part of pipec's CUDA runtime tools: libpipec_rt_cuda_check.so.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Preloaded into a `--target cuda` stage executable (`pipec train
/// --check-kernels`, or LD_PRELOAD by hand), this library stands in for
/// every pipec_cuda_k_* of cuda_kernels.def and checks each call in place:
///
///  1. it finds the device allocations the call's buffers lie in (the
///     stage's arena, the uploaded constants; cuMemGetAddressRange) and
///     copies each whole allocation to the host;
///  2. it runs the real CUDA kernel and copies the allocations back again;
///  3. it runs the CPU kernel (pipec_k_*) on the host copies, with every
///     buffer pointer moved into them;
///  4. it compares the two results word by word over the whole allocations,
///     so a kernel that writes outside its outputs is caught as well as one
///     that computes them wrong, and reports the first mismatches relative
///     to the call's buffers;
///  5. it writes the CPU's result back to the device, so every call is
///     checked on the CPU's inputs and differences do not snowball.
///
/// A 4-byte word matches when its bits are equal, when both are NaNs of
/// arithmetic (not int64 bits), or when both are finite floats of at
/// least 2^-119 (1.5e-36) in magnitude (or zero) within PIPEC_CHECK_RTOL
/// (default 1e-4) relative or PIPEC_CHECK_ATOL (1e-5) absolute: an int64 index
/// that differs shows as tiny floats, which must be equal. Only the driver API
/// is used (loaded with dlopen), so the library works beside the runtime's
/// statically linked CUDA runtime. Every call is serialised (context
/// synchronisation before and after): a debugging tool, slow by design.
///
/// Lines start with "pipec-check:"; at exit one summary line says how many
/// calls were checked and how many parted from the CPU, per kernel.
///
//===----------------------------------------------------------------------===//

#include "pipec_rt.h"
#include "shadow_compare.h"

#include <cuda.h>
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {

using KernelFn = void (*)(pipec_kctx *, void *const *, const int64_t *,
                          const double *);

/// The CPU kernels' context, made once by the runtime's own
/// pipec_rt_cpu_kernel_context_new with the arithmetic of the first CUDA
/// context checked (null when the runtime has no such function).
pipec_kctx *cpuContext(const pipec_kctx *like) {
  using MakeFn = pipec_kctx *(*)(const pipec_kctx *);
  static pipec_kctx *cpu = [like] {
    auto make = reinterpret_cast<MakeFn>(
        dlsym(RTLD_DEFAULT, "pipec_rt_cpu_kernel_context_new"));
    return make ? make(like) : nullptr;
  }();
  return cpu;
}

struct Driver {
  CUresult (*getRange)(CUdeviceptr *, size_t *, CUdeviceptr) = nullptr;
  CUresult (*toHost)(void *, CUdeviceptr, size_t) = nullptr;
  CUresult (*toDevice)(CUdeviceptr, const void *, size_t) = nullptr;
  CUresult (*sync)() = nullptr;
  bool ok = false;

  Driver() {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!lib)
      return;
    getRange = reinterpret_cast<decltype(getRange)>(
        dlsym(lib, "cuMemGetAddressRange_v2"));
    toHost = reinterpret_cast<decltype(toHost)>(dlsym(lib, "cuMemcpyDtoH_v2"));
    toDevice =
        reinterpret_cast<decltype(toDevice)>(dlsym(lib, "cuMemcpyHtoD_v2"));
    sync = reinterpret_cast<decltype(sync)>(dlsym(lib, "cuCtxSynchronize"));
    ok = getRange && toHost && toDevice && sync;
  }
};

Driver &driver() {
  static Driver d;
  return d;
}

double envDouble(const char *name, double fallback) {
  const char *v = std::getenv(name);
  return v && *v ? std::atof(v) : fallback;
}

struct Stats {
  int64_t calls = 0, mismatched = 0, skipped = 0;
};

struct Checker {
  std::mutex mu;
  std::map<std::string, Stats> stats;
  int64_t callIndex = 0;
  double rtol = envDouble("PIPEC_CHECK_RTOL", 1e-4);
  double atol = envDouble("PIPEC_CHECK_ATOL", 1e-5);
  int maxReports = int(envDouble("PIPEC_CHECK_REPORTS", 20));
  /// Whether the CPU's result replaces the GPU's after each call (1, the
  /// default: each call is checked on identical inputs), or the GPU run
  /// goes on with its own values (0: differences can build up, which shows
  /// where a run parts from the CPU over many calls).
  bool resync = envDouble("PIPEC_CHECK_RESYNC", 1) != 0;
  /// One line for every call (words written, relative error), not only
  /// for the calls that part.
  bool verbose = envDouble("PIPEC_CHECK_VERBOSE", 0) != 0;
  int reports = 0;

  bool reported = false;

  ~Checker() { report(); }

  /// The summary line (once): at the end of the rank's job
  /// (pipec_rt_check_report), else at exit.
  void report() {
    if (reported || callIndex == 0)
      return;
    reported = true;
    int64_t calls = 0, bad = 0, skipped = 0;
    std::string parted;
    for (auto &[name, s] : stats) {
      calls += s.calls;
      bad += s.mismatched;
      skipped += s.skipped;
      if (s.mismatched)
        parted += (parted.empty() ? "" : ", ") + name + " " +
                  std::to_string(s.mismatched) + "/" + std::to_string(s.calls);
    }
    std::fprintf(stderr,
                 "pipec-check: rank %s: %lld kernel calls checked against the "
                 "CPU, %lld parted%s%s%s, %lld not checked\n",
                 rankName(), (long long)calls, (long long)bad,
                 parted.empty() ? "" : " (", parted.c_str(),
                 parted.empty() ? "" : ")", (long long)skipped);
    std::fflush(stderr);
  }

  static const char *rankName() {
    for (const char *v : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"})
      if (const char *r = std::getenv(v))
        return r;
    return "0";
  }
};

Checker &checker() {
  static Checker c;
  return c;
}

thread_local bool tInside = false;

struct Allocation {
  CUdeviceptr base = 0;
  size_t size = 0;
  /// Before the call; the CPU's result (computed in place); the GPU's.
  std::vector<char> orig, before, gpu;
};

/// Where byte `at` of allocation `a` lies relative to the call's buffers:
/// "buf K + OFFSET" for the nearest buffer at or below it.
std::string locate(const Allocation &a, size_t at, void *const *bufs,
                   int nbufs) {
  int best = -1;
  size_t bestOff = 0;
  for (int k = 0; k < nbufs; ++k) {
    auto p = CUdeviceptr(bufs[k]);
    if (!p || p < a.base || p >= a.base + a.size)
      continue;
    size_t pos = size_t(p - a.base);
    if (pos <= at && (best < 0 || at - pos < bestOff)) {
      best = k;
      bestOff = at - pos;
    }
  }
  char text[96];
  if (best < 0)
    std::snprintf(text, sizeof text, "allocation byte %zu (below every buffer)",
                  at);
  else
    std::snprintf(text, sizeof text, "buf %d + %zu bytes", best, bestOff);
  return text;
}

void check(const char *name, KernelFn gpuFn, KernelFn cpuFn, int nbufs,
           pipec_kctx *kc, void *const *bufs, const int64_t *ints,
           const double *reals) {
  Driver &drv = driver();
  Checker &ck = checker();
  std::lock_guard<std::mutex> lock(ck.mu);
  Stats &st = ck.stats[name];
  const int64_t call = ck.callIndex++;
  if (call == 0)
    std::fprintf(stderr,
                 "pipec-check: rank %s: every CUDA kernel call is run on the "
                 "CPU too and compared (rtol %g, atol %g%s)\n",
                 Checker::rankName(), ck.rtol, ck.atol,
                 ck.resync ? "" : ", no resync");
  // The allocations of the device buffers (deduplicated).
  std::vector<Allocation> allocs;
  std::vector<int> allocOf(size_t(nbufs), -1);
  pipec_kctx *cpuKc = cpuContext(kc);
  bool checkable = drv.ok && cpuFn && cpuKc;
  if (checkable)
    drv.sync();
  for (int k = 0; checkable && k < nbufs; ++k) {
    if (!bufs[k])
      continue;
    CUdeviceptr base = 0;
    size_t size = 0;
    if (drv.getRange(&base, &size, CUdeviceptr(bufs[k])) != CUDA_SUCCESS) {
      checkable = false; // not device memory
      break;
    }
    for (size_t i = 0; i < allocs.size(); ++i)
      if (allocs[i].base == base)
        allocOf[size_t(k)] = int(i);
    if (allocOf[size_t(k)] < 0) {
      allocOf[size_t(k)] = int(allocs.size());
      allocs.push_back({base, size, {}, {}, {}});
    }
  }
  if (!checkable) {
    ++st.skipped;
    gpuFn(kc, bufs, ints, reals);
    return;
  }
  auto fetch = [&](std::vector<char> &to, const Allocation &a) {
    to.resize(a.size);
    if (drv.toHost(to.data(), a.base, a.size) != CUDA_SUCCESS) {
      std::fprintf(stderr,
                   "pipec-check: cannot copy an allocation of %zu "
                   "bytes from the GPU\n",
                   a.size);
      std::abort();
    }
  };
  for (Allocation &a : allocs) {
    fetch(a.before, a);
    a.orig = a.before;
  }
  gpuFn(kc, bufs, ints, reals);
  drv.sync();
  for (Allocation &a : allocs)
    fetch(a.gpu, a);
  // The CPU kernel on the "before" copies.
  std::vector<void *> hostBufs(size_t(nbufs), nullptr);
  for (int k = 0; k < nbufs; ++k)
    if (bufs[k]) {
      Allocation &a = allocs[size_t(allocOf[size_t(k)])];
      hostBufs[size_t(k)] = a.before.data() + (CUdeviceptr(bufs[k]) - a.base);
    }
  cpuFn(cpuKc, hostBufs.data(), ints, reals);
  ++st.calls;
  int64_t bad = 0, written = 0;
  double diff2 = 0, norm2 = 0, worstAbs = 0;
  for (Allocation &a : allocs) {
    const size_t words = a.size / 4;
    const auto *c = reinterpret_cast<const uint32_t *>(a.before.data());
    const auto *g = reinterpret_cast<const uint32_t *>(a.gpu.data());
    const auto *o = reinterpret_cast<const uint32_t *>(a.orig.data());
    int shown = 0;
    for (size_t w = 0; w < words; ++w) {
      if (c[w] == o[w] && g[w] == o[w])
        continue; // not written by either
      ++written;
      float fc, fg;
      std::memcpy(&fc, &c[w], 4);
      std::memcpy(&fg, &g[w], 4);
      if (std::isfinite(fc) && std::isfinite(fg)) {
        diff2 += (double(fc) - double(fg)) * (double(fc) - double(fg));
        norm2 += double(fc) * double(fc);
      }
      if (pipec::cuda::wordsMatch(c[w], g[w], ck.rtol, ck.atol))
        continue;
      ++bad;
      worstAbs = std::max(worstAbs, std::fabs(double(fc) - double(fg)));
      if (shown < 2 && ck.reports < ck.maxReports) {
        std::fprintf(stderr,
                     "pipec-check: call %lld %s: %s: CPU %.9g (0x%08x) GPU "
                     "%.9g (0x%08x)\n",
                     (long long)call, name,
                     locate(a, w * 4, bufs, nbufs).c_str(), double(fc), c[w],
                     double(fg), g[w]);
        ++shown;
      }
    }
    if (ck.resync && // go on from the CPU's result
        drv.toDevice(a.base, a.before.data(), a.size) != CUDA_SUCCESS) {
      std::fprintf(stderr, "pipec-check: cannot write the CPU's result back\n");
      std::abort();
    }
  }
  // The copies from pageable memory may still run; the runtime's stream
  // does not wait for them.
  drv.sync();
  const double relNorm =
      norm2 > 0 ? std::sqrt(diff2 / norm2) : std::sqrt(diff2);
  if ((bad || ck.verbose) && ck.reports < ck.maxReports) {
    std::fprintf(stderr,
                 "pipec-check: call %lld %s: %lld words written, %lld parted "
                 "(largest difference %.3g), relative error in norm %.3g\n",
                 (long long)call, name, (long long)written, (long long)bad,
                 worstAbs, relNorm);
    ++ck.reports;
  }
  if (bad)
    ++st.mismatched;
}

} // namespace

/// Called by the runtime core when the rank leaves the job (core/main.cpp,
/// leaveJob), while mpirun still forwards the rank's output.
extern "C" void pipec_rt_check_report() {
  Checker &ck = checker();
  std::lock_guard<std::mutex> lock(ck.mu);
  ck.report();
}

namespace {
/// One call of the kernel `name` (its CUDA and CPU entry points), checked
/// unless it is made from inside a check (a kernel calling another).
void shadowCall(const char *name, KernelFn gpu, KernelFn cpu, int nbufs,
                pipec_kctx *kc, void *const *bufs, const int64_t *ints,
                const double *reals) {
  if (!gpu) {
    std::fprintf(stderr, "pipec-check: no pipec_cuda_k_%s to check\n", name);
    std::abort();
  }
  if (tInside) {
    gpu(kc, bufs, ints, reals);
    return;
  }
  tInside = true;
  check(name, gpu, cpu, nbufs, kc, bufs, ints, reals);
  tInside = false;
}
} // namespace

/// The CUDA entry point of `name` after this library's, and its CPU twin.
#define PIPEC_SHADOWED(name)                                                   \
  static KernelFn gpu =                                                        \
      reinterpret_cast<KernelFn>(dlsym(RTLD_NEXT, "pipec_cuda_k_" name));      \
  static KernelFn cpu =                                                        \
      reinterpret_cast<KernelFn>(dlsym(RTLD_DEFAULT, "pipec_k_" name));

#define PIPEC_CUDA_KERNEL(sym, nbufs)                                          \
  extern "C" void pipec_cuda_k_##sym(pipec_kctx *kc, void *const *bufs,        \
                                     const int64_t *ints,                      \
                                     const double *reals) {                    \
    PIPEC_SHADOWED(#sym)                                                       \
    shadowCall(#sym, gpu, cpu, nbufs, kc, bufs, ints, reals);                  \
  }
#include "cuda_kernels.def"
// The multi-tensor kernels: K tensors' buffers (ints[0] = K).
#define PIPEC_MULTI_TENSOR(name, nbufs, nints, firstOutput, shared)            \
  extern "C" void pipec_cuda_k_##name##_multi(                                 \
      pipec_kctx *kc, void *const *bufs, const int64_t *ints,                  \
      const double *reals) {                                                   \
    PIPEC_SHADOWED(#name "_multi")                                             \
    shadowCall(#name "_multi", gpu, cpu, int(ints[0] * (nbufs)), kc, bufs,     \
               ints, reals);                                                   \
  }
#include "pipec_multi_tensor.def"
