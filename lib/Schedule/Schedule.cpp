//===- Schedule.cpp - Pipeline schedule generators
//-------------------------===//
//
// Per-rank programs of every schedule of the papers (DESIGN.md §5,
// papers/thesis.md §3-5, pipedream.md §3-4, dapple.md §3): GPipe,
// 1F1B-flush with DAPPLE's warm-up policies, PipeDream 1F1B, 2BW, Megatron's
// interleaved 1F1B and zero-bubble ZB-H1, with replicated stages (1F1B-RR).
// Programs are counted loops (Segments) wherever the order is periodic, so
// generated code does not grow with the microbatch count.
//
// Every generator first builds the program of one stage replica over its
// local microbatches 0..n-1 and then maps local index l to the global
// microbatch j + r*l of replica j of r (pipedream.md §3, 1F1B-RR).
//
//===----------------------------------------------------------------------===//

#include "pipec/Schedule.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <map>
#include <unordered_map>

namespace pipec {

//===----------------------------------------------------------------------===//
// Names
//===----------------------------------------------------------------------===//

namespace {

struct KindName {
  ScheduleKind kind;
  const char *name;
};

constexpr KindName kKindNames[] = {
    {ScheduleKind::GPipe, "gpipe"},
    {ScheduleKind::OneFOneBFlush, "1f1b-flush"},
    {ScheduleKind::OneFOneB, "1f1b"},
    {ScheduleKind::TwoBW, "2bw"},
    {ScheduleKind::Interleaved, "interleaved"},
    {ScheduleKind::ZeroBubbleH1, "zb-h1"},
    {ScheduleKind::Custom, "custom"},
    {ScheduleKind::ZeroBubbleV, "zb-v"},
    {ScheduleKind::ZeroBubbleH2, "zb-h2"},
    {ScheduleKind::DualPipeV, "dualpipev"},
};

} // namespace

std::optional<ScheduleKind> parseScheduleKind(const std::string &name) {
  for (const KindName &entry : kKindNames)
    if (name == entry.name)
      return entry.kind;
  return std::nullopt;
}

const char *scheduleKindName(ScheduleKind kind) {
  for (const KindName &entry : kKindNames)
    if (entry.kind == kind)
      return entry.name;
  return "unknown";
}

std::vector<std::string> scheduleKindNames() {
  std::vector<std::string> names;
  for (const KindName &entry : kKindNames)
    names.push_back(entry.name);
  return names;
}

const char *placementName(Placement placement) {
  return placement == Placement::V ? "v" : "loop";
}

std::optional<Placement> parsePlacement(const std::string &name) {
  if (name == "loop")
    return Placement::Loop;
  if (name == "v")
    return Placement::V;
  return std::nullopt;
}

Placement placementOf(ScheduleKind kind) {
  return kind == ScheduleKind::ZeroBubbleV || kind == ScheduleKind::DualPipeV
             ? Placement::V
             : Placement::Loop;
}

int64_t positionOfStage(Placement placement, int64_t p, int64_t q) {
  if (placement == Placement::V && q >= p)
    return 2 * p - 1 - q;
  return q % p;
}

int64_t chunkOfStage(Placement placement, int64_t p, int64_t q) {
  if (placement == Placement::V)
    return q >= p ? 1 : 0;
  return q / p;
}

int64_t stageOfChunk(Placement placement, int64_t p, int64_t r, int64_t c) {
  if (placement == Placement::V)
    return c == 0 ? r : 2 * p - 1 - r;
  return c * p + r;
}

bool isFlushSchedule(ScheduleKind kind) {
  return kind != ScheduleKind::OneFOneB && kind != ScheduleKind::TwoBW;
}

//===----------------------------------------------------------------------===//
// Programs
//===----------------------------------------------------------------------===//

std::vector<SchedOp> StageSchedule::flatten() const {
  std::vector<SchedOp> ops;
  for (const Segment &segment : segments)
    for (int64_t trip = 0; trip < segment.trips; ++trip)
      for (const SchedOp &op : segment.body)
        ops.push_back(
            {op.kind, op.microbatch + trip * segment.stride, op.chunk});
  return ops;
}

int ScheduleResult::rankOf(int stage, int replica) const {
  if (stage < 0 || stage >= static_cast<int>(replicas.size()) || replica < 0 ||
      replica >= replicas[stage])
    return -1;
  int rank = 0;
  for (int s = 0; s < stage; ++s)
    rank += replicas[s];
  return rank + replica;
}

namespace {

using K = PassKind;

/// Appends `trips` repetitions of `body` unless the loop would never run.
void addSegment(StageSchedule &schedule, std::vector<SchedOp> body,
                int64_t trips, int64_t stride = 1) {
  if (trips > 0 && !body.empty())
    schedule.segments.push_back({std::move(body), trips, stride});
}

/// GPipe on n local microbatches: F0..F(n-1), B0..B(n-1) (thesis.md §5.1).
StageSchedule gpipeStage(int64_t n) {
  StageSchedule schedule;
  addSegment(schedule, {{K::Forward, 0}}, n);
  addSegment(schedule, {{K::Backward, 0}}, n);
  return schedule;
}

/// 1F1B on n local microbatches with `warmup` forwards before the steady
/// state: w = min(warmup, n) forwards, n - w {F, B} pairs, w backwards
/// (thesis.md §5.2; the same per-stage pattern without a flush, §5.3).
StageSchedule oneFOneBStage(int64_t n, int64_t warmup) {
  const int64_t w = std::min(warmup, n);
  StageSchedule schedule;
  addSegment(schedule, {{K::Forward, 0}}, w);
  addSegment(schedule, {{K::Forward, w}, {K::Backward, 0}}, n - w);
  addSegment(schedule, {{K::Backward, n - w}}, w);
  return schedule;
}

/// ZB-H1 on n local microbatches: the 1F1B order of F and B (input gradient)
/// with `warmup` forwards; after each B, the W (weight gradient) of the
/// oldest pending microbatch runs once more than `deferred` are pending; the
/// deferred W ops close the step and fill the cool-down bubble.
StageSchedule zbH1Stage(int64_t n, int64_t warmup, int64_t deferred) {
  const int64_t w = std::min(warmup, n);
  const int64_t d = deferred;
  StageSchedule schedule;
  addSegment(schedule, {{K::Forward, 0}}, w);
  // Steady state: pairs j = 0..n-w-1 run F(w+j), B(j), and W(j-d) for j >= d.
  const int64_t pairs = n - w;
  const int64_t plainPairs = std::min(d, pairs);
  addSegment(schedule, {{K::Forward, w}, {K::Backward, 0}}, plainPairs);
  addSegment(schedule,
             {{K::Forward, w + d}, {K::Backward, d}, {K::BackwardWeight, 0}},
             pairs - plainPairs);
  // Cool-down: B(j) for j = n-w..n-1, followed by W(j-d) when j >= d.
  const int64_t coolFirst = n - w;
  const int64_t coolPlainEnd = std::max(coolFirst, std::min(d, n));
  addSegment(schedule, {{K::Backward, coolFirst}}, coolPlainEnd - coolFirst);
  addSegment(
      schedule,
      {{K::Backward, coolPlainEnd}, {K::BackwardWeight, coolPlainEnd - d}},
      n - coolPlainEnd);
  // The W ops still pending.
  const int64_t firstPending = std::max<int64_t>(n - d, 0);
  addSegment(schedule, {{K::BackwardWeight, firstPending}}, n - firstPending);
  return schedule;
}

/// A flat order as segments: a run that repeats a body of up to three ops
/// at least three times with every microbatch advanced by one stride is a
/// loop; what is left between loops is one segment run once.
StageSchedule loopify(const std::vector<SchedOp> &ops) {
  StageSchedule out;
  std::vector<SchedOp> flat;
  auto flushFlat = [&] {
    addSegment(out, std::move(flat), 1);
    flat.clear();
  };
  size_t i = 0;
  while (i < ops.size()) {
    size_t bestPeriod = 0;
    int64_t bestTrips = 0, bestStride = 0;
    for (size_t period = 1; period <= 3 && i + 2 * period <= ops.size();
         ++period) {
      const int64_t stride = ops[i + period].microbatch - ops[i].microbatch;
      if (stride <= 0)
        continue;
      int64_t trips = 1;
      for (bool same = true;
           same && i + size_t(trips + 1) * period <= ops.size();
           trips += same ? 1 : 0)
        for (size_t k = 0; k < period && same; ++k) {
          const SchedOp &a = ops[i + k],
                        &b = ops[i + size_t(trips) * period + k];
          same = b.kind == a.kind && b.chunk == a.chunk &&
                 b.microbatch == a.microbatch + trips * stride;
        }
      if (trips >= 3 &&
          size_t(trips) * period > size_t(bestTrips) * bestPeriod) {
        bestPeriod = period;
        bestTrips = trips;
        bestStride = stride;
      }
    }
    if (bestPeriod == 0) {
      flat.push_back(ops[i++]);
      continue;
    }
    flushFlat();
    addSegment(out,
               std::vector<SchedOp>(ops.begin() + long(i),
                                    ops.begin() + long(i + bestPeriod)),
               bestTrips, bestStride);
    i += size_t(bestTrips) * bestPeriod;
  }
  flushFlat();
  return out;
}

/// ZB-H2 on a straight pipeline of p stages and n microbatches, every
/// stage at once: the list schedule of F, B and W ops of one time unit
/// each (B before F before W when several are ready; a forward only while
/// fewer than min(2p - 1, n) microbatches are in flight, held until their
/// W). Stage s then runs 2(p - s) - 1 warm-up forwards, 1F1B pairs until
/// 2p - 1 are in flight, B W F triples in the steady state, and its
/// deferred W ops in the cool-down while the last backwards come up the
/// pipeline: one time unit per op never waits on a stage busy with another
/// (an iteration of 3n + p - 1 units, ZB-H1's with W = F = B). Each order
/// is that of a feasible run, so the programs cannot deadlock whatever the
/// real op times are.
std::vector<StageSchedule> zbH2Pipeline(int p, int64_t n) {
  const int64_t cap = std::min<int64_t>(2 * int64_t(p) - 1, n);
  const int64_t never = std::numeric_limits<int64_t>::max();
  std::vector<std::vector<int64_t>> fDone(
      size_t(p), std::vector<int64_t>(size_t(n), never));
  std::vector<std::vector<int64_t>> bDone = fDone;
  std::vector<int64_t> nextF(size_t(p), 0), nextB(size_t(p), 0),
      nextW(size_t(p), 0);
  std::vector<std::vector<SchedOp>> ops(static_cast<size_t>(p));
  // Every op takes one unit: a time step in which no stage starts one
  // leaves nothing to finish, so the run could not go on (it cannot happen:
  // the last stage never waits on a later one, and each stage's oldest
  // microbatch in flight can always go on down and back up). The guard
  // only keeps a mistake here from looping forever; the programs would
  // then be incomplete and the pipeline verifier refuses them.
  for (int64_t t = 0, left = 3 * n * p, lastLeft = -1;
       left > 0 && left != lastLeft; ++t) {
    lastLeft = left;
    for (int s = 0; s < p; ++s) {
      const size_t st = size_t(s);
      const int64_t f = nextF[st], b = nextB[st], w = nextW[st];
      // B(b) needs this stage's F(b) and, but on the last stage, the next
      // stage's B(b); F(f) the previous stage's F(f).
      const bool canB = b < f && (s == p - 1 ? fDone[st][size_t(b)] <= t
                                             : bDone[st + 1][size_t(b)] <= t);
      const bool canF =
          f < n && f - w < cap && (s == 0 || fDone[st - 1][size_t(f)] <= t);
      if (canB) {
        bDone[st][size_t(b)] = t + 1;
        ops[st].push_back({K::Backward, b});
        ++nextB[st];
      } else if (canF) {
        fDone[st][size_t(f)] = t + 1;
        ops[st].push_back({K::Forward, f});
        ++nextF[st];
      } else if (w < b) {
        ops[st].push_back({K::BackwardWeight, w});
        ++nextW[st];
      } else {
        continue;
      }
      --left;
    }
  }
  std::vector<StageSchedule> out;
  for (const std::vector<SchedOp> &stageOps : ops)
    out.push_back(loopify(stageOps));
  return out;
}

/// Appends ops(k) for k in [begin, end) where ops(k + period) equals ops(k)
/// with every microbatch increased by `stride`: whole periods become one
/// loop, the rest one plain segment.
template <typename OpsFn>
void addPeriodic(StageSchedule &schedule, OpsFn ops, int64_t begin, int64_t end,
                 int64_t period, int64_t stride) {
  if (end <= begin)
    return;
  const int64_t trips = (end - begin) / period;
  if (trips > 0) {
    std::vector<SchedOp> body;
    for (int64_t k = begin; k < begin + period; ++k)
      ops(k, body);
    addSegment(schedule, std::move(body), trips, stride);
  }
  std::vector<SchedOp> rest;
  for (int64_t k = begin + trips * period; k < end; ++k)
    ops(k, rest);
  addSegment(schedule, std::move(rest), 1);
}

/// Warm-up W_r of the interleaved schedule on device r (thesis.md §4.2):
/// min(2(p-r-1) + (v-1)p, N_v), and N_v when m == p.
int64_t interleavedWarmup(int p, int v, int r, int64_t n) {
  const int64_t total = n * v;
  if (n == p)
    return total;
  return std::min<int64_t>(2 * (p - r - 1) + static_cast<int64_t>(v - 1) * p,
                           total);
}

/// Megatron's interleaved 1F1B on device r over n local microbatches
/// (thesis.md §4.2 [M]): for k = 0..N_v-1 with N_v = n*v,
///   c_F(k) = (k mod pv) div p,  c_B(k) = v-1-c_F(k),
///   mb(k)  = (k div pv) p + (k mod p);
/// W_r warm-up forwards, N_v - W_r pairs {F(k+W_r), B(k)}, W_r backwards.
/// ZB-V (Qi et al. 2024, §6 of arXiv 2401.10241; the order torch's
/// ScheduleZBVZeroBubble documents): device r holds chunk 0 (stage r) and
/// chunk 1 (stage 2p-1-r). With n = max(2p-1, m) microbatches per chunk:
///   warm-up  2(p-r)-1 forwards of chunk 0; r times {F1, F0}; p-r times
///            {F1, B1, W1}
///   steady   while chunk 1 trails chunk 0 or chunk 0 has forwards left:
///            {F0 (while any left), B0, W0, F1, B1, W1}
///   cool-down r times {B0, B1}; p-r times {B0, W0 of the oldest pending};
///            then the pending W1s, then the pending W0s
/// and the ops of microbatches >= m (when m < 2p-1) are left out. B is the
/// input gradient, W the weight gradient.
StageSchedule zbVStage(int64_t p, int64_t r, int64_t m) {
  const int64_t n = std::max(2 * p - 1, m);
  std::vector<SchedOp> ops;
  int64_t f0 = 0, f1 = 0, b0 = 0, b1 = 0;
  auto add = [&](PassKind kind, int64_t mb, int chunk) {
    if (mb < m)
      ops.push_back({kind, mb, chunk});
  };
  for (int64_t i = 0; i < 2 * (p - r) - 1; ++i)
    add(K::Forward, f0++, 0);
  for (int64_t i = 0; i < r; ++i) {
    add(K::Forward, f1++, 1);
    add(K::Forward, f0++, 0);
  }
  for (int64_t i = 0; i < p - r; ++i) {
    add(K::Forward, f1++, 1);
    add(K::Backward, b1, 1);
    add(K::BackwardWeight, b1++, 1);
  }
  while (f1 < f0 || f0 < n) {
    if (f0 < n)
      add(K::Forward, f0++, 0);
    add(K::Backward, b0, 0);
    add(K::BackwardWeight, b0++, 0);
    add(K::Forward, f1++, 1);
    add(K::Backward, b1, 1);
    add(K::BackwardWeight, b1++, 1);
  }
  int64_t w0 = b0, w1 = b1;
  for (int64_t i = 0; i < r; ++i) {
    add(K::Backward, b0++, 0);
    add(K::Backward, b1++, 1);
  }
  for (int64_t i = 0; i < p - r; ++i) {
    add(K::Backward, b0++, 0);
    add(K::BackwardWeight, w0++, 0);
  }
  while (w1 < b1)
    add(K::BackwardWeight, w1++, 1);
  while (w0 < b0)
    add(K::BackwardWeight, w0++, 0);
  StageSchedule schedule;
  schedule.segments.push_back({ops, 1, 1});
  return schedule;
}

/// DualPipeV (DeepSeek; deepseek-ai/DualPipe, dualpipev.py) on device r of
/// p in a V (chunk 0 is stage r, chunk 1 stage 2p-1-r) with m >= 2p
/// microbatches, its eight phases:
///   1. 2(p-r-1) times F0
///   2. r+1 times {F0, F1}
///   3. p-r-1 times {B1, W, F1} (zero bubble: B1's W deferred, the oldest
///      deferred W run at once)
///   4. m-2p+r+1 times {F0, B1, F1, B0}: the overlapped forward-backward
///      pairs of the two chunks, full backwards (B then its W)
///   5. p-r-1 times {B1, F1, B0}, full backwards
///   6. r+1 times {B1, B0}: full backwards in the first half; from the
///      middle on (r odd: from that B1, r even: from that B0) input
///      gradients only, their W deferred
///   7. p-r-1 times {W, B0 with its W deferred}
///   8. r+1 times W
/// Deferred W ops run oldest first (DualPipe's WeightGradStore is a FIFO).
/// pipec runs each pair one after the other on the device's stream: the
/// order is DualPipeV's, the overlap of a pair's computations is not.
StageSchedule dualPipeVStage(int64_t p, int64_t r, int64_t m) {
  std::vector<SchedOp> ops;
  int64_t f[2] = {0, 0}, b[2] = {0, 0};
  std::deque<SchedOp> deferred;
  auto fwd = [&](int c) { ops.push_back({K::Forward, f[c]++, c}); };
  auto bwd = [&](int c, bool deferW) {
    const int64_t mb = b[c]++;
    ops.push_back({K::Backward, mb, c});
    if (deferW)
      deferred.push_back({K::BackwardWeight, mb, c});
    else
      ops.push_back({K::BackwardWeight, mb, c});
  };
  auto weight = [&] {
    ops.push_back(deferred.front());
    deferred.pop_front();
  };
  for (int64_t i = 0; i < 2 * (p - r - 1); ++i)
    fwd(0);
  for (int64_t i = 0; i < r + 1; ++i) {
    fwd(0);
    fwd(1);
  }
  for (int64_t i = 0; i < p - r - 1; ++i) {
    bwd(1, true);
    weight();
    fwd(1);
  }
  for (int64_t i = 0; i < m - 2 * p + r + 1; ++i) {
    fwd(0);
    bwd(1, false);
    fwd(1);
    bwd(0, false);
  }
  for (int64_t i = 0; i < p - r - 1; ++i) {
    bwd(1, false);
    fwd(1);
    bwd(0, false);
  }
  const int64_t half = (r + 1) / 2;
  bool deferW = false;
  for (int64_t i = 0; i < r + 1; ++i) {
    if (i == half && r % 2 == 1)
      deferW = true;
    bwd(1, deferW);
    if (i == half && r % 2 == 0)
      deferW = true;
    bwd(0, deferW);
  }
  for (int64_t i = 0; i < p - r - 1; ++i) {
    weight();
    bwd(0, true);
  }
  while (!deferred.empty())
    weight();
  return loopify(ops);
}

StageSchedule interleavedStage(int p, int v, int r, int64_t n) {
  const int64_t pv = static_cast<int64_t>(p) * v;
  const int64_t total = n * v;
  const int64_t warmup = interleavedWarmup(p, v, r, n);
  auto chunkF = [&](int64_t k) { return static_cast<int>((k % pv) / p); };
  auto mb = [&](int64_t k) { return (k / pv) * p + (k % p); };
  auto fwd = [&](int64_t k, std::vector<SchedOp> &out) {
    out.push_back({K::Forward, mb(k), chunkF(k)});
  };
  auto bwd = [&](int64_t k, std::vector<SchedOp> &out) {
    out.push_back({K::Backward, mb(k), v - 1 - chunkF(k)});
  };
  auto pair = [&](int64_t k, std::vector<SchedOp> &out) {
    fwd(k + warmup, out);
    bwd(k, out);
  };
  StageSchedule schedule;
  addPeriodic(schedule, fwd, 0, warmup, pv, p);
  addPeriodic(schedule, pair, 0, total - warmup, pv, p);
  addPeriodic(schedule, bwd, total - warmup, total, pv, p);
  return schedule;
}

/// Maps a program over local microbatches 0..n-1 to replica j of r: local l
/// becomes global j + r*l, and every loop stride is multiplied by r.
StageSchedule mapToReplica(StageSchedule local, int replica, int replicas) {
  if (replicas == 1)
    return local;
  for (Segment &segment : local.segments) {
    for (SchedOp &op : segment.body)
      op.microbatch = replica + static_cast<int64_t>(replicas) * op.microbatch;
    segment.stride *= replicas;
  }
  return local;
}

/// Microbatches k in [0, total) with k mod r == j.
int64_t localCount(int64_t total, int replica, int replicas) {
  if (replica >= total)
    return 0;
  return (total - replica + replicas - 1) / replicas;
}

int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// In-flight depth K_s of every stage: W_s = sum_{t>=s} r_t workers from
/// stage s on, K_s = ceil(W_s / r_s) (p - s for a straight pipeline; NOAM
/// on the input stage, pipedream.md §3), policy B ceil(2 W_s / r_s) - 1
/// (2(p-s) - 1, dapple.md §3.3), clamped to D when D > 0.
std::vector<int64_t> inflightDepths(const std::vector<int> &replicas,
                                    WarmupPolicy policy, int64_t maxInflight) {
  const int p = static_cast<int>(replicas.size());
  std::vector<int64_t> depth(p);
  int64_t workers = 0;
  for (int s = p - 1; s >= 0; --s) {
    workers += replicas[s];
    int64_t k = policy == WarmupPolicy::A
                    ? ceilDiv(workers, replicas[s])
                    : ceilDiv(2 * workers, replicas[s]) - 1;
    if (maxInflight > 0)
      k = std::min(k, maxInflight);
    depth[s] = std::max<int64_t>(k, 1);
  }
  return depth;
}

/// Depths used by `kind`: the DAPPLE policy and D apply to 1f1b-flush only.
std::vector<int64_t> depthsFor(ScheduleKind kind,
                               const std::vector<int> &replicas,
                               const ScheduleOptions &options) {
  if (kind == ScheduleKind::OneFOneBFlush)
    return inflightDepths(replicas, options.warmup, options.maxInflight);
  return inflightDepths(replicas, WarmupPolicy::A, 0);
}

std::string str(int64_t v) { return std::to_string(v); }

/// Checks the request: the generator's own options, then the schedule's
/// shape rules (Rules.cpp); returns "" or the first message.
std::string checkRequest(ScheduleKind kind, int stages, int64_t microbatches,
                         const ScheduleOptions &options,
                         std::vector<int> &replicas) {
  const char *name = scheduleKindName(kind);
  if (kind == ScheduleKind::Custom)
    return "the custom schedule has no generator: its order per rank comes "
           "from a file (a compute-only CSV: give it with --schedule-csv; a "
           "build of pipec compile keeps it as schedule.csv beside its "
           "plan.json)";
  if (stages < 1)
    return "a pipeline needs at least one stage (got " + str(stages) + ")";
  if (options.steps < 1)
    return "steps must be at least 1 (got " + str(options.steps) + ")";
  if (options.steps > 1 && isFlushSchedule(kind))
    return std::string("steps > 1 is for the continuous schedules 1f1b and "
                       "2bw; ") +
           name + " flushes after every step";
  if (options.maxInflight < 0)
    return "maxInflight must be >= 0 (got " + str(options.maxInflight) + ")";
  PipelineRequest request;
  request.kind = kind;
  request.stages = int64_t(stages) * std::max(options.chunks, 1);
  request.chunks = options.chunks;
  request.microbatches = microbatches;
  request.replicas = options.replicas;
  request.warmup = options.warmup;
  std::vector<RuleViolation> violations = checkScheduleShape(request);
  if (!violations.empty())
    return violations.front().message;
  replicas = options.replicas;
  if (replicas.empty())
    replicas.assign(stages, 1);
  return "";
}

} // namespace

ScheduleResult generateSchedule(ScheduleKind kind, int stages,
                                int64_t microbatches,
                                const ScheduleOptions &options) {
  ScheduleResult result;
  result.kind = kind;
  result.stages = stages;
  result.chunks = options.chunks;
  result.placement = placementOf(kind);
  result.microbatches = microbatches;
  result.steps = options.steps;
  result.error =
      checkRequest(kind, stages, microbatches, options, result.replicas);
  if (!result.error.empty())
    return result;

  const int p = stages;
  const int64_t total = microbatches * options.steps;
  const std::vector<int64_t> depth = depthsFor(kind, result.replicas, options);
  std::vector<StageSchedule> zbH2;
  for (int s = 0; s < p; ++s) {
    const int r = result.replicas[s];
    for (int j = 0; j < r; ++j) {
      const int64_t n = localCount(total, j, r);
      StageSchedule local;
      switch (kind) {
      case ScheduleKind::GPipe:
        local = gpipeStage(n);
        break;
      case ScheduleKind::OneFOneBFlush:
      case ScheduleKind::OneFOneB:
      case ScheduleKind::TwoBW:
        // K_s forwards in flight: K_s - 1 warm-up forwards, then the first
        // steady-state forward (thesis.md §5.2, §5.3).
        local = oneFOneBStage(n, depth[s] - 1);
        break;
      case ScheduleKind::ZeroBubbleH1:
        // d_s = K_0 - K_s deferred W ops (s on a straight pipeline).
        local = zbH1Stage(n, depth[s] - 1,
                          std::max<int64_t>(depth[0] - depth[s], 0));
        break;
      case ScheduleKind::ZeroBubbleH2:
        // One replica per stage (Rules.cpp): the pipeline's programs at
        // once.
        if (s == 0)
          zbH2 = zbH2Pipeline(p, n);
        local = zbH2[size_t(s)];
        break;
      case ScheduleKind::Interleaved:
        local = interleavedStage(p, options.chunks, s, n);
        break;
      case ScheduleKind::Custom: // refused by checkRequest
        break;
      case ScheduleKind::ZeroBubbleV:
        local = zbVStage(p, s, n);
        break;
      case ScheduleKind::DualPipeV:
        local = dualPipeVStage(p, s, n);
        break;
      }
      result.ranks.push_back({s, j, mapToReplica(std::move(local), j, r)});
    }
  }

  if (kind == ScheduleKind::TwoBW) {
    // A forward of batch j+2 needs the version made by the last backward of
    // batch j (thesis.md §3.1): m >= p - 1 on a straight pipeline. Check the
    // programs themselves, over at least three batches.
    ScheduleResult check = result;
    if (options.steps < 3) {
      ScheduleOptions longer = options;
      longer.steps = 3;
      check = generateSchedule(kind, stages, microbatches, longer);
      if (!check.ok) {
        result.ranks.clear();
        result.error = check.error;
        return result;
      }
    }
    for (const RankSchedule &rank : check.ranks) {
      int64_t versions =
          peakWeightVersions(kind, rank.schedule.flatten(), microbatches);
      if (versions < 0 || versions > 2) {
        result.ranks.clear();
        result.error =
            "2bw needs enough microbatches per batch for the weight version "
            "of batch j+2 to exist when it starts (m >= p - 1 on a straight "
            "pipeline, thesis.md §3.1; m >= d(p - 1) for d parallel "
            "pipelines): got m = " +
            str(microbatches) + " with " + str(p) + " stages; stage " +
            str(rank.stage) + " replica " + str(rank.replica) +
            (versions < 0 ? " would run a forward before its weight version "
                            "exists"
                          : " would hold " + str(versions) + " versions");
        return result;
      }
    }
  }
  result.ok = true;
  return result;
}

std::vector<StageSchedule> generateSchedule(ScheduleKind kind, int stages,
                                            int64_t microbatches) {
  ScheduleResult result =
      generateSchedule(kind, stages, microbatches, ScheduleOptions());
  std::vector<StageSchedule> schedules;
  if (!result.ok)
    return schedules;
  for (RankSchedule &rank : result.ranks)
    schedules.push_back(std::move(rank.schedule));
  return schedules;
}

//===----------------------------------------------------------------------===//
// In-flight microbatches and weight versions
//===----------------------------------------------------------------------===//

namespace {

/// (microbatch, chunk) as one hashable key.
struct OpKey {
  int64_t microbatch;
  int chunk;
  bool operator==(const OpKey &o) const {
    return microbatch == o.microbatch && chunk == o.chunk;
  }
};

struct OpKeyHash {
  size_t operator()(const OpKey &k) const {
    return std::hash<int64_t>()(k.microbatch * 1000003 + k.chunk);
  }
};

} // namespace

int64_t peakInflight(const std::vector<SchedOp> &ops) {
  // A (microbatch, chunk) leaves at its last backward op: the W where the
  // program splits the backward, else the B.
  std::unordered_map<OpKey, size_t, OpKeyHash> lastBackward;
  for (size_t i = 0; i < ops.size(); ++i)
    if (ops[i].kind != PassKind::Forward)
      lastBackward[{ops[i].microbatch, ops[i].chunk}] = i;
  int64_t inflight = 0, peak = 0;
  std::unordered_map<OpKey, bool, OpKeyHash> live;
  for (size_t i = 0; i < ops.size(); ++i) {
    OpKey key{ops[i].microbatch, ops[i].chunk};
    if (ops[i].kind == PassKind::Forward) {
      if (live.emplace(key, true).second)
        peak = std::max(peak, ++inflight);
      continue;
    }
    auto it = lastBackward.find(key);
    if (it != lastBackward.end() && it->second == i && live.erase(key))
      --inflight;
  }
  return peak;
}

namespace {

/// The in-flight depth K and local microbatch count of one replica.
struct ReplicaShape {
  int64_t depth = 1;      ///< K_s
  int64_t depthFirst = 1; ///< K_0
  int64_t count = 0;      ///< local microbatches n
};

ReplicaShape replicaShape(ScheduleKind kind, int stages, int stage,
                          int64_t microbatches, const ScheduleOptions &options,
                          int replica) {
  ReplicaShape shape;
  std::vector<int> replicas = options.replicas;
  if (replicas.empty())
    replicas.assign(stages, 1);
  if (stage < 0 || stage >= stages ||
      static_cast<int>(replicas.size()) != stages)
    return shape;
  std::vector<int64_t> depth = depthsFor(kind, replicas, options);
  shape.depth = depth[stage];
  shape.depthFirst = depth[0];
  const int64_t steps = isFlushSchedule(kind) ? 1 : options.steps;
  shape.count = localCount(microbatches * steps, replica, replicas[stage]);
  return shape;
}

} // namespace

int64_t closedFormInflight(ScheduleKind kind, int stages, int stage,
                           int64_t microbatches, const ScheduleOptions &options,
                           int replica) {
  ReplicaShape shape =
      replicaShape(kind, stages, stage, microbatches, options, replica);
  const int64_t n = shape.count;
  switch (kind) {
  case ScheduleKind::GPipe:
    // GPipe stashes every microbatch, thesis.md §5.1.
    return n;
  case ScheduleKind::OneFOneBFlush:
  case ScheduleKind::OneFOneB:
  case ScheduleKind::TwoBW:
    // min(K_s, m): min(p - s, m) for policy A, thesis.md §5.2;
    // min(2(p - s) - 1, m) for policy B, dapple.md §6.1 invariant 14.
    return std::min(shape.depth, n);
  case ScheduleKind::ZeroBubbleH1:
    // K_s forwards plus d_s = K_0 - K_s microbatches waiting for their W:
    // min(p, m) on every stage of a straight pipeline.
    return std::min(std::max(shape.depth, shape.depthFirst), n);
  case ScheduleKind::ZeroBubbleH2:
    // Up to 2p - 1 microbatches held until their W on every stage.
    return std::min<int64_t>(2 * int64_t(stages) - 1, n);
  case ScheduleKind::Interleaved: {
    // min(W_r + 1, N_v) chunk-microbatches: 2(p-r-1) + (v-1)p + 1 when
    // m > p, m v when m == p (thesis.md §5.4).
    const int64_t totalOps = n * options.chunks;
    if (n == 0)
      return 0;
    return std::min(interleavedWarmup(stages, options.chunks, stage, n) + 1,
                    totalOps);
  }
  case ScheduleKind::ZeroBubbleV:
    // Chunk-microbatches: 2p (p microbatches of a whole device's layers,
    // 1F1B's activation memory) once m >= 2p - 1; with fewer microbatches
    // device r holds m + 1 + r (its chunk-0 warm-up plus the chunk-1
    // microbatches it started), at most all 2m. Checked against the
    // generator's programs for p <= 16, m <= 40 (schedule_test).
    return std::min({n + 1 + stage, 2 * n, int64_t(2) * stages});
  case ScheduleKind::DualPipeV:
    // Chunk-microbatches: 2p + 1 on every device (m >= 2p, the schedule's
    // requirement), one more than zb-v's 2p. Checked against the
    // generator's programs for p <= 12, m <= 40 (schedule_test).
    return 2 * int64_t(stages) + 1;
  case ScheduleKind::Custom:
    // Whatever the file says: no closed form.
    return -1;
  }
  return 0;
}

int64_t closedFormInflight(ScheduleKind kind, int stages, int stage,
                           int64_t microbatches) {
  return closedFormInflight(kind, stages, stage, microbatches,
                            ScheduleOptions(), 0);
}

int64_t peakWeightVersions(ScheduleKind kind, const std::vector<SchedOp> &ops,
                           int64_t microbatches) {
  if (isFlushSchedule(kind) || ops.empty() || microbatches < 1)
    return 1;
  const int64_t n = static_cast<int64_t>(ops.size());
  // created[v]: position of the op that creates version v (-1: initial).
  std::vector<int64_t> created{-1};
  std::unordered_map<int64_t, int64_t> versionOf; // microbatch -> version
  std::vector<int64_t> lastUse{-1};

  // 2bw: the backward of the last microbatch of batch j on this program
  // creates version j + 1.
  std::map<int64_t, int64_t> lastBackwardOfBatch;
  if (kind == ScheduleKind::TwoBW)
    for (int64_t i = 0; i < n; ++i)
      if (ops[i].kind != PassKind::Forward)
        lastBackwardOfBatch[ops[i].microbatch / microbatches] = i;

  for (int64_t i = 0; i < n; ++i) {
    const SchedOp &op = ops[i];
    if (op.kind == PassKind::Forward) {
      int64_t version;
      if (kind == ScheduleKind::OneFOneB) {
        // Weight stashing: the newest version, kept for the backward.
        version = static_cast<int64_t>(created.size()) - 1;
      } else {
        // 2bw: max(floor((k-1)/m) - 1, 0) for 1-indexed k (thesis.md §3.1).
        version = std::max<int64_t>(op.microbatch / microbatches - 1, 0);
        if (version >= static_cast<int64_t>(created.size()))
          return -1;
      }
      versionOf[op.microbatch] = version;
      lastUse[version] = i;
      continue;
    }
    auto it = versionOf.find(op.microbatch);
    if (it != versionOf.end())
      lastUse[it->second] = i;
    bool creates = false;
    if (kind == ScheduleKind::OneFOneB) {
      // PipeDream applies an update after every backward (§5.3).
      creates = true;
    } else {
      auto last = lastBackwardOfBatch.find(op.microbatch / microbatches);
      creates = last != lastBackwardOfBatch.end() && last->second == i;
    }
    if (creates) {
      created.push_back(i);
      lastUse.push_back(-1);
    }
  }

  // Version v is live after op i when created[v] <= i < release[v], with
  // release = max(last use, creation of v+1); the newest lives to the end.
  // Index i + 1 in `delta` is "after op i"; index 0 is "before any op".
  std::vector<int64_t> delta(n + 2, 0);
  const int64_t versions = static_cast<int64_t>(created.size());
  for (int64_t v = 0; v < versions; ++v) {
    int64_t release = v + 1 < versions ? std::max(lastUse[v], created[v + 1])
                                       : n;          // after the last op
    int64_t from = created[v] + 1, to = release + 1; // [from, to) in delta
    if (to <= from)
      continue;
    delta[from] += 1;
    delta[to] -= 1;
  }
  int64_t live = 0, peak = 0;
  for (int64_t i = 0; i <= n; ++i) {
    live += delta[i];
    peak = std::max(peak, live);
  }
  return peak;
}

int64_t closedFormWeightVersions(ScheduleKind kind, int stages, int stage,
                                 int64_t microbatches,
                                 const ScheduleOptions &options) {
  if (isFlushSchedule(kind))
    return 1;
  ReplicaShape shape =
      replicaShape(kind, stages, stage, microbatches, options, 0);
  const int64_t n = shape.count, depth = shape.depth;
  if (kind == ScheduleKind::TwoBW)
    // Batch j+1 still uses W^(j) when W^(j+1) appears (thesis.md §3.1).
    return options.steps >= 2 ? 2 : 1;
  // PipeDream: F(j) uses version u_j = max(0, j - K + 1) (it follows
  // B(j - K)); after the steady-state B(i), the in-flight j = i+1..i+K-1 and
  // the new version i+1 are live: min(i + 2, K) versions, K_s = p - s
  // (thesis.md Table 7.1) from i = K - 2 on. With n < K microbatches all
  // forwards use W^0 and each backward makes one more: 2.
  if (depth == 1 || n <= 1)
    return 1;
  if (n < depth)
    return 2;
  return std::min(depth, n - depth + 2);
}

std::vector<int64_t> pipedreamDepths(const std::vector<int> &replicas) {
  return inflightDepths(replicas, WarmupPolicy::A, 0);
}

} // namespace pipec
