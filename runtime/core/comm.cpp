//===- comm.cpp - Point-to-point transport between stages
//------------------===//
//
// Part of pipec's runtime core. Implements pipec_rt_send / _recv / _flush
// and the all-reduces on the process's Communicator (communicator.h).
//
//===----------------------------------------------------------------------===//
///
/// A message between two stages carries the tag channel * 1024 + mb mod
/// 1024 (the transport keeps messages of one tag in order). Routing (which
/// rank holds the peer stage, which replica owns a microbatch, which rows
/// of a split replica's slice go where) is decided here, for every
/// transport.
///
//===----------------------------------------------------------------------===//

#include "core/context.h"
#include "core/error.h"
#include "core/watchdog.h"
#include "pipec_rt.h"

#include <algorithm>
#include <cstring>

namespace pipec {
namespace rt {
namespace {

std::string linkName(int64_t peer, int64_t channel, int64_t mb) {
  return "stage " + std::to_string(peer) + ", channel " +
         std::to_string(channel) + ", microbatch " + std::to_string(mb);
}

/// Validates the arguments shared by send and recv; returns the peer's rank
/// and the message tag.
std::pair<int, int> route(const pipec_ctx &ctx, const char *fn, int64_t peer,
                          int64_t channel, int64_t mb, int64_t bytes) {
  // Stages are numbered over all chunks; stage q runs on position q mod p
  // (or in a V: StageDesc::positionOf).
  const int64_t p = ctx.desc.numStages, stages = p * ctx.desc.chunks;
  if (peer < 0 || peer >= stages ||
      (ctx.desc.chunks == 1 && peer == ctx.desc.stage))
    throw RtError(std::string(fn) + ": peer stage " + std::to_string(peer) +
                  " is not another stage of the " + std::to_string(stages) +
                  "-stage pipeline");
  const int64_t position = ctx.desc.positionOf(peer);
  if (channel < 0 || mb < 0 || bytes < 0)
    throw RtError(std::string(fn) + ": negative channel, microbatch or size (" +
                  linkName(peer, channel, mb) + ", " + std::to_string(bytes) +
                  " bytes)");
  int64_t tag = channel * 1024 + mb % 1024;
  const int64_t tagUb = ctx.comm->tagUpperBound();
  if (channel > tagUb / 1024 || tag > tagUb)
    throw RtError(std::string(fn) + ": channel " + std::to_string(channel) +
                  " gives message tag " + std::to_string(tag) +
                  " above the transport's largest, " + std::to_string(tagUb));
  // A replicated peer: the replica that owns the microbatch (1F1B-RR).
  const std::vector<int> &ranks = ctx.stageRanks[size_t(position)];
  return {ranks[size_t(mb) % ranks.size()], int(tag)};
}

/// One piece of a message: `bytes` bytes at `offset` of the buffer, to or
/// from `rank`.
struct Fragment {
  int rank;
  int64_t offset, bytes;
};

/// The pieces of a tensor of `bytes` bytes exchanged with `peer`: the whole
/// tensor with the owning replica, or with split replicas the rows of the
/// samples this rank's slice shares with each replica of the peer stage
/// (tensors sent between stages are sample-major: the compiler checks it).
std::vector<Fragment> fragments(const pipec_ctx &ctx, const char *fn,
                                int64_t peer, int64_t channel, int64_t mb,
                                int64_t bytes, int &tag) {
  auto [rank, t] = route(ctx, fn, peer, channel, mb, bytes);
  tag = t;
  const StageDesc &d = ctx.desc;
  if (!d.replicaSplit)
    return {{rank, 0, bytes}};
  if (bytes % d.sliceSize != 0)
    throw RtError(std::string(fn) + ": " + std::to_string(bytes) +
                  " bytes for " + linkName(peer, channel, mb) +
                  " do not divide into the " + std::to_string(d.sliceSize) +
                  " samples of this replica's slice");
  const int64_t perSample = bytes / d.sliceSize;
  const std::vector<int> &ranks = ctx.stageRanks[size_t(d.positionOf(peer))];
  const int64_t r = int64_t(ranks.size());
  std::vector<Fragment> out;
  for (int64_t j = 0; j < r; ++j) {
    auto [first, size] = replicaSlice(d.microbatch, r, j);
    int64_t lo = std::max(first, d.sliceFirst);
    int64_t hi = std::min(first + size, d.sliceFirst + d.sliceSize);
    if (lo < hi)
      out.push_back({ranks[size_t(j)], (lo - d.sliceFirst) * perSample,
                     (hi - lo) * perSample});
  }
  return out;
}

} // namespace

pipec_ctx &checkedContext(pipec_ctx *ctx, const char *function) {
  if (!ctx)
    throw RtError(std::string(function) + " called with a null context");
  return *ctx;
}

void progressMessages(pipec_ctx &ctx) {
  if (ctx.messageProgress && ctx.comm &&
      (!ctx.pendingSends.empty() || !ctx.postedRecvs.empty()))
    ctx.comm->progress();
}

void reapSends(pipec_ctx &ctx) {
  auto done = [](std::unique_ptr<Transfer> &t) { return t->test(); };
  ctx.pendingSends.erase(std::remove_if(ctx.pendingSends.begin(),
                                        ctx.pendingSends.end(), done),
                         ctx.pendingSends.end());
}

} // namespace rt
} // namespace pipec

