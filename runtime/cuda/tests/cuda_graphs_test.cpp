//===- cuda_graphs_test.cpp - Stage functions replayed as CUDA graphs -----===//
//
// Part of pipec's GPU tests (ctest label `gpu`). The CUDA device with
// --cuda-graphs (DeviceRequest::cudaGraphs): the first call of a stage
// function runs as it is, the second is captured and launched, later ones
// replay the graph; a replay reads what the host wrote to device memory
// since (the learning rate), and a call on other buffers gets its own
// graph. A body that cannot be captured (it waits for the host) runs
// without a graph.
//
//===----------------------------------------------------------------------===//

#include "cuda_test_util.h"

#include "cuda_rt.h"
#include "device_factory.h"

#include <cuda_runtime.h>

#include <vector>

using namespace pipec;

TEST(CudaGraphs, ReplaysAStageFunctionWithWhatTheHostWroteSince) {
  PIPEC_REQUIRE_GPU();
  rt::DeviceRequest request;
  request.cudaGraphs = true;
  std::unique_ptr<rt::Device> device = cuda::makeCudaDevice(request);
  const int64_t n = 1000;
  char *w = device->allocate(n * 4, "w"), *g = device->allocate(n * 4, "g"),
       *lr = device->allocate(4, "lr");
  std::vector<float> ones(n, 1.0f);
  device->toDevice(w, ones.data(), n * 4);
  device->toDevice(g, ones.data(), n * 4);
  pipec_kernel_fn sgd = pipec_cuda_find_kernel("sgd");
  ASSERT_NE(sgd, nullptr);
  int64_t ints[] = {n};
  void *bufs[] = {w, g, lr, w};
  auto body = [&] { sgd(device->kernelContext(), bufs, ints, nullptr); };
  const int key = 0; // stands for the stage function
  float expected = 1.0f;
  for (int call = 0; call < 4; ++call) {
    const float rate = 0.125f * float(call + 1);
    device->toDevice(lr, &rate, 4);
    device->runStageFunction(&key, w, 0, nullptr, body);
    expected -= rate;
  }
  std::vector<float> back(n);
  device->toHost(back.data(), w, n * 4);
  for (float v : back)
    ASSERT_EQ(v, expected);
  const float lastRate = 0.5f;
  EXPECT_EQ(device->replayedCalls(), 3); // calls 2 (captured), 3, 4
  // Another slot: its own first call runs as it is.
  device->runStageFunction(&key, w, 1, nullptr, body);
  EXPECT_EQ(device->replayedCalls(), 3);
  // The kernels' scratch moves (another function needed more): the graph
  // of slot 0 is dropped, its next call runs as a first one, the one after
  // is captured again.
  auto &ctx = *static_cast<cuda::Context *>(device->kernelContext());
  cuda::scratch(ctx, size_t(256) << 20);
  device->runStageFunction(&key, w, 0, nullptr, body);
  EXPECT_EQ(device->replayedCalls(), 3);
  device->runStageFunction(&key, w, 0, nullptr, body);
  EXPECT_EQ(device->replayedCalls(), 4);
  expected -= 3 * lastRate; // slot 1's call and these two
  device->toHost(back.data(), w, n * 4);
  for (float v : back)
    ASSERT_EQ(v, expected);
  // A body that waits for the host cannot be captured: it runs without.
  int waited = 0;
  auto waits = [&] {
    body();
    device->synchronize();
    ++waited;
  };
  for (int call = 0; call < 3; ++call)
    device->runStageFunction(&waited, w, 0, nullptr, waits);
  // (The capture attempt stopped at the wait, before counting, and ran
  // the body again without a graph.)
  EXPECT_EQ(waited, 3);
  EXPECT_EQ(device->replayedCalls(), 4); // none of these three replayed
  device->release(w);
  device->release(g);
  device->release(lr);
}
