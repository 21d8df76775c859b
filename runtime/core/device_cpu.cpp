//===- device_cpu.cpp - The host-memory device ----------------------------===//
//
// Part of pipec's runtime core. See device.h.
//
//===----------------------------------------------------------------------===//

#include "core/device.h"
#include "core/error.h"
#include "cpu/kernel_context.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

namespace pipec {
namespace rt {

namespace {

class CpuDevice final : public Device {
public:
  explicit CpuDevice(const DeviceRequest &request) {
    kernels_.matmulBf16 = request.matmulBf16;
  }
  std::string name() const override { return "cpu"; }
  int64_t memoryBytes() const override {
    return int64_t(sysconf(_SC_PHYS_PAGES)) * int64_t(sysconf(_SC_PAGESIZE));
  }
  bool hostAccessible() const override { return true; }
  char *allocate(int64_t bytes, const char *what) override {
    size_t size = size_t((std::max<int64_t>(bytes, 1) + 63) / 64 * 64);
    char *p = static_cast<char *>(std::aligned_alloc(64, size));
    if (!p)
      throw RtError(std::string("cannot allocate ") + what + " of " +
                    std::to_string(bytes) + " bytes");
    std::memset(p, 0, size);
    return p;
  }
  void release(char *p) override { std::free(p); }
  void toDevice(void *dst, const void *src, int64_t bytes) override {
    if (bytes > 0)
      std::memcpy(dst, src, size_t(bytes));
  }
  void toHost(void *dst, const void *src, int64_t bytes) override {
    if (bytes > 0)
      std::memcpy(dst, src, size_t(bytes));
  }
  void copy(void *dst, const void *src, int64_t bytes) override {
    if (bytes > 0)
      std::memmove(dst, src, size_t(bytes));
  }
  void synchronize() override {}
  const void *constant(const void *host, int64_t) override { return host; }
  pipec_kctx *kernelContext() override { return &kernels_; }

private:
  cpu::KernelContext kernels_;
};

} // namespace

char *Device::allocateStaging(int64_t bytes) {
  size_t size = size_t((std::max<int64_t>(bytes, 1) + 63) / 64 * 64);
  char *p = static_cast<char *>(std::aligned_alloc(64, size));
  if (!p)
    throw RtError("cannot allocate a message staging buffer of " +
                  std::to_string(bytes) + " bytes");
  return p;
}

void Device::releaseStaging(char *p) { std::free(p); }

namespace {
/// The fence of a device whose work has run when its calls return.
class ReachedFence final : public DeviceFence {
public:
  void record() override {}
  void wait() override {}
};
} // namespace

std::unique_ptr<DeviceFence> Device::makeFence() {
  return std::make_unique<ReachedFence>();
}

std::unique_ptr<Device> makeCpuDevice(const DeviceRequest &request) {
  return std::make_unique<CpuDevice>(request);
}

} // namespace rt
} // namespace pipec
