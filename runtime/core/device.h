//===- device.h - Where a stage's arena lives -------------------*- C++ -*-===//
//
// Part of pipec's runtime core.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The runtime core (schedule services, weight versions, feeds, checkpoints,
/// communication) never touches the arena's bytes itself: it asks the
/// stage's `Device`, which owns the arena and moves bytes between it and
/// host memory. The CPU device (device_cpu.cpp) is plain host memory and
/// memcpy; the CUDA device (runtime/cuda/device.cpp) keeps the arena in GPU
/// memory and orders every copy with the kernels on its stream.
///
/// Which device a stage executable has is decided when it is linked: the
/// generated `main` calls `pipec_rt_main` (CPU) or `pipec_rt_cuda_main`
/// (libpipec_rt_cuda), each of which passes its factory to `runStage`.
///
/// Ordering contract: kernels and the device's copies run in program order.
/// `toHost` returns once the bytes are on the host (after every kernel
/// queued before it); `toDevice` returns once `src` may be reused.
///
//===----------------------------------------------------------------------===//

#ifndef PIPEC_RUNTIME_CORE_DEVICE_H
#define PIPEC_RUNTIME_CORE_DEVICE_H

#include "core/communicator.h"
#include "pipec_rt.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace pipec {
namespace rt {

/// Times of work queued on an asynchronous device, taken without waiting
/// for it: the profiler and the timeline mark where an op or a span starts
/// and ends in the device's queue, and read the marks' times once per step,
/// after the step's synchronisation. A device that runs its work while the
/// host waits (the CPU) has none; there, host clock readings are the times.
class QueueClock {
public:
  virtual ~QueueClock() = default;
  /// Records the current end of the queue; returns the mark's index (0, 1,
  /// ... since the last collect()).
  virtual int64_t mark() = 0;
  /// Waits for the queue; returns every mark's time in seconds on
  /// std::chrono::steady_clock (since its epoch), in mark order, and starts
  /// the next marks at index 0.
  virtual std::vector<double> collect() = 0;
};

/// A point in a device's queue that any thread may wait for: recorded by
/// the runtime's thread after some work, waited for by another (the feed
/// prefetcher, before it overwrites memory a queued copy reads).
class DeviceFence {
public:
  virtual ~DeviceFence() = default;
  /// Marks the current end of the device's queue.
  virtual void record() = 0;
  /// Returns once the work queued before the last record() has run.
  virtual void wait() = 0;
};

class Device {
public:
  virtual ~Device() = default;
  /// For messages: "cpu", "cuda:0 (NVIDIA H200)".
  virtual std::string name() const = 0;
  /// The memory the device has in all (the host's physical memory for the
  /// CPU device; a topology's device_memory_bytes).
  virtual int64_t memoryBytes() const = 0;
  /// Arena pointers may be dereferenced by host code.
  virtual bool hostAccessible() const = 0;
  /// `bytes` zeroed bytes, 64-byte aligned; throws RtError naming the size.
  virtual char *allocate(int64_t bytes, const char *what) = 0;
  virtual void release(char *p) = 0;
  virtual void toDevice(void *dst, const void *src, int64_t bytes) = 0;
  virtual void toHost(void *dst, const void *src, int64_t bytes) = 0;
  /// Host memory that toHost and toDevice move fastest (page-locked on a
  /// GPU): the communicator's message staging. Plain host memory by
  /// default; `bytes` >= 1.
  virtual char *allocateStaging(int64_t bytes);
  virtual void releaseStaging(char *p);
  /// Queues a copy of `bytes` from `staging` (from allocateStaging) to
  /// `dst`, ordered with the kernels, and may return before it has run:
  /// the caller keeps `staging` unchanged until a fence recorded after this
  /// call is reached. By default toDevice (a copy made before returning).
  virtual void toDeviceQueued(void *dst, const char *staging, int64_t bytes) {
    toDevice(dst, staging, bytes);
  }
  /// A fence of this device's queue; the default is reached as soon as it
  /// is recorded (a device whose work runs before its calls return).
  virtual std::unique_ptr<DeviceFence> makeFence();
  /// Device-to-device, ordered with the kernels.
  virtual void copy(void *dst, const void *src, int64_t bytes) = 0;
  /// Waits for every queued kernel and copy.
  virtual void synchronize() = 0;
  /// The device copy of a constant of the generated code (host memory that
  /// lives as long as the process), made on first use.
  virtual const void *constant(const void *host, int64_t bytes) = 0;
  /// The device's queue clock, or null where the host's clock times the
  /// device's work (synchronize() then waits for it).
  virtual QueueClock *queueClock() { return nullptr; }
  /// `hook` is called over and over while the host waits for the device's
  /// queue (toHost, synchronize): the runtime lets pending messages move
  /// meanwhile (Communicator::progress). A device whose work runs on the
  /// host thread never waits and ignores it.
  virtual void setWaitHook(std::function<void()> hook) { (void)hook; }
  /// The context this device's kernels run in (include/pipec_rt.h,
  /// pipec_kctx), owned by the device and the same for its whole life.
  virtual pipec_kctx *kernelContext() = 0;
  /// Runs `body`, one call of the stage function `fn` on (arena, slot,
  /// wbase) (pipec_rt_run). A device may record the work `body` queues the
  /// first times and replay the recording later (CUDA graphs); the default
  /// runs it.
  virtual void runStageFunction(const void *fn, void *arena, int64_t slot,
                                void *wbase,
                                const std::function<void()> &body) {
    (void)fn, (void)arena, (void)slot, (void)wbase;
    body();
  }
  /// Stage-function calls replayed from a recording so far (the rank
  /// summary's replayed_stage_calls).
  virtual int64_t replayedCalls() const { return 0; }
};

/// Device memory with an owner: released through its device.
struct DeviceBuffer {
  Device *device = nullptr;
  char *data = nullptr;
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer &) = delete;
  DeviceBuffer &operator=(const DeviceBuffer &) = delete;
  ~DeviceBuffer() {
    if (device && data)
      device->release(data);
  }
  void allocate(Device &d, int64_t bytes, const char *what) {
    device = &d;
    data = d.allocate(bytes, what);
  }
  char *get() const { return data; }
};

