//===- device.cpp - The CUDA device and pipec_rt_cuda_main ----------------===//
//
// Part of pipec's CUDA runtime.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// A stage compiled with `--target cuda` keeps its whole arena (weights,
/// gradients, optimizer state, stash slots, scratch) in GPU memory, one
/// cudaMalloc at start-up. Kernels run on the context's stream in program
/// order; the core's copies (feeds, the loss, learning rate, messages,
/// checkpoints) are ordered with them on the same stream and wait where the
/// host needs the bytes.
///
/// GPU choice: rank r uses GPU `local_rank mod visible GPUs` (the local rank
/// from MPI's shared-memory split; CUDA_VISIBLE_DEVICES is honoured by the
/// CUDA runtime itself), so several ranks may share one GPU.
///
/// Messages are host-staged MPI (core/comm.cpp): correct for ranks on one
/// GPU, on several GPUs and across hosts; an NCCL communicator is future
/// work (runtime/README.md, "CUDA").
///
//===----------------------------------------------------------------------===//

#include "cuda_rt.h"
#include "device_factory.h"

#include "core/device.h"
#include "core/error.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <dlfcn.h>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <unistd.h>
#include <vector>

namespace pipec {
namespace cuda {
namespace {

/// The stream's clock: a pool of CUDA events, recorded in program order
/// and read once per step. Times come from cudaEventElapsedTime against a
/// reference event recorded on the idle stream right after the step's
/// synchronisation, whose host time is taken as soon as it has run
/// (error: the event's completion latency, microseconds).
class StreamClock final : public rt::QueueClock {
public:
  explicit StreamClock(const Context &c) : c_(c) {}
  ~StreamClock() override {
    for (cudaEvent_t e : events_)
      cudaEventDestroy(e);
    if (ref_)
      cudaEventDestroy(ref_);
  }
  int64_t mark() override {
    if (used_ == events_.size()) {
      cudaEvent_t e = nullptr;
      check(cudaEventCreate(&e), "cudaEventCreate (queue clock)");
      events_.push_back(e);
    }
    check(cudaEventRecord(events_[used_], c_.stream),
          "cudaEventRecord (queue clock)");
    return int64_t(used_++);
  }
  std::vector<double> collect() override {
    cudaStream_t stream = c_.stream;
    check(cudaStreamSynchronize(stream), "queue clock: synchronize");
    if (!ref_)
      check(cudaEventCreate(&ref_), "cudaEventCreate (queue clock)");
    check(cudaEventRecord(ref_, stream), "cudaEventRecord (queue clock)");
    check(cudaEventSynchronize(ref_), "queue clock: reference event");
    const double refHost =
        std::chrono::duration<double>(
            std::chrono::steady_clock::now().time_since_epoch())
            .count();
    std::vector<double> seconds(used_);
    for (size_t i = 0; i < used_; ++i) {
      float ms = 0;
      check(cudaEventElapsedTime(&ms, events_[i], ref_),
            "cudaEventElapsedTime (queue clock)");
      seconds[i] = refHost - double(ms) * 1e-3;
    }
    used_ = 0;
    return seconds;
  }

private:
  const Context &c_;
  std::vector<cudaEvent_t> events_;
  size_t used_ = 0;
  cudaEvent_t ref_ = nullptr;
};

/// A CUDA event on the kernels' stream; waited for from any thread.
class CudaFence final : public rt::DeviceFence {
public:
  CudaFence(int ordinal, cudaStream_t stream)
      : ordinal_(ordinal), stream_(stream) {
    check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming),
          "cudaEventCreate");
  }
  ~CudaFence() override { cudaEventDestroy(event_); }
  void record() override {
    check(cudaEventRecord(event_, stream_), "recording a fence");
  }
  void wait() override {
    // (The calling thread may not have the stage's GPU current yet.)
    check(cudaSetDevice(ordinal_), "cudaSetDevice");
    check(cudaEventSynchronize(event_), "GPU kernels");
  }

private:
  int ordinal_;
  cudaStream_t stream_;
  cudaEvent_t event_ = nullptr;
};

class CudaDevice final : public rt::Device {
public:
  explicit CudaDevice(const rt::DeviceRequest &request) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0)
      throw rt::RtError(
          std::string("this stage was compiled for --target cuda but no "
                      "CUDA GPU is visible (") +
          (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices") +
          "); compile with --target cpu to train on CPUs");
    ordinal_ = request.localRank % count;
    initContext(kernels_, ordinal_, request.allowTf32, request.matmulBf16);
    graphsOn_ = request.cudaGraphs;
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, ordinal_), "cudaGetDeviceProperties");
    name_ = "cuda:" + std::to_string(ordinal_) + " (" + prop.name + ")";
    memoryBytes_ = int64_t(prop.totalGlobalMem);
  }
  ~CudaDevice() override {
    cudaStreamSynchronize(kernels_.stream);
    for (auto &[key, g] : graphs_)
      if (g.exec)
        cudaGraphExecDestroy(g.exec);
    for (UploadSlot &s : uploads_) {
      cudaEventDestroy(s.done);
      cudaFreeHost(s.host);
    }
    for (auto &[host, dev] : constants_)
      cudaFree(dev);
    destroyContext(kernels_);
  }

  std::string name() const override { return name_; }
  int64_t memoryBytes() const override { return memoryBytes_; }
  bool hostAccessible() const override { return false; }
  rt::QueueClock *queueClock() override { return clockOn_ ? &clock_ : nullptr; }
  pipec_kctx *kernelContext() override { return &kernels_; }

  /// Page-locked, so that a message's copies run at the bus's speed;
  /// pageable memory when the system refuses more page-locked memory.
  char *allocateStaging(int64_t bytes) override {
    void *p = nullptr;
    if (cudaHostAlloc(&p, size_t(std::max<int64_t>(bytes, 1)),
                      cudaHostAllocDefault) == cudaSuccess) {
      std::lock_guard<std::mutex> lock(stagingMutex_);
      pinnedStaging_.insert(p);
      return static_cast<char *>(p);
    }
    cudaGetLastError(); // the refusal is not a sticky error
    return rt::Device::allocateStaging(bytes);
  }
  void releaseStaging(char *p) override {
    {
      std::lock_guard<std::mutex> lock(stagingMutex_);
      if (pinnedStaging_.erase(p) == 0) {
        rt::Device::releaseStaging(p);
        return;
      }
    }
    cudaFreeHost(p);
  }

  char *allocate(int64_t bytes, const char *what) override {
    void *p = nullptr;
    size_t size = size_t((bytes > 0 ? bytes : 1) + 63) / 64 * 64;
    cudaError_t e = cudaMalloc(&p, size);
    if (e != cudaSuccess) {
      size_t freeBytes = 0, total = 0;
      cudaMemGetInfo(&freeBytes, &total);
      throw rt::RtError(std::string("cannot allocate ") + what + " of " +
                        std::to_string(bytes) + " bytes on " + name_ + " (" +
                        std::to_string(freeBytes) + " of " +
                        std::to_string(total) +
                        " bytes free): " + cudaGetErrorString(e));
    }
    check(cudaMemsetAsync(p, 0, size, kernels_.stream), "cudaMemset");
    check(cudaStreamSynchronize(kernels_.stream), "cudaMemset");
    return static_cast<char *>(p);
  }
  void release(char *p) override {
    if (p) {
      cudaStreamSynchronize(kernels_.stream);
      cudaFree(p);
    }
  }
  void toDevice(void *dst, const void *src, int64_t bytes) override {
    if (bytes <= 0)
      return;
    if (bytes > kUploadSlotMax) {
      // Large (weights at start-up, a feed's microbatch of more than 64 MiB
      // that the prefetcher did not foresee): straight from pageable
      // memory, waited for so that the caller may free `src` at once;
      // messages in flight move meanwhile (the wait hook).
      check(cudaMemcpyAsync(dst, src, size_t(bytes), cudaMemcpyHostToDevice,
                            kernels_.stream),
            "copy to the GPU");
      waitForStream("copy to the GPU");
      return;
    }
    // Small and frequent (feeds, received messages, lr, rng, step): the
    // bytes go to a pinned slot and the copy is queued behind the kernels
    // without waiting; the slot is reused once its copy has run.
    UploadSlot &slot = uploadSlot(bytes);
    std::memcpy(slot.host, src, size_t(bytes));
    check(cudaMemcpyAsync(dst, slot.host, size_t(bytes), cudaMemcpyHostToDevice,
                          kernels_.stream),
          "copy to the GPU");
    check(cudaEventRecord(slot.done, kernels_.stream), "copy to the GPU");
  }
  /// From page-locked staging: queued without a wait, without a copy into
  /// an upload slot.
  void toDeviceQueued(void *dst, const char *staging, int64_t bytes) override {
    if (bytes > 0)
      check(cudaMemcpyAsync(dst, staging, size_t(bytes), cudaMemcpyHostToDevice,
                            kernels_.stream),
            "copy to the GPU");
  }
  std::unique_ptr<rt::DeviceFence> makeFence() override {
    return std::make_unique<CudaFence>(ordinal_, kernels_.stream);
  }
  void toHost(void *dst, const void *src, int64_t bytes) override {
    if (bytes <= 0)
      return;
    check(cudaMemcpyAsync(dst, src, size_t(bytes), cudaMemcpyDeviceToHost,
                          kernels_.stream),
          "copy from the GPU");
    waitForStream("copy from the GPU");
  }
  void copy(void *dst, const void *src, int64_t bytes) override {
    if (bytes > 0)
      check(cudaMemcpyAsync(dst, src, size_t(bytes), cudaMemcpyDeviceToDevice,
                            kernels_.stream),
            "copy on the GPU");
  }
  void synchronize() override { waitForStream("GPU kernels"); }
  void setWaitHook(std::function<void()> hook) override {
    waitHook_ = std::move(hook);
  }
  /// --cuda-graphs: the first call of a stage function on given buffers
  /// runs as it is (it may grow scratch, upload constants and tables, find
  /// cuDNN algorithms: nothing a capture may do); the second is captured
  /// into a graph, which that call and every later one launches. A call
  /// that cannot be captured (a kernel that waits for the host, say) runs
  /// uncaptured from then on, said once on stderr.
  void runStageFunction(const void *fn, void *arena, int64_t slot, void *wbase,
                        const std::function<void()> &body) override {
    if (!graphsOn_)
      return body();
    Graph &g = graphs_[{fn, arena, slot, wbase}];
    if (g.exec && g.buffersMoved != kernels_.buffersMoved) {
      // A kernel's scratch or table moved since the capture: run this call
      // as a first one again (it may need to upload), capture the next.
      cudaGraphExecDestroy(g.exec);
      g.exec = nullptr;
      g.calls = 0;
    }
    if (g.uncapturable || g.calls++ == 0)
      return body();
    if (!g.exec && !capture(g, body))
      return body();
    check(cudaGraphLaunch(g.exec, kernels_.stream), "cudaGraphLaunch");
    ++graphLaunches_;
  }

  int64_t replayedCalls() const override { return graphLaunches_; }

  const void *constant(const void *host, int64_t bytes) override {
    auto it = constants_.find(host);
    if (it != constants_.end())
      return it->second;
    char *dev = allocate(bytes, "a constant");
    toDevice(dev, host, bytes);
    constants_.emplace(host, dev);
    return dev;
  }

