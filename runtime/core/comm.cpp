//===- comm.cpp - Point-to-point transport between stages (MPI) -----------===//
//
// Part of pipec's runtime core. Implements pipec_rt_send / _recv / _flush.
//
//===----------------------------------------------------------------------===//
///
/// A message of `bytes` bytes between two stages travels as one MPI message
/// per chunk of at most kChunkBytes (MPI counts are int), all with the tag
/// channel * 1024 + mb mod 1024; MPI's non-overtaking rule keeps the chunks
/// in order. The receiver probes each chunk first so that a size mismatch
/// is reported as such instead of as an MPI truncation error.
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

constexpr int64_t kChunkBytes = int64_t(1) << 30;

void mpiCheck(int rc, const std::string &what) {
  if (rc == MPI_SUCCESS)
    return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw RtError(what + " failed: " + std::string(text, size_t(len)));
}

std::string linkName(int64_t peer, int64_t channel, int64_t mb) {
  return "stage " + std::to_string(peer) + ", channel " +
         std::to_string(channel) + ", microbatch " + std::to_string(mb);
}

/// Validates the arguments shared by send and recv; returns the peer's rank
/// and the MPI tag.
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
  if (channel > int64_t(ctx.tagUpperBound) / 1024 || tag > ctx.tagUpperBound)
    throw RtError(std::string(fn) + ": channel " + std::to_string(channel) +
                  " gives MPI tag " + std::to_string(tag) +
                  " above MPI_TAG_UB " + std::to_string(ctx.tagUpperBound));
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

void reapSends(pipec_ctx &ctx) {
  auto done = [](pipec_ctx::PendingSend &p) {
    int flag = 0;
    mpiCheck(MPI_Testall(int(p.requests.size()), p.requests.data(), &flag,
                         MPI_STATUSES_IGNORE),
             "MPI_Testall on outstanding sends");
    return flag != 0;
  };
  ctx.pendingSends.erase(std::remove_if(ctx.pendingSends.begin(),
                                        ctx.pendingSends.end(), done),
                         ctx.pendingSends.end());
}

} // namespace rt
} // namespace pipec

using namespace pipec::rt;

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
    std::unique_ptr<char[]> copy(new char[size_t(std::max<int64_t>(bytes, 1))]);
    // Host-staged: the message leaves from host memory (a device arena is
    // copied out first, after the kernels that produced it).
    c.device->toHost(copy.get(), src, bytes);
    pipec_ctx::PendingSend pending;
    for (const Fragment &f : pieces) {
      BlockedOn wait(WaitKind::Receive, f.rank, channel, mb);
      int64_t offset = 0;
      do {
        int count = int(std::min(f.bytes - offset, kChunkBytes));
        MPI_Request request;
        mpiCheck(MPI_Isend(copy.get() + f.offset + offset, count, MPI_BYTE,
                           f.rank, tag, MPI_COMM_WORLD, &request),
                 "MPI_Isend to " + linkName(peer, channel, mb));
        pending.requests.push_back(request);
        offset += count;
      } while (offset < f.bytes);
    }
    pending.data = std::move(copy);
    c.pendingSends.push_back(std::move(pending));
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
    posted.data.reset(new char[size_t(std::max<int64_t>(bytes, 1))]);
    int64_t offset = 0;
    do {
      int count = int(std::min(bytes - offset, kChunkBytes));
      MPI_Request request;
      mpiCheck(MPI_Irecv(posted.data.get() + offset, count, MPI_BYTE, rank, tag,
                         MPI_COMM_WORLD, &request),
               "MPI_Irecv from " + linkName(peer, channel, mb));
      posted.requests.push_back(request);
      offset += count;
    } while (offset < bytes);
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
      std::vector<MPI_Status> statuses(p.requests.size());
      BlockedOn wait(WaitKind::Receive,
                     pieces.empty() ? -1 : pieces.front().rank, channel, mb);
      int rc = MPI_Waitall(int(p.requests.size()), p.requests.data(),
                           statuses.data());
      if (rc != MPI_SUCCESS)
        throw RtError("pipec_rt_recv: receiving from " +
                      linkName(peer, channel, mb) +
                      " failed (a message larger than the " +
                      std::to_string(bytes) +
                      " bytes expected? sender and receiver disagree on the "
                      "tensor size)");
      int64_t got = 0;
      for (MPI_Status &st : statuses) {
        int count = 0;
        MPI_Get_count(&st, MPI_BYTE, &count);
        got += count;
      }
      if (got != bytes)
        throw RtError("pipec_rt_recv: received " + std::to_string(got) +
                      " bytes from " + linkName(peer, channel, mb) +
                      " but expected " + std::to_string(bytes) +
                      " (sender and receiver disagree on the tensor size)");
      c.device->toDevice(dst, p.data.get(), bytes);
      c.postedBytes -= bytes;
      c.postedRecvs.erase(posted);
      c.timeline.end(Timeline::Recv);
      return;
    }
    // A device arena receives through host memory.
    HostView into(*c.device, dst, bytes);
    for (const Fragment &f : pieces) {
      BlockedOn wait(WaitKind::Receive, f.rank, channel, mb);
      int64_t offset = 0;
      do {
        int expected = int(std::min(f.bytes - offset, kChunkBytes));
        MPI_Status status;
        mpiCheck(MPI_Probe(f.rank, tag, MPI_COMM_WORLD, &status),
                 "MPI_Probe from " + linkName(peer, channel, mb));
        int count = 0;
        MPI_Get_count(&status, MPI_BYTE, &count);
        if (count != expected)
          throw RtError("pipec_rt_recv: received " + std::to_string(count) +
                        " bytes from " + linkName(peer, channel, mb) +
                        " but expected " + std::to_string(expected) +
                        " (sender and receiver disagree on the tensor size)");
        mpiCheck(MPI_Recv(into.get() + f.offset + offset, count, MPI_BYTE,
                          f.rank,
                          tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE),
                 "MPI_Recv from " + linkName(peer, channel, mb));
        offset += count;
      } while (offset < f.bytes);
    }
    into.push();
    c.timeline.end(Timeline::Recv);
  });
}

