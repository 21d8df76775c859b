//===- versions.cpp - Weight versions of the continuous schedules ---------===//
//
// Part of pipec's runtime core. See versions.h.
//
//===----------------------------------------------------------------------===//

#include "core/versions.h"
#include "core/device.h"
#include "core/error.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace pipec {
namespace rt {

void WeightVersions::init(Policy policy, int64_t bytes, int64_t microbatches,
                          int64_t stages) {
  policy_ = policy;
  bytes_ = std::max<int64_t>(bytes, 0);
  m_ = std::max<int64_t>(microbatches, 1);
  p_ = std::max<int64_t>(stages, 1);
  lastForward_ = -1;
  live_ = 0;
  peak_ = 1;
  versionOf_.clear();
  pool_.clear();
  copies_.clear();
}

char *WeightVersions::copyOf(int64_t version) {
  for (size_t i = 0; i < copies_.size(); ++i)
    if (copies_[i].version == version)
      return pool_[i].get();
  return nullptr;
}

int64_t WeightVersions::heldCopies() const {
  int64_t n = 0;
  for (const Copy &c : copies_)
    n += c.version >= 0;
  return n;
}

void WeightVersions::notePeak() { peak_ = std::max(peak_, 1 + heldCopies()); }

int64_t WeightVersions::nextForwardVersion() const {
  return std::max<int64_t>(lastForward_ + 1 - (p_ - 1), 0);
}

void WeightVersions::collect() {
  for (Copy &c : copies_) {
    if (c.version < 0)
      continue;
    bool needed = policy_ == Policy::VerticalSync &&
                  c.version >= nextForwardVersion();
    for (const auto &[mb, v] : versionOf_)
      needed |= v == c.version;
    if (!needed)
      c.version = -1;
  }
}

char *WeightVersions::acquire(int64_t mb, int phase, char *live) {
  if (bytes_ == 0)
    return live; // a stage without parameters has nothing to version
  switch (policy_) {
  case Policy::Live:
  case Policy::NoStash:
    return live;
  case Policy::Stash: {
    if (phase == 0) {
      versionOf_[mb] = live_;
      return live;
    }
    auto it = versionOf_.find(mb);
    if (it == versionOf_.end())
      throw RtError("weight stashing: the backward of microbatch " +
                    std::to_string(mb) + " runs without its forward");
    if (it->second == live_)
      return live;
    if (char *p = copyOf(it->second))
      return p;
    throw RtError("weight stashing: version " + std::to_string(it->second) +
                  " of microbatch " + std::to_string(mb) + " was not kept");
  }
  case Policy::VerticalSync: {
    if (phase == 0) {
      lastForward_ = std::max(lastForward_, mb);
      versionOf_[mb] = std::max<int64_t>(mb - (p_ - 1), 0);
    }
    auto it = versionOf_.find(mb);
    if (it == versionOf_.end())
      throw RtError("vertical sync: the backward of microbatch " +
                    std::to_string(mb) + " runs without its forward");
    char *p = it->second == live_ ? live : copyOf(it->second);
    if (!p)
      throw RtError("vertical sync: microbatch " + std::to_string(mb) +
                    " needs weight version " + std::to_string(it->second) +
                    ", which this stage did not keep (live version " +
                    std::to_string(live_) + ")");
    if (phase == 0)
      collect();
    return p;
  }
  case Policy::TwoBW: {
    int64_t want = std::max<int64_t>(mb / m_ - 1, 0);
    if (want == live_)
      return live;
    if (char *p = copyOf(want))
      return p;
    throw RtError("2BW: microbatch " + std::to_string(mb) +
                  " needs weight version " + std::to_string(want) +
                  " but this stage holds version " + std::to_string(live_) +
                  (copies_.empty() || copies_[0].version < 0
                       ? std::string()
                       : " and " + std::to_string(copies_[0].version)) +
                  " (2BW keeps two; the batch needs m >= p - 1)");
  }
  }
  return live;
}

void WeightVersions::release(int64_t mb) {
  if (policy_ == Policy::VerticalSync) {
    versionOf_.erase(mb);
    collect();
    return;
  }
  if (policy_ != Policy::Stash)
    return;
  auto it = versionOf_.find(mb);
  if (it == versionOf_.end())
    return;
  int64_t version = it->second;
  versionOf_.erase(it);
  if (version == live_)
    return;
  for (const auto &[other, v] : versionOf_)
    if (v == version)
      return;
  for (Copy &c : copies_)
    if (c.version == version)
      c.version = -1; // the buffer goes back to the pool
}

void WeightVersions::PoolDeleter::operator()(char *p) const {
  if (device)
    device->release(p);
  else
    delete[] p;
}

void WeightVersions::beforeUpdate(const char *live) {
  bool keep = false;
  if (policy_ == Policy::TwoBW) {
    // The next batch's microbatches read the version about to be replaced.
    keep = true;
    if (!copies_.empty())
      copies_[0].version = -1; // the shadow's old version is dead
  } else if (policy_ == Policy::Stash || policy_ == Policy::VerticalSync) {
    for (const auto &[mb, v] : versionOf_)
      keep |= v == live_;
    // Vertical sync: an upcoming forward may still read this version.
    keep |= policy_ == Policy::VerticalSync && live_ >= nextForwardVersion();
  }
  if (keep && bytes_ > 0) {
    size_t slot = copies_.size();
    for (size_t i = 0; i < copies_.size(); ++i)
      if (copies_[i].version < 0) {
        slot = i;
        break;
      }
    if (slot == copies_.size()) {
      char *p = device_ ? device_->allocate(bytes_, "a weight version")
                        : new char[size_t(bytes_)];
      pool_.emplace_back(p, PoolDeleter{device_});
      copies_.push_back({});
    }
    if (device_)
      device_->copy(pool_[slot].get(), live, bytes_);
    else
      std::memcpy(pool_[slot].get(), live, size_t(bytes_));
    copies_[slot].version = live_;
  }
  ++live_;
  notePeak();
}

} // namespace rt
} // namespace pipec
