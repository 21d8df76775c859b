//===- versions.h - Weight versions of the continuous schedules -*- C++ -*-===//
//
// Part of pipec's runtime core.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The parameters a stage's forward reads live at the start of the arena
/// (the first `versioned_bytes` bytes, the "live" version the optimizer
/// updates in place). The continuous schedules read older versions too:
///
///  - PipeDream weight stashing (`1f1b`): a forward reads the live version
///    and its backward, several updates later, the same one. Before an
///    update overwrites the live weights, a copy is taken if an in-flight
///    microbatch still refers to them. A stage s of p holds at most p - s
///    versions (pipedream.md §3; papers/thesis.md §2).
///  - PipeDream-2BW (`2bw`): microbatch k (0-based, batch j = floor(k/m))
///    reads version max(j - 1, 0) in its forward and its backward; the
///    stage keeps the live version and one shadow copy, refreshed before
///    every update (papers/thesis.md §3.1).
///  - PipeDream vertical sync (`1f1b --vertical-sync`): every stage runs
///    minibatch k with the version the input stage used for it,
///    max(k - p + 1, 0), in the forward and the backward; stage s keeps the
///    versions that in-flight and upcoming microbatches still need
///    (papers/thesis.md §2, pipedream.md §4).
///  - `NoStash`: the ablation PipeDream argues against: every forward and
///    backward reads whatever is live (`--no-weight-stashing`).
///
/// Versions are numbered by the updates that produced them (0 = initial).
///
//===----------------------------------------------------------------------===//

#ifndef PIPEC_RUNTIME_CORE_VERSIONS_H
#define PIPEC_RUNTIME_CORE_VERSIONS_H

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

namespace pipec {
namespace rt {

class Device;

class WeightVersions {
public:
  /// Where the copies live: the arena's device (host memory when unset).
  void setDevice(Device *device) { device_ = device; }

  enum class Policy { Live, Stash, TwoBW, NoStash, VerticalSync };

  /// `bytes`: size of the versioned prefix; `microbatches`: m (2BW's batch);
  /// `stages`: p (vertical sync).
  void init(Policy policy, int64_t bytes, int64_t microbatches,
            int64_t stages = 1);

  /// Base pointer for the forward (phase 0) or backward (phase 1) of global
  /// microbatch `mb`, given the live weights at `live`. Throws RtError when
  /// the version is not held (a schedule that breaks the version bound).
  char *acquire(int64_t mb, int phase, char *live);
  /// The backward of `mb` finished.
  void release(int64_t mb);
  /// Before an update of the live weights at `live`.
  void beforeUpdate(const char *live);
  /// Resuming from a checkpoint taken after `updates` updates (nothing in
  /// flight).
  void resumeAt(int64_t updates) { live_ = updates; }
  /// Updates made so far (the live version's number).
  int64_t updates() const { return live_; }
  /// Most versions (live included) held at once so far.
  int64_t peakVersions() const { return peak_; }
  /// Bytes of copies allocated (excluding the live weights in the arena).
  int64_t copyBytes() const { return int64_t(pool_.size()) * bytes_; }

private:
  struct Copy {
    int64_t version = -1;
    int64_t users = 0;
  };
  char *copyOf(int64_t version);
  int64_t heldCopies() const;
  void notePeak();
  /// Vertical sync: the version the next forward will read.
  int64_t nextForwardVersion() const;
  /// Returns to the pool the copies no in-flight or upcoming microbatch
  /// needs.
  void collect();

  Policy policy_ = Policy::Live;
  int64_t bytes_ = 0, m_ = 1, p_ = 1;
  int64_t lastForward_ = -1;
  int64_t live_ = 0;
  int64_t liveUsers_ = 0;                 ///< in-flight microbatches on live
  std::map<int64_t, int64_t> versionOf_;  ///< in-flight mb -> version
  struct PoolDeleter {
    Device *device = nullptr;
    void operator()(char *p) const;
  };
  Device *device_ = nullptr;
  std::vector<std::unique_ptr<char, PoolDeleter>> pool_;
  std::vector<Copy> copies_;              ///< parallel to pool_
  int64_t peak_ = 1;
};

} // namespace rt
} // namespace pipec

#endif // PIPEC_RUNTIME_CORE_VERSIONS_H
