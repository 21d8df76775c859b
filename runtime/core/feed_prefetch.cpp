//===- feed_prefetch.cpp - Feeds filled ahead, off the host's path --------===//
//
// Part of pipec's runtime core. See feed_prefetch.h.
//
//===----------------------------------------------------------------------===//

#include "core/feed_prefetch.h"

#include "core/error.h"

#include <algorithm>

namespace pipec {
namespace rt {

void fillWhenAsked(Device &device, const Feed &feed, int64_t step, int64_t mb,
                   void *dst, std::vector<char> &reuse) {
  HostView view(device, dst, feed.spec().bytes, &reuse);
  feed.fill(step, mb, view.get());
  view.push();
}

FeedPrefetcher::FeedPrefetcher(Device &device, const std::vector<Feed> &feeds,
                               int64_t microbatches)
    : device_(device), feeds_(feeds), microbatches_(microbatches),
      state_(feeds.size()) {
  for (size_t i = 0; i < feeds.size(); ++i)
    for (Buffer &b : state_[i].buffers) {
      b.host =
          device.allocateStaging(std::max<int64_t>(feeds[i].spec().bytes, 1));
      b.copied = device.makeFence();
    }
  thread_ = std::thread([this] { worker(); });
  errorLocation().stopThreads = [this] {
    return stop(std::chrono::milliseconds(2000));
  };
}

bool FeedPrefetcher::stop(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  stop_ = true;
  changed_.notify_all();
  return changed_.wait_for(lock, timeout, [&] { return !busy_; });
}

FeedPrefetcher::~FeedPrefetcher() {
  errorLocation().stopThreads = nullptr;
  stop(std::chrono::milliseconds(0)); // (the join below waits)
  thread_.join();
  // (A failed fence must not keep the memory from being returned: the
  // run's result is already out.)
  for (PerFeed &f : state_)
    for (Buffer &b : f.buffers) {
      try {
        if (b.copyQueued)
          b.copied->wait();
      } catch (...) {
      }
      device_.releaseStaging(b.host);
    }
}

int FeedPrefetcher::find(const PerFeed &f, Key key) {
  for (int i = 0; i < 2; ++i)
    if (f.buffers[i].state != State::Free && f.buffers[i].key == key)
      return i;
  return -1;
}

bool FeedPrefetcher::learnAndPredict(PerFeed &f, Key key, Key &next) {
  if (f.firstStep < 0)
    f.firstStep = key.step;
  if (!f.orderComplete && key.step != f.firstStep)
    f.orderComplete = true;
  if (!f.orderComplete) {
    f.order.push_back(key.mb);
    f.position = f.order.size() - 1;
    // Still learning: the next microbatch of this step, a guess.
    next = key.mb + 1 < microbatches_ ? Key{key.step, key.mb + 1}
                                      : Key{key.step + 1, 0};
    return true;
  }
  // The order repeats: the request after the last one's position, else
  // wherever this microbatch stands in it.
  size_t at =
      f.position + 1 < f.order.size() && f.order[f.position + 1] == key.mb
          ? f.position + 1
          : size_t(std::find(f.order.begin(), f.order.end(), key.mb) -
                   f.order.begin());
  if (at >= f.order.size())
    return false;
  f.position = at;
  next = at + 1 < f.order.size() ? Key{key.step, f.order[at + 1]}
                                 : Key{key.step + 1, f.order.front()};
  return true;
}

void FeedPrefetcher::feed(size_t feedIndex, int64_t step, int64_t mb,
                          void *dst) {
  const Feed &source = feeds_[feedIndex];
  const int64_t bytes = source.spec().bytes;
  PerFeed &f = state_[feedIndex];
  const Key key{step, mb};
  std::unique_lock<std::mutex> lock(mutex_);
  const int use = find(f, key);
  if (use >= 0) {
    // Foreseen: wait for its filling (letting messages move meanwhile),
    // then only queue the copy.
    while (f.buffers[use].state != State::Ready) {
      if (waitHook_) {
        lock.unlock();
        waitHook_();
        lock.lock();
      }
      changed_.wait_for(lock, std::chrono::microseconds(200),
                        [&] { return f.buffers[use].state == State::Ready; });
    }
    ++hits_;
    Buffer &b = f.buffers[use];
    b.state = State::Free;
    b.key = Key{};
    if (b.error) {
      std::exception_ptr e = b.error;
      b.error = nullptr;
      std::rethrow_exception(e);
    }
    device_.toDeviceQueued(dst, b.host, bytes);
    b.copied->record();
    b.copyQueued = true;
  } else {
    // Not foreseen: filled here and uploaded as without the prefetcher
    // (the device's own upload memory: no wait for the device).
    ++misses_;
    lock.unlock();
    fillWhenAsked(device_, source, step, mb, dst, unforeseen_);
    lock.lock();
  }

  Key next;
  if (!learnAndPredict(f, key, next) || find(f, next) >= 0)
    return;
  // The buffer for the guess: one not being filled, best one whose last
  // copy was not just queued (the filling thread waits for that copy).
  int target = -1;
  for (int i = 0; i < 2; ++i)
    if (f.buffers[i].state != State::Filling &&
        (target < 0 ||
         (f.buffers[target].copyQueued && !f.buffers[i].copyQueued)))
      target = i;
  if (target < 0)
    return; // (both filling guesses: rare, and only a lost chance)
  Buffer &b = f.buffers[target];
  b.state = State::Filling;
  b.key = next;
  jobs_.push_back(Job{feedIndex, target, next});
  lock.unlock();
  changed_.notify_all();
}

void FeedPrefetcher::settle() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] {
    for (const PerFeed &f : state_)
      for (const Buffer &b : f.buffers)
        if (b.state == State::Filling)
          return false;
    return true;
  });
}

void FeedPrefetcher::worker() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    changed_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
    if (stop_)
      return;
    Job job = jobs_.front();
    jobs_.erase(jobs_.begin());
    Buffer &b = state_[job.feed].buffers[job.buffer];
    const bool waitFirst = b.copyQueued;
    busy_ = true;
    lock.unlock();
    std::exception_ptr error;
    try {
      if (waitFirst)
        b.copied->wait(); // its last copy has run: it may be overwritten
      feeds_[job.feed].fill(job.key.step, job.key.mb, b.host);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    busy_ = false;
    b.copyQueued = false;
    b.error = error;
    b.state = State::Ready;
    changed_.notify_all();
  }
}

} // namespace rt
} // namespace pipec
