//===- Synth.cpp - A schedule synthesiser ---------------------------------===//
//
// `--schedule synth`: an order of F, B (input gradient) and W (weight
// gradient) per stage of a straight pipeline, found for the stages' own
// times and a memory limit instead of taken from a paper (the zero-bubble
// paper's automatic scheduling, arXiv 2401.10241 §4, in its simplest form):
//
// 1. List scheduling. The stages run in simulated time; a stage that falls
//    idle takes, among the ops it can start now, the backward (B) of its
//    oldest microbatch whose gradient has arrived, else the next forward
//    if its input has arrived and fewer than K_s microbatches are in
//    flight (forward run, W not yet), else its oldest pending W, else it
//    waits for the next arrival. W fills the gaps that a forward or a
//    backward would leave idle; the in-flight cap K_s bounds the stash.
// 2. Candidates. The greedy order for every warm-up cap from 1F1B's
//    (p - s) to the memory cap, once with W deferred as above and once
//    with W right after its B, plus the fixed schedules (gpipe, 1f1b-flush
//    with policies A and B, zb-h1, zb-h2) whose in-flight peak fits.
// 3. Every candidate is checked (one F/B/W per microbatch, deadlock free)
//    and scored by the simulator (simulateSchedule); the fastest wins. So
//    the result is never slower than the best fixed schedule that fits.
//
//===----------------------------------------------------------------------===//

#include "pipec/Sim.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <queue>

namespace pipec {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

/// The greedy list scheduler over stage times (seconds per microbatch).
class ListScheduler {
public:
  ListScheduler(const std::vector<double> &f, const std::vector<double> &b,
                const std::vector<double> &w, const std::vector<double> &comm,
                const std::vector<int64_t> &caps, int64_t m, bool deferW)
      : f(f), b(b), w(w), comm(comm), caps(caps), m(m), deferW(deferW),
        p(int(f.size())) {}

  ScheduleResult run() {
    const double inf = std::numeric_limits<double>::infinity();
    state.assign(size_t(p), {});
    for (Stage &st : state) {
      st.inputAt.assign(size_t(m), inf);
      st.gradAt.assign(size_t(m), inf);
    }
    for (int64_t k = 0; k < m; ++k)
      state[0].inputAt[size_t(k)] = 0;
    // Advance the stage that is free earliest, one op at a time.
    int64_t opsLeft = int64_t(p) * m * 3;
    while (opsLeft > 0) {
      int bestStage = -1;
      double bestStart = inf;
      Choice bestChoice{};
      for (int s = 0; s < p; ++s) {
        Choice c = choose(s);
        if (c.kind < 0)
          continue;
        if (c.start < bestStart) {
          bestStart = c.start;
          bestStage = s;
          bestChoice = c;
        }
      }
      if (bestStage < 0)
        break; // nothing can ever start: reported by the checks below
      apply(bestStage, bestChoice);
      --opsLeft;
    }
    ScheduleResult result;
    result.ok = opsLeft == 0;
    if (!result.ok)
      result.error = "the list scheduler stalled";
    result.kind = ScheduleKind::Custom;
    result.stages = p;
    result.microbatches = m;
    result.replicas.assign(size_t(p), 1);
    for (int s = 0; s < p; ++s)
      result.ranks.push_back({s, 0, StageSchedule{{{state[s].ops, 1, 1}}}});
    return result;
  }

private:
  struct Stage {
    double freeAt = 0;
    int64_t nextF = 0, inflight = 0;
    std::vector<double> inputAt, gradAt;
    std::vector<int64_t> waitingB; ///< forwarded, backward not run
    std::vector<int64_t> pendingW; ///< backward run, W not run
    std::vector<SchedOp> ops;
  };
  struct Choice {
    int kind = -1; ///< 0 F, 1 B, 2 W
    int64_t k = 0;
    double start = 0;
  };

  const std::vector<double> &f, &b, &w, &comm;
  const std::vector<int64_t> &caps;
  const int64_t m;
  const bool deferW;
  const int p;
  std::vector<Stage> state;

