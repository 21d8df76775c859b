//===- feed_prefetch.h - Feeds filled ahead, off the host's path -*- C++
//-*-===//
//
// Part of pipec's runtime core.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// On a device the host cannot read (a GPU), a feed's microbatch used to be
/// written into a host buffer when the program asked for it, copied once
/// more into the device's page-locked upload memory and then to the device.
/// For ResNet-50 at batch 64 that is 38.5 MB written twice while the GPU
/// waits at the start of every step (16.7 of 112 ms on an H200,
/// 2026-11-27). The prefetcher instead fills the microbatch the program
/// will ask for next into page-locked memory of its own
/// (Device::allocateStaging) on a thread of its own, while the device runs
/// the work queued before; when the program asks, the copy to the device is
/// only queued (Device::toDeviceQueued).
///
/// Which microbatch comes next: a schedule's program is the same every
/// step, so each feed's order of microbatches in its first step (0, 1,
/// ..., or 0, 2, ... for a replica) is its order in every step. A request
/// that was not foreseen (the first one, a continuous pipeline's draining
/// window) is filled when asked and uploaded as without the prefetcher
/// (HostView, the device's upload memory); the bytes are the same whichever
/// way they were filled (Feed::fill is a function of the step and the
/// microbatch).
///
/// Each feed has two buffers: one whose copy to the device may still be
/// queued, one being filled. A buffer is refilled only once the device has
/// run its last copy (a DeviceFence recorded after the copy). An error of
/// the filling thread (a fence that failed, say) is raised on the runtime's
/// thread when the buffer is asked for.
///
//===----------------------------------------------------------------------===//

#ifndef PIPEC_RUNTIME_CORE_FEED_PREFETCH_H
#define PIPEC_RUNTIME_CORE_FEED_PREFETCH_H

#include "core/device.h"
#include "core/feed.h"

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace pipec {
namespace rt {

/// Writes microbatch `mb` of step `step` of `feed` to the device range
/// `dst` when the program asks: filled into a host copy (HostView, `reuse`
/// grown as needed and not zeroed: every byte is written), then copied.
/// The path without the prefetcher, and the prefetcher's for a request it
/// did not foresee.
void fillWhenAsked(Device &device, const Feed &feed, int64_t step, int64_t mb,
                   void *dst, std::vector<char> &reuse);

class FeedPrefetcher {
public:
  /// `feeds` must outlive the prefetcher and not change; `microbatches`
  /// per step.
  FeedPrefetcher(Device &device, const std::vector<Feed> &feeds,
                 int64_t microbatches);
  ~FeedPrefetcher();
  FeedPrefetcher(const FeedPrefetcher &) = delete;
  FeedPrefetcher &operator=(const FeedPrefetcher &) = delete;

  /// Queues the copy of microbatch `mb` of step `step` of feed `feed` to
  /// the device range `dst` (spec().bytes bytes), and starts filling the
  /// microbatch expected next.
  void feed(size_t feed, int64_t step, int64_t mb, void *dst);

  /// Called over and over while a request waits for its microbatch to be
  /// filled (the runtime lets messages move meanwhile, as while it waits
  /// for the device).
  void setWaitHook(std::function<void()> hook) { waitHook_ = std::move(hook); }

  /// Returns once no microbatch is being filled ahead (the tests: the time
  /// a device takes between two requests).
  void settle();

  /// Takes no more work and waits up to `timeout` for the filling thread
  /// to be idle; true if it is (the fatal-error path: ErrorLocation's
  /// stopThreads, set while the prefetcher lives).
  bool stop(std::chrono::milliseconds timeout);

  /// Requests served from a buffer filled ahead / filled on the spot.
  int64_t prefetched() const { return hits_; }
  int64_t filledOnTheSpot() const { return misses_; }

private:
  struct Key {
    int64_t step = -1, mb = -1;
    bool operator==(const Key &o) const { return step == o.step && mb == o.mb; }
  };
  enum class State { Free, Filling, Ready };
  struct Buffer {
    char *host = nullptr;
    std::unique_ptr<DeviceFence> copied; ///< after its last copy
    bool copyQueued = false;
    State state = State::Free;
    Key key;
    std::exception_ptr error;
  };
  struct PerFeed {
    Buffer buffers[2];
    /// The microbatches of the first step this feed saw, in order.
    int64_t firstStep = -1;
    std::vector<int64_t> order;
    bool orderComplete = false;
    size_t position = 0; ///< index in `order` of the last request
  };
  struct Job {
    size_t feed;
    int buffer;
    Key key;
  };

  void worker();
  /// The buffer of `f` that holds or is filling `key`, else -1.
  static int find(const PerFeed &f, Key key);
  /// Notes `key` in the first step's order; the request expected after it.
  bool learnAndPredict(PerFeed &f, Key key, Key &next);

  Device &device_;
  const std::vector<Feed> &feeds_;
  int64_t microbatches_;
  std::vector<PerFeed> state_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<Job> jobs_;
  std::function<void()> waitHook_;
  /// The host copy of an unforeseen request (HostView's `reuse`).
  std::vector<char> unforeseen_;
  bool stop_ = false;
  bool busy_ = false; ///< the filling thread is running a job
  int64_t hits_ = 0, misses_ = 0;
  std::thread thread_;
};

} // namespace rt
} // namespace pipec

#endif // PIPEC_RUNTIME_CORE_FEED_PREFETCH_H