/// What a factory gets to choose its device.
struct DeviceRequest {
  /// The rank's index among the ranks on its host (OpenMPI's local rank).
  int localRank = 0;
  bool allowTf32 = false;
  /// The stage's matrix products round their operands to bfloat16
  /// (StageDesc::matmulPrecision "bf16"): the kernel context's
  /// matmulBf16.
  bool matmulBf16 = false;
  /// Replay each stage function's queued work as a CUDA graph
  /// (pipec_rt_run; --cuda-graphs, not while profiling ops).
  bool cudaGraphs = false;
};

using DeviceFactory = std::unique_ptr<Device> (*)(const DeviceRequest &);

/// The host-memory device of the CPU runtime.
std::unique_ptr<Device> makeCpuDevice(const DeviceRequest &);

/// pipec_rt_main's body with the device chosen by `factory` and the
/// communicator made by `commFactory` (communicator.h); `target` is the
/// stage description's "target" this runtime serves ("cpu", "cuda").
int runStage(int argc, char **argv, const char *meta, pipec_program_fn program,
             DeviceFactory factory, CommunicatorFactory commFactory,
             const char *target);

/// Host bytes standing for the device range [data, data + bytes) while host
/// code reads or writes it: the range itself on a host-accessible device,
/// else a host copy, filled by `pull` and written back by `push`. The copy
/// is zeroed, fresh memory, unless the caller lends a buffer to reuse
/// (`reuse`, grown as needed and not zeroed: for ranges the caller writes
/// whole, every step, such as a data feed's microbatch, where a fresh
/// buffer of tens of MiB cost its zeroing and page faults each time).
class HostView {
public:
  HostView(Device &device, void *data, int64_t bytes,
           std::vector<char> *reuse = nullptr)
      : device_(device), data_(static_cast<char *>(data)), bytes_(bytes) {
    if (device.hostAccessible())
      return;
    const size_t size = size_t(bytes > 0 ? bytes : 1);
    if (reuse) {
      if (reuse->size() < size)
        reuse->resize(size);
      copy_ = reuse->data();
      return;
    }
    owned_.assign(size, 0);
    copy_ = owned_.data();
  }
  char *get() { return copy_ ? copy_ : data_; }
  /// The device's current bytes.
  char *pull() {
    if (copy_)
      device_.toHost(copy_, data_, bytes_);
    return get();
  }
  /// The host bytes to the device.
  void push() {
    if (copy_)
      device_.toDevice(data_, copy_, bytes_);
  }

private:
  Device &device_;
  char *data_;
  int64_t bytes_;
  char *copy_ = nullptr;
  std::vector<char> owned_;
};

} // namespace rt
} // namespace pipec

#endif // PIPEC_RUNTIME_CORE_DEVICE_H
