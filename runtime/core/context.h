//===- context.h - The state behind the opaque pipec_ctx --------*- C++ -*-===//
//
// Part of pipec's runtime core.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// `pipec_ctx` is the opaque handle that generated code passes back to every
/// program service. One exists per process, owned by pipec_rt_main.
///
//===----------------------------------------------------------------------===//

#ifndef PIPEC_RUNTIME_CORE_CONTEXT_H
#define PIPEC_RUNTIME_CORE_CONTEXT_H

#include "core/communicator.h"
#include "core/device.h"
#include "core/feed.h"
#include "core/feed_prefetch.h"
#include "core/options.h"
#include "core/profiler.h"
#include "core/stage.h"
#include "core/timeline.h"
#include "core/versions.h"

#include <map>
#include <memory>
#include <tuple>
#include <vector>

struct pipec_ctx {
  /// How this rank talks to the others (communicator.h); declared first so
  /// that it outlives the groups and transfers below.
  std::unique_ptr<pipec::rt::Communicator> comm;
  /// Owns the arena's memory; declared first so that it outlives the weight
  /// versions and staging buffers below.
  std::unique_ptr<pipec::rt::Device> device;
  /// A device stage's microbatch losses, copied there by pipec_rt_loss and
  /// read once per step (no wait per microbatch); empty on the CPU.
  pipec::rt::DeviceBuffer lossBuffer;
  pipec::rt::StageDesc desc;
  pipec::rt::Options options;
  pipec::rt::Manifest manifest;

  int rank = 0;
  int worldSize = 1;
  /// MPI ranks of every stage's replicas (index: stage number, replica).
  std::vector<std::vector<int>> stageRanks;
  /// The replicas of this rank's stage (null when it has one).
  std::unique_ptr<pipec::rt::CommGroup> stageGroup;
  /// Per tie group (desc.tieGroups): every rank of the group's stages, or
  /// null where this rank's stage is not in it.
  std::vector<std::unique_ptr<pipec::rt::CommGroup>> tieGroups;
  /// The lowest rank of the stage whose description has "loss": true; it
  /// writes the metrics.
  int lossRank = 0;

  /// Current step, 0-based. The continuous schedules' draining window runs
  /// with step == steps.
  int64_t step = 0;
  /// Steps of this run (the end of a continuous pipeline).
  int64_t steps = 0;
  /// 1f1b / 2bw: the program is one window of a pipeline that never
  /// flushes (desc.policy.flush is false).
  bool continuous = false;
  /// Weight versions of the continuous schedules; counts updates for all.
  pipec::rt::WeightVersions versions;
  /// The arena (live weights at its start).
  char *arena = nullptr;

  /// Data sources, one per entry of desc.feeds.
  std::vector<pipec::rt::Feed> feeds;
  /// On a device the host cannot read, the feeds' microbatches are filled
  /// ahead into page-locked memory (feed_prefetch.h); declared after
  /// `feeds` and `device`, which it uses until it is destroyed. Null on the
  /// CPU (the feeds write the arena) and with PIPEC_FEED_PREFETCH=0.
  std::unique_ptr<pipec::rt::FeedPrefetcher> feedPrefetch;
  /// The host copy a feed fills without the prefetcher on a device the
  /// host cannot read, reused from microbatch to microbatch (HostView's
  /// `reuse`).
  std::vector<char> feedStaging;

  /// Microbatch losses of the current step (loss stage only).
  std::vector<double> losses; ///< float32 losses widened exactly
  std::vector<bool> lossRecorded;

  /// Outstanding sends (each owns what it sends).
  std::vector<std::unique_ptr<pipec::rt::Transfer>> pendingSends;
  /// Messages in flight are progressed between ops and while waiting for
  /// the device (progressMessages, Communicator::progress);
  /// PIPEC_MESSAGE_PROGRESS=0 turns it off.
  bool messageProgress = true;

  /// Receives posted ahead (pipec_rt_recv_post), by (peer, channel, mb),
  /// with their size.
  struct PostedRecv {
    std::unique_ptr<pipec::rt::PostedReceive> receive;
    int64_t bytes = 0;
  };
  std::map<std::tuple<int64_t, int64_t, int64_t>, PostedRecv> postedRecvs;
  /// Most bytes of posted receives held at once (staging memory).
  int64_t postedBytes = 0, postedBytesPeak = 0;
  /// --bind-cores: the CPUs this rank is pinned to ("0", "2-3"); "" unbound.
  std::string boundCpus;

  pipec::rt::Profiler profiler;
  pipec::rt::Timeline timeline;
};

namespace pipec {
namespace rt {

/// Lets this rank's messages in flight move (Communicator::progress) when
/// there are any and ctx.messageProgress is on.
void progressMessages(pipec_ctx &ctx);

/// Throws RtError unless `ctx` is non-null (every ABI entry point checks).
pipec_ctx &checkedContext(pipec_ctx *ctx, const char *function);

/// Frees the sends that have completed, without waiting for the others
/// (the continuous schedules' step boundary: a send of this step may be
/// received only in the receiver's next step).
void reapSends(pipec_ctx &ctx);

/// Gives the profiler's and the timeline's queue-marked spans their times
/// (waits for the device; nothing to do on a device without a queue clock).
/// Called once per step, after its synchronisation.
void collectQueueMarks(pipec_ctx &ctx);

} // namespace rt
} // namespace pipec

#endif // PIPEC_RUNTIME_CORE_CONTEXT_H