private:
  struct Graph {
    int64_t calls = 0;
    cudaGraphExec_t exec = nullptr;
    bool uncapturable = false;
    /// Context::buffersMoved when captured.
    uint64_t buffersMoved = 0;
  };

  /// Records `body`'s work on the stream into `g.exec`; false (and `g`
  /// marked uncapturable, the stream usable again) when CUDA refuses.
  bool capture(Graph &g, const std::function<void()> &body) {
    cudaStream_t stream = kernels_.stream;
    std::string why;
    cudaGraph_t graph = nullptr;
    const uint64_t moved = kernels_.buffersMoved;
    cudaError_t e =
        cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
    if (e == cudaSuccess) {
      try {
        body();
      } catch (const std::exception &x) {
        why = x.what();
      } catch (...) {
        why = "an exception";
      }
      cudaError_t end = cudaStreamEndCapture(stream, &graph);
      if (why.empty() && end != cudaSuccess)
        why = cudaGetErrorString(end);
      if (why.empty() && kernels_.buffersMoved != moved)
        why = "a kernel's scratch moved while it was captured";
      cudaGraphExec_t exec = nullptr;
      if (why.empty() &&
          (e = cudaGraphInstantiate(&exec, graph, 0)) != cudaSuccess)
        why = cudaGetErrorString(e);
      if (why.empty())
        g.exec = exec;
    } else {
      why = cudaGetErrorString(e);
    }
    if (graph)
      cudaGraphDestroy(graph);
    g.buffersMoved = moved;
    if (!why.empty()) {
      cudaGetLastError(); // clear the capture's error
      g.exec = nullptr;
      g.uncapturable = true;
      if (!warnedCapture_)
        std::fprintf(stderr,
                     "pipec-rt: note: --cuda-graphs: a stage function could "
                     "not be captured (%s); it runs without a graph\n",
                     why.c_str());
      warnedCapture_ = true;
      return false;
    }
    return true;
  }

  /// Waits for every queued kernel and copy. With a wait hook (the
  /// runtime's message progress) it polls the stream and calls the hook
  /// between polls instead of blocking in cudaStreamSynchronize.
  void waitForStream(const char *what) {
    cudaStream_t stream = kernels_.stream;
    if (!waitHook_) {
      check(cudaStreamSynchronize(stream), what);
      return;
    }
    while (true) {
      cudaError_t e = cudaStreamQuery(stream);
      if (e == cudaSuccess)
        return;
      if (e != cudaErrorNotReady)
        check(e, what);
      waitHook_();
    }
  }

  /// Pinned staging for uploads of at most kUploadSlotMax bytes.
  static constexpr int64_t kUploadSlotMax = 64 << 20;
  struct UploadSlot {
    char *host = nullptr;
    int64_t bytes = 0;
    cudaEvent_t done = nullptr;
  };
  /// A free slot of at least `bytes` (its last copy has run), else a new
  /// one; the pool grows only while uploads are in flight.
  UploadSlot &uploadSlot(int64_t bytes) {
    for (UploadSlot &s : uploads_)
      if (s.bytes >= bytes && cudaEventQuery(s.done) == cudaSuccess)
        return s;
    UploadSlot s;
    s.bytes = std::max<int64_t>(bytes, 4096);
    check(cudaMallocHost(reinterpret_cast<void **>(&s.host), size_t(s.bytes)),
          "pinned staging memory");
    check(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming),
          "cudaEventCreate");
    uploads_.push_back(s);
    return uploads_.back();
  }

  /// The kernels' context: stream, cuBLAS handle, arithmetic, scratch.
  Context kernels_;
  int ordinal_ = 0;
  std::string name_;
  int64_t memoryBytes_ = 0;
  std::mutex stagingMutex_;
  std::set<void *> pinnedStaging_;
  StreamClock clock_{kernels_};
  /// PIPEC_QUEUE_CLOCK=0: synchronise around each op and span instead (the
  /// old way; for comparing the two).
  const bool clockOn_ = !std::getenv("PIPEC_QUEUE_CLOCK") ||
                        std::string(std::getenv("PIPEC_QUEUE_CLOCK")) != "0";
  std::map<const void *, char *> constants_;
  std::deque<UploadSlot> uploads_;
  std::function<void()> waitHook_;
  /// --cuda-graphs: one graph per (stage function, arena, slot, weights).
  bool graphsOn_ = false, warnedCapture_ = false;
  std::map<std::tuple<const void *, void *, int64_t, void *>, Graph> graphs_;
  int64_t graphLaunches_ = 0;
};

} // namespace