using namespace pipec::rt;

/// "stage 2, channel 1, microbatch 3" as the communicator's `what`.
static std::string messageName(const char *fn, const char *direction,
                               int64_t peer, int64_t channel, int64_t mb) {
  return std::string(fn) + ": the message " + direction + " " +
         linkName(peer, channel, mb);
}

extern "C" void pipec_rt_send(pipec_ctx *ctx, int64_t peer, int64_t channel,
                              int64_t mb, const void *src, int64_t bytes) {
  guarded([&] {
    pipec_ctx &c = checkedContext(ctx, "pipec_rt_send");
    int tag = 0;
    std::vector<Fragment> pieces =
        fragments(c, "pipec_rt_send", peer, channel, mb, bytes, tag);
    if (bytes > 0 && !src)
      throw RtError("pipec_rt_send: null source buffer");
    c.timeline.begin(Timeline::Send, mb, c.step);
    const std::string what =
        messageName("pipec_rt_send", "to", peer, channel, mb);
    for (const Fragment &f : pieces) {
      BlockedOn wait(WaitKind::Receive, f.rank, channel, mb);
      c.pendingSends.push_back(
          c.comm->send(static_cast<const char *>(src) + f.offset, f.bytes,
                       f.rank, tag, what));
    }
    c.timeline.end(Timeline::Send);
  });
}

extern "C" void pipec_rt_recv_post(pipec_ctx *ctx, int64_t peer,
                                   int64_t channel, int64_t mb, int64_t bytes) {
  guarded([&] {
    pipec_ctx &c = checkedContext(ctx, "pipec_rt_recv_post");
    // (Split replicas receive a message in pieces: not prefetched.)
    if (!c.options.prefetch || c.desc.replicaSplit)
      return;
    auto [rank, tag] = route(c, "pipec_rt_recv_post", peer, channel, mb, bytes);
    auto key = std::make_tuple(peer, channel, mb);
    if (c.postedRecvs.count(key))
      throw RtError("pipec_rt_recv_post: the receive from " +
                    linkName(peer, channel, mb) + " is already posted");
    pipec_ctx::PostedRecv posted;
    posted.bytes = bytes;
    posted.receive =
        c.comm->post(bytes, rank, tag,
                     messageName("pipec_rt_recv", "from", peer, channel, mb));
    c.postedRecvs.emplace(key, std::move(posted));
    c.postedBytes += bytes;
    c.postedBytesPeak = std::max(c.postedBytesPeak, c.postedBytes);
  });
}