  /// The op stage s runs next and when it can start.
  Choice choose(int s) const {
    const Stage &st = state[size_t(s)];
    const double inf = std::numeric_limits<double>::infinity();
    // Earliest arrival of a B's gradient and of the next F's input.
    double bAt = inf;
    int64_t bK = -1;
    for (int64_t k : st.waitingB)
      if (st.gradAt[size_t(k)] < bAt) {
        bAt = st.gradAt[size_t(k)];
        bK = k;
      }
    const bool fAllowed = st.nextF < m && st.inflight < caps[size_t(s)];
    const double fAt = fAllowed ? st.inputAt[size_t(st.nextF)] : inf;
    const double now = st.freeAt;
    if (!deferW && !st.pendingW.empty())
      return {2, st.pendingW.front(), now};
    // What can start right now, by priority B, F, W.
    if (bK >= 0 && bAt <= now)
      return {1, bK, now};
    if (fAllowed && fAt <= now)
      return {0, st.nextF, now};
    if (!st.pendingW.empty())
      return {2, st.pendingW.front(), now};
    // Nothing now: the first arrival (a backward first on a tie).
    if (bK >= 0 && bAt <= fAt && bAt < inf)
      return {1, bK, bAt};
    if (fAllowed && fAt < inf)
      return {0, st.nextF, fAt};
    return {};
  }

  void apply(int s, const Choice &c) {
    Stage &st = state[size_t(s)];
    double end = 0;
    if (c.kind == 0) {
      end = c.start + f[size_t(s)];
      st.ops.push_back({PassKind::Forward, c.k, 0});
      ++st.nextF;
      ++st.inflight;
      if (s + 1 < p)
        state[size_t(s + 1)].inputAt[size_t(c.k)] = end + comm[size_t(s)];
      else
        st.gradAt[size_t(c.k)] = end; // the loss seeds its own backward
      st.waitingB.push_back(c.k);
    } else if (c.kind == 1) {
      end = c.start + b[size_t(s)];
      st.ops.push_back({PassKind::Backward, c.k, 0});
      st.waitingB.erase(std::find(st.waitingB.begin(), st.waitingB.end(), c.k));
      st.pendingW.push_back(c.k);
      if (s > 0)
        state[size_t(s - 1)].gradAt[size_t(c.k)] = end + comm[size_t(s - 1)];
    } else {
      end = c.start + w[size_t(s)];
      st.ops.push_back({PassKind::BackwardWeight, c.k, 0});
      st.pendingW.erase(st.pendingW.begin());
      --st.inflight;
    }
    st.freeAt = end;
  }
};

/// A fixed schedule as a custom one (the simulator scores it the same).
ScheduleResult asCustom(ScheduleResult s) {
  s.kind = ScheduleKind::Custom;
  return s;
}

bool withinCaps(const ScheduleResult &s, const std::vector<int64_t> &caps) {
  for (const RankSchedule &r : s.ranks)
    if (peakInflight(r.schedule.flatten()) > caps[size_t(r.stage)])
      return false;
  return true;
}

/// A generated schedule with every backward split into B then W, so that
/// all candidates run on the same (split) stage functions.
ScheduleResult splitEveryBackward(ScheduleResult s) {
  for (RankSchedule &r : s.ranks)
    for (Segment &seg : r.schedule.segments) {
      std::vector<SchedOp> body;
      for (const SchedOp &op : seg.body) {
        body.push_back(op);
        if (op.kind == PassKind::Backward)
          body.push_back({PassKind::BackwardWeight, op.microbatch, op.chunk});
      }
      seg.body = body;
    }
  return s;
}

} // namespace

