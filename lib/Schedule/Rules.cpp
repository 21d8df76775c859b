//===- Rules.cpp - the schedule and replica rules, in one place -----------===//
//
// Every rule about which pipelines can be built (microbatches, chunks,
// replicas, split samples, warm-up policy, tied weights, 2BW's depth) is
// stated here once. The driver (pipec compile, before importing), the
// schedule pass (--pipe-build-schedule) and the pipeline verifier call
// checkPipelineRules and report what it returns; none restates a rule.
//
//===----------------------------------------------------------------------===//
#include "pipec/Schedule.h"

#include <algorithm>
#include <set>

namespace pipec {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

struct Checker {
  const PipelineRequest &q;
  std::vector<RuleViolation> out;
  const std::string name = scheduleKindName(q.kind);
  const bool continuous = !isFlushSchedule(q.kind);

  void add(const char *rule, std::string message) {
    out.push_back({rule, std::move(message)});
  }
  bool replicated() const {
    return std::any_of(q.replicas.begin(), q.replicas.end(),
                       [](int r) { return r != 1; });
  }

  void shape() {
    if (q.kind == ScheduleKind::ZeroBubbleV &&
        (replicated() || q.splitSamples > 0))
      add("zb-v", "zb-v runs one rank per device position: drop the "
                  "replicas or use zb-h1 / 1f1b-flush");
    if (q.kind == ScheduleKind::DualPipeV &&
        (replicated() || q.splitSamples > 0))
      add("dualpipev", "dualpipev runs one rank per device position: drop "
                       "the replicas or use zb-h1 / 1f1b-flush");
    if (q.kind == ScheduleKind::DualPipeV && q.chunks == 2 &&
        q.microbatches >= 1 && q.microbatches < q.stages)
      add("dualpipev-microbatches",
          "dualpipev needs at least 2p microbatches for its p devices (its "
          "phases assume them): got m = " +
              str(q.microbatches) + " for p = " + str(q.stages / 2) +
              "; use --microbatches " + str(q.stages) + " or zb-v");
    if (q.kind == ScheduleKind::ZeroBubbleH2 &&
        (replicated() || q.splitSamples > 0))
      add("zb-h2", "zb-h2 is generated for a straight pipeline (one rank "
                   "per stage): drop the replicas or use zb-h1 / 1f1b-flush");
    if (q.microbatches < 1)
      add("microbatches", "the number of microbatches must be at least 1 "
                          "(got " + str(q.microbatches) + ")");
    if (q.chunks < 1)
      add("chunks", "the number of chunks per device must be at least 1 (got " +
                        str(q.chunks) + ")");
    else if ((q.kind == ScheduleKind::ZeroBubbleV ||
              q.kind == ScheduleKind::DualPipeV) &&
             q.chunks != 2)
      add("chunks", name +
                        " places exactly two chunks per device in a V "
                        "(chunks 2: device r runs stages r and 2p-1-r); "
                        "got v = " +
                        str(q.chunks));
    else if (q.chunks > 1 && q.kind != ScheduleKind::Interleaved &&
             q.kind != ScheduleKind::Custom &&
             q.kind != ScheduleKind::ZeroBubbleV &&
             q.kind != ScheduleKind::DualPipeV)
      add("chunks", "only the interleaved schedule runs several chunks per "
                    "device; got v = " + str(q.chunks) + " for " + name);
    else if (q.stages % q.chunks != 0)
      add("chunks-divide",
          "the interleaved schedule places " + str(q.chunks) +
              " chunks on every device, but the model has " + str(q.stages) +
              " stages (plan p x v = " + str(q.stages) + " stages for v = " +
              str(q.chunks) + ")");
  }

  /// False when the replica counts cannot be read per stage.
  bool replicaCount(int64_t devices) {
    if (!q.replicas.empty() && int64_t(q.replicas.size()) != devices) {
      add("replica-count", "replicas lists " + str(q.replicas.size()) +
                               " counts for " + str(devices) +
                               " stages (give one count per stage)");
      return false;
    }
    for (size_t s = 0; s < q.replicas.size(); ++s)
      if (q.replicas[s] < 1) {
        add("replica-count", "stage " + str(s) + " has " +
                                 str(q.replicas[s]) +
                                 " replicas (must be at least 1)");
        return false;
      }
    return true;
  }

