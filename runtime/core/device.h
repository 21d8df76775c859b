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

#include "pipec_rt.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace pipec {
namespace rt {

class Device {
public:
  virtual ~Device() = default;
  /// For messages: "cpu", "cuda:0 (NVIDIA H200)".
  virtual std::string name() const = 0;
  /// Arena pointers may be dereferenced by host code.
  virtual bool hostAccessible() const = 0;
  /// `bytes` zeroed bytes, 64-byte aligned; throws RtError naming the size.
  virtual char *allocate(int64_t bytes, const char *what) = 0;
  virtual void release(char *p) = 0;
  virtual void toDevice(void *dst, const void *src, int64_t bytes) = 0;
  virtual void toHost(void *dst, const void *src, int64_t bytes) = 0;
  /// Device-to-device, ordered with the kernels.
  virtual void copy(void *dst, const void *src, int64_t bytes) = 0;
  /// Waits for every queued kernel and copy.
  virtual void synchronize() = 0;
  /// The device copy of a constant of the generated code (host memory that
  /// lives as long as the process), made on first use.
  virtual const void *constant(const void *host, int64_t bytes) = 0;
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
  int rank = 0;
  bool allowTf32 = false;
};

using DeviceFactory = std::unique_ptr<Device> (*)(const DeviceRequest &);

/// The host-memory device of the CPU runtime.
std::unique_ptr<Device> makeCpuDevice(const DeviceRequest &);

/// pipec_rt_main's body with the device chosen by `factory`; `target` is
/// the stage description's "target" this runtime serves ("cpu", "cuda").
int runStage(int argc, char **argv, const char *meta, pipec_program_fn program,
             DeviceFactory factory, const char *target);

/// Bytes at `dst` (arena) written by `fill` on the host: directly when the
/// device is host accessible, else through a staging buffer.
template <typename Fill>
void writeArena(Device &device, void *dst, int64_t bytes, Fill &&fill) {
  if (device.hostAccessible()) {
    fill(dst);
    return;
  }
  std::vector<char> staging(size_t(bytes > 0 ? bytes : 1));
  fill(static_cast<void *>(staging.data()));
  device.toDevice(dst, staging.data(), bytes);
}

/// Host-visible bytes of the arena range [src, src + bytes): `src` itself on
/// a host-accessible device, else a copy in `staging`.
const void *readArena(Device &device, const void *src, int64_t bytes,
                      std::vector<char> &staging);

} // namespace rt
} // namespace pipec

#endif // PIPEC_RUNTIME_CORE_DEVICE_H
