//===- core_hostview_test.cpp - Host copies of device memory -------------===//
//
// Part of pipec's runtime tests. HostView on a device the host cannot read
// (a stand-in whose "device memory" is host memory it only copies): a
// fresh view starts zeroed; a view lent a buffer fills that buffer, grows
// it when needed and keeps it from call to call, as the data feeds use it.
//
//===----------------------------------------------------------------------===//

#include "core/device.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

using namespace pipec::rt;

namespace {

/// A device whose memory the host must copy to and from.
class CopyingDevice final : public Device {
public:
  std::string name() const override { return "copying"; }
  int64_t memoryBytes() const override { return 1 << 20; }
  bool hostAccessible() const override { return false; }
  char *allocate(int64_t bytes, const char *) override {
    return new char[size_t(bytes)]();
  }
  void release(char *p) override { delete[] p; }
  void toDevice(void *dst, const void *src, int64_t bytes) override {
    ++uploads;
    std::memcpy(dst, src, size_t(bytes));
  }
  void toHost(void *dst, const void *src, int64_t bytes) override {
    std::memcpy(dst, src, size_t(bytes));
  }
  void copy(void *dst, const void *src, int64_t bytes) override {
    std::memcpy(dst, src, size_t(bytes));
  }
  void synchronize() override {}
  const void *constant(const void *host, int64_t) override { return host; }
  pipec_kctx *kernelContext() override { return nullptr; }
  int uploads = 0;
};

} // namespace

TEST(CoreHostView, ALentBufferIsReusedAndPushed) {
  CopyingDevice device;
  std::vector<char> memory(64, 7);
  {
    HostView fresh(device, memory.data(), 16);
    EXPECT_NE(fresh.get(), memory.data());
    for (int i = 0; i < 16; ++i)
      EXPECT_EQ(fresh.get()[i], 0) << i; // zeroed
    EXPECT_EQ(fresh.pull()[3], 7);       // the device's bytes
  }
  std::vector<char> reuse;
  const char *first = nullptr;
  for (int round = 0; round < 3; ++round) {
    HostView view(device, memory.data(), 32, &reuse);
    if (round == 0)
      first = view.get();
    EXPECT_EQ(view.get(), reuse.data());
    EXPECT_EQ(view.get(), first) << "the lent buffer is kept, round " << round;
    std::memset(view.get(), 'a' + round, 32);
    view.push();
    EXPECT_EQ(memory[31], 'a' + round);
    EXPECT_EQ(memory[32], 7); // nothing past the range
  }
  EXPECT_EQ(device.uploads, 3);
  // A larger range grows the buffer.
  HostView larger(device, memory.data(), 48, &reuse);
  EXPECT_GE(reuse.size(), 48u);
  std::memset(larger.get(), 'z', 48);
  larger.push();
  EXPECT_EQ(memory[47], 'z');
}