  void replicaModes() {
    const bool split = q.splitSamples > 0;
    if (q.splitSamples < 0)
      add("split-samples",
          "split-samples must be >= 0, got " + str(q.splitSamples));
    // (zb-v and dualpipev, also of two chunks, refuse replicas in shape().)
    if (q.kind == ScheduleKind::Interleaved && q.chunks > 1 && replicated() &&
        !split)
      add("split-samples",
          "replicated stages combine with the interleaved schedule in the "
          "split replica mode only (--replica-mode split: every replica runs "
          "a slice of every microbatch); 1F1B-RR's round robin is not "
          "interleaved");
    if (q.kind == ScheduleKind::Custom && (replicated() || split))
      add("custom",
          "a schedule read from a file (the custom schedule) runs one rank "
          "per stage: its order names no replicas; drop the replicas or "
          "use a generated schedule");
    if (continuous && split)
      add("split-samples",
          "split replicas (every replica runs a slice of every microbatch) "
          "need a synchronous schedule, not '" + name +
              "'; the continuous schedules replicate stages round robin "
              "(1F1B-RR)");
    if (continuous && replicated() && q.microbatches >= 1)
      for (size_t s = 0; s < q.replicas.size(); ++s)
        if (q.replicas[s] > 0 && q.microbatches % q.replicas[s] != 0) {
          add("round-robin",
              "schedule '" + name +
                  "' with replicas needs the microbatches per step (" +
                  str(q.microbatches) +
                  ") to be a multiple of every stage's replica count; stage " +
                  str(s) + " has " + str(q.replicas[s]) +
                  " (1F1B-RR: each replica runs one microbatch of every round "
                  "of r, and the replicas update together after each round)");
          break;
        }
    for (size_t s = 0; s < q.replicas.size(); ++s) {
      int r = q.replicas[s];
      if (split && r > q.splitSamples) {
        add("replica-range",
            "stage " + str(s) + " has " + str(r) +
                " replicas; each replica needs at least one of the " +
                str(q.splitSamples) +
                " samples of a microbatch (split replicas: replica j runs "
                "samples [j*b/r, (j+1)*b/r) of every microbatch)");
        return;
      }
      if (!split && r > q.microbatches) {
        add("replica-range",
            "stage " + str(s) + " has " + str(r) +
                " replicas; each replica needs at least one of the " +
                str(q.microbatches) +
                " microbatches (1F1B-RR: microbatch k runs on replica k mod r)");
        return;
      }
    }
  }

  /// Megatron's interleaved schedule: m a multiple of the pipeline depth
  /// (thesis.md §4.1), of depth x replicas with round-robin replicas, which
  /// must then be the same on every stage.
  void interleaved(int64_t devices) {
    if (q.kind != ScheduleKind::Interleaved || q.microbatches < 1)
      return;
    // Round-robin replicas already refused with the interleaved schedule.
    if (std::any_of(out.begin(), out.end(), [](const RuleViolation &v) {
          return v.rule == "split-samples";
        }))
      return;
    const bool split = q.splitSamples > 0;
    const int d = !split && !q.replicas.empty() ? q.replicas[0] : 1;
    if (!split)
      for (size_t s = 1; s < q.replicas.size(); ++s)
        if (q.replicas[s] != d) {
          add("interleaved",
              "the interleaved schedule needs the same replica count on "
              "every stage (stage 0 has " + str(d) + ", stage " + str(s) +
                  " has " + str(q.replicas[s]) + ")");
          return;
        }
    if (q.microbatches % (int64_t(d) * devices) == 0)
      return;
    if (d == 1)
      add("interleaved",
          "the interleaved schedule needs the number of microbatches (" +
              str(q.microbatches) +
              ") to be a multiple of the pipeline depth p = " + str(devices) +
              " (Megatron's rule, thesis.md §4.1)");
    else
      add("interleaved",
          "the interleaved schedule needs the number of microbatches (" +
              str(q.microbatches) +
              ") to be a multiple of the pipeline depth times the replicas, " +
              str(devices) + " x " + str(d) + " (Megatron's rule per replica)");
  }

  void warmup() {
    if (q.warmup == WarmupPolicy::B && q.kind != ScheduleKind::OneFOneBFlush)
      add("warmup", "warm-up policy B applies to 1f1b-flush only");
  }