SynthResult synthesizeSchedule(const Profile &profile, const Topology &topology,
                               const Plan &plan,
                               const std::vector<int64_t> &caps,
                               const SimOptions &options) {
  SynthResult result;
  auto fail = [&](const std::string &why) {
    result.error = why;
    return result;
  };
  const int p = plan.numStages();
  const int64_t m = plan.microbatches;
  if (plan.chunks != 1 || p < 1 || m < 1)
    return fail("the synthesiser plans a straight pipeline (one chunk per "
                "device, at least one stage and one microbatch)");
  for (const StagePlan &s : plan.stages)
    if (s.replicas != 1)
      return fail("the synthesiser plans one rank per stage (no replicas)");
  if (int(caps.size()) != p)
    return fail("one in-flight cap per stage expected (" +
                str(int64_t(caps.size())) + " for " + str(p) + ")");
  for (int s = 0; s < p; ++s)
    if (caps[size_t(s)] < 1)
      return fail("stage " + str(s) +
                  " cannot hold even one microbatch in the memory limit");
  // Stage times, as the simulator will charge them.
  const double sigma = double(plan.microbatchSize) /
                       double(std::max<int64_t>(profile.microbatch, 1));
  const double alpha = options.weightGradFraction;
  std::vector<double> f(static_cast<size_t>(p), 0.0), b = f, w = f, comm = f;
  for (int s = 0; s < p; ++s) {
    double fwd = 0, bwd = 0;
    for (int l = plan.stages[size_t(s)].firstLayer;
         l <= plan.stages[size_t(s)].lastLayer; ++l) {
      fwd += profile.ops[size_t(l)].fwdSeconds;
      bwd += profile.ops[size_t(l)].bwdSeconds;
    }
    f[size_t(s)] = sigma * fwd;
    b[size_t(s)] = sigma * (1 - alpha) * bwd;
    w[size_t(s)] = sigma * alpha * bwd;
    if (s + 1 < p && !plan.stages[size_t(s)].devices.empty() &&
        !plan.stages[size_t(s + 1)].devices.empty()) {
      const int64_t bytes = int64_t(
          sigma *
          double(
              profile.ops[size_t(plan.stages[size_t(s)].lastLayer)].outBytes));
      double seconds =
          topology.p2pSeconds(bytes, plan.stages[size_t(s)].devices.front(),
                              plan.stages[size_t(s + 1)].devices.front());
      comm[size_t(s)] = std::isfinite(seconds) ? seconds : 0;
    }
  }
  // Candidates.
  std::vector<std::pair<std::string, ScheduleResult>> candidates;
  int64_t maxCap = 0;
  for (int64_t c : caps)
    maxCap = std::max(maxCap, c);
  for (int64_t extra = 0;; ++extra) {
    std::vector<int64_t> k(static_cast<size_t>(p), 0);
    bool grew = false;
    for (int s = 0; s < p; ++s) {
      int64_t want = int64_t(p - s) + extra;
      k[size_t(s)] = std::min({want, caps[size_t(s)], m});
      grew |= want <= std::min(caps[size_t(s)], m);
    }
    for (bool deferW : {true, false}) {
      ScheduleResult s = ListScheduler(f, b, w, comm, k, m, deferW).run();
      if (s.ok)
        candidates.push_back(
            {"list(K=p-s+" + str(extra) + (deferW ? ")" : ", W at once)"), s});
    }
    if (!grew || extra > maxCap)
      break;
  }
  struct Fixed {
    const char *name;
    ScheduleKind kind;
    WarmupPolicy warmup;
  };
  for (const Fixed &fx :
       {Fixed{"gpipe", ScheduleKind::GPipe, WarmupPolicy::A},
        Fixed{"1f1b-flush", ScheduleKind::OneFOneBFlush, WarmupPolicy::A},
        Fixed{"1f1b-flush B", ScheduleKind::OneFOneBFlush, WarmupPolicy::B},
        Fixed{"zb-h1", ScheduleKind::ZeroBubbleH1, WarmupPolicy::A},
        Fixed{"zb-h2", ScheduleKind::ZeroBubbleH2, WarmupPolicy::A}}) {
    ScheduleOptions o;
    o.warmup = fx.warmup;
    ScheduleResult s = generateSchedule(fx.kind, p, m, o);
    if (!s.ok)
      continue;
    if (fx.kind != ScheduleKind::ZeroBubbleH1 &&
        fx.kind != ScheduleKind::ZeroBubbleH2)
      s = splitEveryBackward(s);
    candidates.push_back({fx.name, asCustom(s)});
  }
  // Score.
  Plan custom = plan;
  custom.schedule = "custom";
  const SynthCandidate *best = nullptr;
  for (auto &[name, schedule] : candidates) {
    SynthCandidate c;
    c.name = name;
    c.schedule = schedule;
    c.peakInflight.clear();
    for (const RankSchedule &r : schedule.ranks)
      c.peakInflight.push_back(peakInflight(r.schedule.flatten()));
    CommCheckResult check = checkCommunication(scheduleCommPrograms(schedule));
    if (!check.ok) {
      c.note = "not deadlock free: " + check.errors.front();
    } else if (!withinCaps(schedule, caps)) {
      c.note = "over the memory limit";
    } else {
      SimResult sim =
          simulateSchedule(profile, topology, custom, schedule, options);
      if (!sim.ok) {
        c.note = "simulation failed: " + sim.error;
      } else {
        c.iterationSeconds = sim.iterationSeconds;
        c.feasible = true;
      }
    }
    result.candidates.push_back(std::move(c));
  }
  for (const SynthCandidate &c : result.candidates)
    if (c.feasible && (!best || c.iterationSeconds < best->iterationSeconds))
      best = &c;
  if (!best) {
    std::string list;
    for (int64_t c : caps)
      list += " " + str(c);
    return fail("no schedule fits the memory limit (in-flight caps" + list +
                ")");
  }
  result.ok = true;
  result.best = *best;
  return result;
}

} // namespace pipec