extern "C" void pipec_rt_recv(pipec_ctx *ctx, int64_t peer, int64_t channel,
                              int64_t mb, void *dst, int64_t bytes) {
  guarded([&] {
    pipec_ctx &c = checkedContext(ctx, "pipec_rt_recv");
    int tag = 0;
    std::vector<Fragment> pieces =
        fragments(c, "pipec_rt_recv", peer, channel, mb, bytes, tag);
    if (bytes > 0 && !dst)
      throw RtError("pipec_rt_recv: null destination buffer");
    c.timeline.begin(Timeline::Recv, mb, c.step);
    auto posted = c.postedRecvs.find(std::make_tuple(peer, channel, mb));
    if (posted != c.postedRecvs.end()) {
      pipec_ctx::PostedRecv &p = posted->second;
      if (p.bytes != bytes)
        throw RtError("pipec_rt_recv: " + std::to_string(bytes) +
                      " bytes expected from " + linkName(peer, channel, mb) +
                      " but " + std::to_string(p.bytes) + " were posted");
      {
        BlockedOn wait(WaitKind::Receive,
                       pieces.empty() ? -1 : pieces.front().rank, channel, mb);
        p.receive->finish(dst);
      }
      c.postedBytes -= bytes;
      c.postedRecvs.erase(posted);
      c.timeline.end(Timeline::Recv);
      return;
    }
    const std::string what =
        messageName("pipec_rt_recv", "from", peer, channel, mb);
    for (const Fragment &f : pieces) {
      BlockedOn wait(WaitKind::Receive, f.rank, channel, mb);
      c.comm->receive(static_cast<char *>(dst) + f.offset, f.bytes, f.rank, tag,
                      what);
    }
    c.timeline.end(Timeline::Recv);
  });
}

/// Sums `count` float elements (float32, or float64 in a float64 stage) at
/// `data` in place over `group`, then multiplies them by `scale`.
static void allreduceSum(const pipec_ctx &c, void *data, int64_t count,
                         CommGroup &group, const std::string &what,
                         double scale = 1.0) {
  BlockedOn wait(WaitKind::Collective);
  c.comm->allreduceSum(group, data, count, c.desc.isF64(), scale, what);
}

/// Sums `count` float elements at `data` over the stage's replicas; with
/// `mean`, divides by the replica count afterwards.
static void allreduceGradients(pipec_ctx *ctx, void *data, int64_t count,
                               bool mean) {
  const char *fn = mean ? "pipec_rt_allreduce_mean" : "pipec_rt_allreduce";
  guarded([&] {
    pipec_ctx &c = checkedContext(ctx, fn);
    if (count < 0 || (count > 0 && !data))
      throw RtError(std::string(fn) + ": bad buffer (" +
                    std::to_string(count) + " elements)");
    if (!c.stageGroup || count == 0)
      return;
    const int size = mean ? c.stageGroup->size() : 1;
    c.timeline.begin(Timeline::AllReduce, -1, c.step);
    allreduceSum(c, data, count, *c.stageGroup,
                 std::string(fn) + ": the sum of stage " +
                     std::to_string(c.desc.stage) +
                     "'s gradients over its replicas",
                 1.0 / double(size));
    c.timeline.end(Timeline::AllReduce);
  });
}

extern "C" void pipec_rt_allreduce_group(pipec_ctx *ctx, int64_t group,
                                         void *data, int64_t count) {
  guarded([&] {
    pipec_ctx &c = checkedContext(ctx, "pipec_rt_allreduce_group");
    if (count < 0 || (count > 0 && !data))
      throw RtError("pipec_rt_allreduce_group: bad buffer (" +
                    std::to_string(count) + " elements)");
    if (group < 0 || group >= int64_t(c.tieGroups.size()) ||
        !c.tieGroups[size_t(group)])
      throw RtError("pipec_rt_allreduce_group: stage " +
                    std::to_string(c.desc.stage) + " is not in tie group " +
                    std::to_string(group));
    c.timeline.begin(Timeline::AllReduce, -1, c.step);
    allreduceSum(c, data, count, *c.tieGroups[size_t(group)],
                 "pipec_rt_allreduce_group: the sum of tied weights' "
                 "gradients (group " +
                     std::to_string(group) + ")");
    c.timeline.end(Timeline::AllReduce);
  });
}

extern "C" void pipec_rt_allreduce(pipec_ctx *ctx, void *data, int64_t count) {
  allreduceGradients(ctx, data, count, /*mean=*/false);
}

extern "C" void pipec_rt_allreduce_mean(pipec_ctx *ctx, void *data,
                                        int64_t count) {
  allreduceGradients(ctx, data, count, /*mean=*/true);
}

extern "C" void pipec_rt_flush(pipec_ctx *ctx) {
  guarded([&] {
    pipec_ctx &c = checkedContext(ctx, "pipec_rt_flush");
    c.timeline.begin(Timeline::Flush, -1, c.step);
    BlockedOn wait(WaitKind::Sends);
    for (std::unique_ptr<Transfer> &t : c.pendingSends)
      t->wait();
    c.pendingSends.clear();
    c.timeline.end(Timeline::Flush);
  });
}