  void tied(int64_t devices) {
    for (const auto &[weight, stages] : q.tied) {
      if (stages.size() < 2) {
        add("tied", "pipe.tied entry '" + weight +
                        "' needs at least two stages");
        continue;
      }
      if (auto bad = std::find_if(
              stages.begin(), stages.end(),
              [&](int64_t st) { return st < 0 || st >= q.stages; });
          bad != stages.end()) {
        add("tied", "pipe.tied entry '" + weight + "' names stage " +
                        str(*bad) + " of a pipeline of " + str(q.stages) +
                        " stages");
        continue;
      }
      std::string where = "weight '" + weight + "' is read by stages " +
                          str(stages.front()) + " and " + str(stages.back());
      if (continuous) {
        add("tied",
            where + " (tied weights); schedule '" + name +
                "' updates stages at different times, so their "
                "copies would drift: use a synchronous schedule "
                "(gpipe, 1f1b-flush, zb-h1, zb-h2), or a plan that keeps "
                "the tied layers in one stage");
        continue;
      }
      // Stage q runs on device q mod p (interleaved) or in a V (zb-v); two
      // tied stages on one device would make it hold two copies.
      std::set<int64_t> positions;
      for (int64_t st : stages) {
        const int64_t at = positionOfStage(q.placement, devices, st);
        if (devices > 0 && !positions.insert(at).second) {
          add("tied", where + " (tied weights), and schedule '" + name +
                          "' places two of those stages on device " + str(at) +
                          "; choose --stages and --chunks so that they land "
                          "on different devices");
          break;
        }
      }
    }
  }

  /// 2BW: the forwards of batch j read version j - 1, made after the last
  /// backward of batch j - 1; a replica's backwards trail its forwards by
  /// K_s - 1 of its own microbatches, of which it runs m / r_s per batch.
  void twoBWDepth(int64_t devices) {
    if (q.kind != ScheduleKind::TwoBW || q.microbatches < 1)
      return;
    std::vector<int> replicas = q.replicas;
    if (replicas.empty())
      replicas.assign(size_t(devices), 1);
    if (std::any_of(replicas.begin(), replicas.end(),
                    [](int r) { return r < 1; }))
      return;
    const std::vector<int64_t> depth = pipedreamDepths(replicas);
    for (size_t st = 0; st < replicas.size(); ++st) {
      int64_t r = replicas[st];
      if (q.microbatches / r >= depth[st] - 1)
        continue;
      if (!replicated())
        add("2bw-depth",
            "schedule '2bw' needs at least p - 1 = " + str(devices - 1) +
                " microbatches per batch for " + str(devices) +
                " stages, got " + str(q.microbatches) +
                " (a forward would need a weight version that is not created "
                "yet; papers/thesis.md §3.1)");
      else
        add("2bw-depth",
            "schedule '2bw': stage " + str(st) + " (" + str(r) +
                (r == 1 ? " replica" : " replicas") + ") runs " +
                str(q.microbatches / r) +
                " microbatches per replica and batch but trails its forwards "
                "by K - 1 = " + str(depth[st] - 1) + " of them; use at least " +
                str(r * (depth[st] - 1)) +
                " microbatches per batch (a forward would need a weight "
                "version that is not created yet; papers/thesis.md §3.1)");
      return;
    }
  }
};

} // namespace

namespace {
int64_t devicesOf(const PipelineRequest &q) {
  return q.chunks >= 1 && q.stages % q.chunks == 0 ? q.stages / q.chunks
                                                   : q.stages;
}
} // namespace

std::vector<RuleViolation> checkScheduleShape(const PipelineRequest &request) {
  Checker c{request, {}};
  c.shape();
  if (c.replicaCount(devicesOf(request)))
    c.interleaved(devicesOf(request));
  return c.out;
}

std::vector<RuleViolation> checkPipelineRules(const PipelineRequest &request) {
  Checker c{request, {}};
  const int64_t devices = devicesOf(request);
  c.shape();
  if (c.replicaCount(devices)) {
    c.replicaModes();
    c.interleaved(devices);
  }
  c.warmup();
  c.tied(devices);
  if (c.out.empty())
    c.twoBWDepth(devices);
  return c.out;
}

std::string describeViolations(const std::vector<RuleViolation> &violations) {
  std::string text;
  for (const RuleViolation &v : violations)
    text += (text.empty() ? "" : "\n") + v.message;
  return text;
}

} // namespace pipec