/// Sums `count` float elements (float32, or float64 in a float64 stage) at
/// `data` in place over `comm`, in chunks (MPI counts are int), then
/// multiplies them by `scale` unless it is 1. A device arena is reduced
/// through host memory.
static void allreduceSum(const pipec_ctx &c, void *data, int64_t count,
                         MPI_Comm comm, const std::string &what,
                         double scale = 1.0) {
  const bool f64 = c.desc.isF64();
  HostView view(*c.device, data, count * c.desc.realBytes);
  char *p = view.pull();
  {
    BlockedOn wait(WaitKind::Collective);
    for (int64_t done = 0; done < count;) {
      int n = int(std::min<int64_t>(count - done, int64_t(1) << 30));
      mpiCheck(MPI_Allreduce(MPI_IN_PLACE, p + done * c.desc.realBytes, n,
                             f64 ? MPI_DOUBLE : MPI_FLOAT, MPI_SUM, comm),
               what);
      done += n;
    }
  }
  if (scale != 1.0) {
    if (f64) {
      double *d = reinterpret_cast<double *>(p);
      for (int64_t i = 0; i < count; ++i)
        d[i] *= scale;
    } else {
      float *f = reinterpret_cast<float *>(p);
      const float s = float(scale);
      for (int64_t i = 0; i < count; ++i)
        f[i] *= s;
    }
  }
  view.push();
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
    if (c.stageComm == MPI_COMM_NULL || count == 0)
      return;
    int size = 1;
    if (mean)
      mpiCheck(MPI_Comm_size(c.stageComm, &size), "MPI_Comm_size");
    c.timeline.begin(Timeline::AllReduce, -1, c.step);
    allreduceSum(c, data, count, c.stageComm,
                 "MPI_Allreduce of stage " + std::to_string(c.desc.stage) +
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
    if (group < 0 || group >= int64_t(c.tieComms.size()) ||
        c.tieComms[size_t(group)] == MPI_COMM_NULL)
      throw RtError("pipec_rt_allreduce_group: stage " +
                    std::to_string(c.desc.stage) + " is not in tie group " +
                    std::to_string(group));
    c.timeline.begin(Timeline::AllReduce, -1, c.step);
    allreduceSum(c, data, count, c.tieComms[size_t(group)],
                 "MPI_Allreduce of tied weights' gradients (group " +
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
    for (pipec_ctx::PendingSend &p : c.pendingSends)
      mpiCheck(MPI_Waitall(int(p.requests.size()), p.requests.data(),
                           MPI_STATUSES_IGNORE),
               "MPI_Waitall on this step's sends");
    c.pendingSends.clear();
    c.timeline.end(Timeline::Flush);
  });
}