std::unique_ptr<rt::Device> makeCudaDevice(const rt::DeviceRequest &request) {
  return std::make_unique<CudaDevice>(request);
}

} // namespace cuda
} // namespace pipec

namespace {

/// --check-kernels: the stage executes itself again with the checker
/// (libpipec_rt_cuda_check.so, beside this library) first in LD_PRELOAD, so
/// that its calls of pipec_cuda_k_* reach the checker's twins. Returns
/// only when there is nothing to do; a failure is one line on stderr and
/// exit 2 (nothing has started: MPI is not initialised yet).
void preloadKernelChecker(char **argv) {
  bool wanted = false;
  for (char **a = argv && *argv ? argv + 1 : argv; a && *a; ++a)
    if (std::strcmp(*a, "--check-kernels") == 0)
      wanted = true;
  if (!wanted)
    return;
  if (std::getenv("PIPEC_CHECK_KERNELS_LOADED")) {
    // Executed again: the checker must be in (ld.so only warns when a
    // preload fails).
    if (!dlsym(RTLD_DEFAULT, "pipec_rt_check_report")) {
      std::fprintf(stderr,
                   "pipec-rt: error: --check-kernels: "
                   "libpipec_rt_cuda_check.so did not load "
                   "(LD_PRELOAD=%s)\n",
                   std::getenv("LD_PRELOAD") ? std::getenv("LD_PRELOAD") : "");
      std::exit(2);
    }
    return;
  }
  Dl_info info{};
  std::string lib;
  if (dladdr(reinterpret_cast<void *>(&pipec_rt_cuda_main), &info) &&
      info.dli_fname) {
    lib = info.dli_fname;
    lib =
        lib.substr(0, lib.find_last_of('/') + 1) + "libpipec_rt_cuda_check.so";
  }
  if (lib.find_first_of(" :") != std::string::npos) {
    std::fprintf(stderr,
                 "pipec-rt: error: --check-kernels: %s has a space or a "
                 "colon in its path, which LD_PRELOAD cannot hold\n",
                 lib.c_str());
    std::exit(2);
  }
  if (lib.empty() || access(lib.c_str(), R_OK) != 0) {
    std::fprintf(stderr,
                 "pipec-rt: error: --check-kernels needs %s beside "
                 "libpipec_rt_cuda.so (it is built with the CUDA runtime)\n",
                 lib.empty() ? "libpipec_rt_cuda_check.so" : lib.c_str());
    std::exit(2);
  }
  const char *old = std::getenv("LD_PRELOAD");
  std::string preload = lib + (old && *old ? std::string(":") + old : "");
  setenv("LD_PRELOAD", preload.c_str(), 1);
  setenv("PIPEC_CHECK_KERNELS_LOADED", "1", 1);
  execv("/proc/self/exe", argv);
  std::fprintf(stderr,
               "pipec-rt: error: --check-kernels: cannot execute %s "
               "again: %s\n",
               argv[0], std::strerror(errno));
  std::exit(2);
}

} // namespace

extern "C" int pipec_rt_cuda_main(int argc, char **argv,
                                  const char *stage_meta_json,
                                  pipec_program_fn program) {
  preloadKernelChecker(argv);
  return pipec::rt::runStage(argc, argv, stage_meta_json, program,
                             pipec::cuda::makeCudaDevice,
                             pipec::cuda::makeCudaCommunicator, "cuda");
}
