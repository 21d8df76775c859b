//===- Schedule.h - Pipeline schedule generators and checks -----*- C++ -*-===//
//
// Static pipeline schedules (DESIGN.md §5, papers/thesis.md §5) as per-stage
// programs of forward/backward ops, plus a message-level simulator that
// checks a set of rank programs for matching sends/receives and deadlock.
// Plain C++, no MLIR.
//
//===----------------------------------------------------------------------===//
#ifndef PIPEC_SCHEDULE_H
#define PIPEC_SCHEDULE_H

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace pipec {

/// The schedules of the papers (DESIGN.md §5, papers/thesis.md §5):
///   GPipe          "gpipe"       all forwards, all backwards, flush (§5.1)
///   OneFOneBFlush  "1f1b-flush"  PipeDream-Flush / DAPPLE, warm-up policies
///                                A and B (§5.2, dapple.md §3.3)
///   OneFOneB       "1f1b"        PipeDream: continuous 1F1B, no flush,
///                                weight stashing (§5.3, pipedream.md §3-4)
///   TwoBW          "2bw"         PipeDream-2BW: continuous 1F1B, a new weight
///                                version every m microbatches (§3.1)
///   Interleaved    "interleaved" Megatron interleaved 1F1B, v chunks per
///                                device (§4.2, §5.4)
///   ZeroBubbleH1   "zb-h1"       1F1B with the backward split into B (input
///                                gradient) and W (weight gradient); W is
///                                deferred into the cool-down (Qi et al. 2023)
///   ZeroBubbleV    "zb-v"        zero bubble in a V (Qi et al. 2024): two
///                                chunks per device placed as a V (device r
///                                holds stages r and 2p-1-r), backwards split
///                                into B and W, 1F1B-like memory
///   ZeroBubbleH2   "zb-h2"       zero bubble with more memory (Qi et al.
///                                2023, ZB-H2): backwards split like zb-h1,
///                                up to 2p - 1 microbatches in flight on
///                                every stage, W ops deferred so that the
///                                last backwards reach the first stage
///                                without waiting; straight pipelines only
///   DualPipeV      "dualpipev"   DeepSeek's DualPipeV (the cut-in-half
///                                DualPipe): two chunks per device in a V as
///                                zb-v, its eight phases with forward and
///                                backward pairs of the two chunks, backwards
///                                split as zb-h1 where it defers W; m >= 2p
///   Custom         "custom"      synchronous (one flush per step), with the
///                                per-rank order read from a file: a
///                                torch.distributed.pipelining compute-only
///                                CSV (parseScheduleCsv, `pipec compile
///                                --schedule-csv`); no generator, no closed
///                                forms
enum class ScheduleKind {
  GPipe,
  OneFOneBFlush,
  OneFOneB,
  TwoBW,
  Interleaved,
  ZeroBubbleH1,
  Custom,
  ZeroBubbleV,
  ZeroBubbleH2,
  DualPipeV
};

/// Parses "gpipe" / "1f1b-flush" / "1f1b" / "2bw" / "interleaved" / "zb-h1"
/// / "custom" / "zb-v" / "zb-h2" / "dualpipev"; nullopt for anything
/// else.
std::optional<ScheduleKind> parseScheduleKind(const std::string &name);
const char *scheduleKindName(ScheduleKind kind);
/// Every accepted name, in declaration order, e.g. for "available: ..."
/// messages.
std::vector<std::string> scheduleKindNames();
/// True for the synchronous schedules that end each step with a flush
/// (gpipe, 1f1b-flush, interleaved, zb-h1, zb-h2, zb-v, dualpipev, custom);
/// false for 1f1b and 2bw,
/// which run batches back to back.
bool isFlushSchedule(ScheduleKind kind);

/// Where virtual stage q of a pipeline of p device positions and v chunks
/// runs:
///   Loop  on position q mod p, as chunk q div p (Megatron's interleaving;
///         every schedule but zb-v)
///   V     v = 2: position r holds stage r (chunk 0) and stage 2p-1-r
///         (chunk 1), so the last stage shares the first one's device
///         (zb-v, DualPipeV, torch's ZBVZeroBubble)
enum class Placement { Loop, V };

/// "loop" / "v".
const char *placementName(Placement placement);
std::optional<Placement> parsePlacement(const std::string &name);
/// The placement a generated schedule uses (V for zb-v).
Placement placementOf(ScheduleKind kind);
/// Device position of virtual stage q.
int64_t positionOfStage(Placement placement, int64_t p, int64_t q);
/// Chunk index of virtual stage q on its device.
int64_t chunkOfStage(Placement placement, int64_t p, int64_t q);
/// The virtual stage that chunk c of device position r runs.
int64_t stageOfChunk(Placement placement, int64_t p, int64_t r, int64_t c);

/// Forward, backward and, for zero-bubble schedules, the weight-gradient half
/// of the backward. Without BackwardWeight ops, Backward computes both input
/// and weight gradients; with them, Backward is the input gradient only.
enum class PassKind { Forward, Backward, BackwardWeight };

/// One forward or backward of a microbatch on one model chunk. In a Segment,
/// `microbatch` is the value at trip 0 and grows by the segment's stride
/// (1 unless stated otherwise) every trip. `chunk` is the virtual-stage chunk
/// c of the device (interleaved: virtual stage c*p + r on device r); 0 for
/// every other schedule.
struct SchedOp {
  PassKind kind;
  int64_t microbatch;
  int chunk = 0;
  bool operator==(const SchedOp &o) const {
    return kind == o.kind && microbatch == o.microbatch && chunk == o.chunk;
  }
};

/// `trips` repetitions of `body` (a counted loop in the generated program).
/// Trip t runs the body with every microbatch index increased by
/// t * stride.
struct Segment {
  std::vector<SchedOp> body;
  int64_t trips = 0;
  /// Microbatch increment per trip: 1 for the plain schedules; p for the
  /// interleaved steady state (a period of p*v ops covers p microbatches);
  /// multiplied by r on a stage replica of a stage with r replicas
  /// (replica j runs microbatches j, j+r, j+2r, ...).
  int64_t stride = 1;
};

/// The schedule of one stage (or one stage replica, or one device of an
/// interleaved pipeline) for one training step (one flush); for 1f1b and
/// 2bw, for all the steps requested.
struct StageSchedule {
  std::vector<Segment> segments;
  /// Loops expanded into the flat op order.
  std::vector<SchedOp> flatten() const;
};

/// Generates the per-stage programs of `kind` for `stages` stages and
/// `microbatches` microbatches with default ScheduleOptions:
///   gpipe:      F0..F(m-1), B0..B(m-1)
///   1f1b-flush: w = min(p-s-1, m) warm-up forwards, m-w {F, B} pairs,
///               w cool-down backwards (thesis.md §5.2)
///   1f1b, 2bw:  the same order for one batch (see ScheduleOptions::steps)
///   zb-h1:      the 1f1b-flush order with W ops (see generateSchedule below)
///   zb-h2:      2(p-s)-1 warm-up forwards, 1F1B pairs up to 2p-1 in
///               flight, {B, W, F} triples, deferred W ops at the end (see
///               generateSchedule below)
///   interleaved with one chunk
/// Returns an empty vector for stages < 1, microbatches < 1 or a request the
/// kind cannot satisfy (use the ScheduleResult overload for the reason).
std::vector<StageSchedule> generateSchedule(ScheduleKind kind, int stages,
                                            int64_t microbatches);

/// DAPPLE's warm-up depth K_i, the forwards a 1f1b-flush stage runs before
/// its first backward (dapple.md §3.3), with S = p pipeline stages:
///   A: K_s = min(p - s, D)         (warm-up w = K_s - 1 = p - s - 1)
///   B: K_s = min(2(p - s) - 1, D)  (warm-up w = 2(p - s - 1))
/// D is ScheduleOptions::maxInflight (unbounded when 0). A suits small
/// communication-to-compute ratios, B hides communication comparable to
/// compute.
enum class WarmupPolicy { A, B };

struct ScheduleOptions {
  /// v, virtual chunks per device; only the interleaved schedule takes
  /// v > 1.
  int chunks = 1;
  /// 1f1b-flush warm-up policy.
  WarmupPolicy warmup = WarmupPolicy::A;
  /// D of DAPPLE's K_i (microbatches that fit in memory); 0 = unbounded.
  /// Applies to 1f1b-flush only.
  int64_t maxInflight = 0;
  /// Batches of `microbatches` microbatches each that 1f1b and 2bw run back
  /// to back in one program (microbatch ids 0 .. steps*m-1, no flush in
  /// between). Must be 1 for the flush schedules.
  int64_t steps = 1;
  /// Replicas per pipeline stage (1F1B-RR: microbatch k runs on replica
  /// k mod r of every stage, pipedream.md §3); empty = one each. For the
  /// interleaved schedule, all stages must have the same count d and
  /// m % (d*p) == 0.
  std::vector<int> replicas;
};

/// The program of one rank: one replica of one pipeline stage (for the
/// interleaved schedule, one replica of one device position r, holding the
/// chunks c = 0..v-1, i.e. virtual stages c*p + r). Microbatch ids are
/// global: replica j of a stage with r replicas sees j, j+r, j+2r, ...
struct RankSchedule {
  int stage = 0;
  int replica = 0;
  StageSchedule schedule;
};

struct ScheduleResult {
  bool ok = false;
  /// Why the request is impossible, e.g. "interleaved schedule needs the
  /// number of microbatches (6) to be a multiple of the pipeline depth (4)".
  std::string error;
  ScheduleKind kind = ScheduleKind::GPipe;
  int stages = 0;           ///< p (devices per pipeline, not p*v)
  int chunks = 1;           ///< v
  /// How chunks map to virtual stages (SchedOp::chunk c of rank position r
  /// is stage stageOfChunk(placement, p, r, c)).
  Placement placement = Placement::Loop;
  int64_t microbatches = 0; ///< m per step
  int64_t steps = 1;
  std::vector<int> replicas; ///< per stage, always filled
  /// Stage-major, replica-minor: ranks of stage s are consecutive.
  std::vector<RankSchedule> ranks;
  /// Index into `ranks` of (stage, replica), or -1.
  int rankOf(int stage, int replica) const;
};

/// Generates every rank program of `kind`. Errors come back as text: stages
/// or microbatches < 1, chunks > 1 for a schedule other than interleaved,
/// interleaved with m % p != 0 (Megatron's rule), 2bw with m < p - 1 (a
/// forward would need a weight version not created yet, thesis.md §3.1),
/// steps > 1 for a flush schedule, replica counts < 1 or of the wrong
/// length.
///
/// Per-rank warm-up (forwards before the first backward, K - 1 with K the
/// in-flight depth) with replicas: let W_s = sum_{t>=s} r_t be the workers
/// from stage s on; then K_s = ceil(W_s / r_s), which is p - s for a
/// straight pipeline and NOAM = ceil(workers / r_0) on the input stage
/// (pipedream.md §3); policy B uses ceil(2 W_s / r_s) - 1. zb-h1 defers
/// d_s = K_0 - K_s weight-gradient ops (s for a straight pipeline): after
/// each B, a W runs for the oldest pending microbatch once more than d_s
/// are pending; the last d_s W ops end the step. zb-h2 (straight
/// pipelines) is the list schedule of every stage's F, B and W ops at one
/// time unit each, B first, then F while fewer than min(2p - 1, m)
/// microbatches are in flight, then W: 2(p - s) - 1 warm-up forwards,
/// 1F1B pairs, B W F triples, and the W ops it deferred while the last
/// backwards come up the pipeline; with F = B = W no stage waits once it
/// has started (3m + p - 1 units, ZB-H1's 3m + (p - 1)(F + B - W) at
/// W = F = B; better than ZB-H1 when W is shorter), for 2p - 1 microbatches
/// of memory on every stage instead of p (Qi et al. 2023).
ScheduleResult generateSchedule(ScheduleKind kind, int stages,
                                int64_t microbatches,
                                const ScheduleOptions &options);

//===----------------------------------------------------------------------===//
// The schedule and replica rules, in one place (lib/Schedule/Rules.cpp).
//===----------------------------------------------------------------------===//

/// What a pipeline is asked to be: everything the schedule and replica rules
/// read. The driver fills what it knows before importing (no tied weights,
/// no split-sample count yet), the schedule pass and the verifier all of it.
struct PipelineRequest {
  ScheduleKind kind = ScheduleKind::OneFOneBFlush;
  /// Pipeline stages p*v (virtual stages with chunks); devices = stages / v.
  int64_t stages = 1;
  /// v, chunks per device (interleaved).
  int64_t chunks = 1;
  /// m, microbatches per step (per batch for 1f1b and 2bw).
  int64_t microbatches = 1;
  /// Replicas per device position; empty = one each.
  std::vector<int> replicas;
  /// Split replicas (DAPPLE): > 0 is the samples of a microbatch that the
  /// replicas of a stage share out; 0 = round robin (1F1B-RR).
  int64_t splitSamples = 0;
  WarmupPolicy warmup = WarmupPolicy::A;
  /// Tied weights: (weight, the pipeline stages that read it).
  std::vector<std::pair<std::string, std::vector<int64_t>>> tied;
  /// Where the stages run (V for zb-v, or a V-shaped custom schedule).
  Placement placement = Placement::Loop;
};

/// One broken rule: a short name (for tests and grouping) and the message
/// for the user, which says what to change.
struct RuleViolation {
  std::string rule;
  std::string message;
};

/// Every rule `request` breaks, in a fixed order (empty when it is valid):
///   microbatches      m >= 1
///   chunks            v >= 1; v > 1 only with the interleaved (or a
///                     custom) schedule
///   chunks-divide     p*v stages divide into v chunks per device
///   replica-count     one count >= 1 per device position
///   interleaved       m a multiple of p (times the round-robin replica
///                     count, which must be equal on every stage)
/// checkScheduleShape stops there (what generateSchedule needs to build
/// programs); checkPipelineRules adds what the compiler requires:
///   split-samples     split samples >= 0; split replicas need a synchronous
///                     schedule; interleaved + replicas needs split mode
///   custom            a custom schedule (from a file) has no replicas
///   zb-v              zb-v: chunks = 2 (rule "chunks"), no replicas
///   replica-range     r <= m (round robin) or <= the split samples: every
///                     replica gets work
///   round-robin       continuous schedules with replicas: r divides m
///   warmup            policy B with 1f1b-flush only
///   tied              tied weights need a synchronous schedule, two stages
///                     or more of the pipeline, and different devices for
///                     their stages
///   2bw-depth         2bw: m / r_s >= K_s - 1 on every stage (a forward
///                     would need a weight version not created yet)
std::vector<RuleViolation> checkScheduleShape(const PipelineRequest &request);
std::vector<RuleViolation> checkPipelineRules(const PipelineRequest &request);

/// The violations as one message (one per line), "" when there are none.
std::string describeViolations(const std::vector<RuleViolation> &violations);

/// In-flight depth K_s of every stage of a pipeline with these replica
/// counts (1F1B-RR, pipedream.md §3): with W_s = sum_{t>=s} r_t workers
/// from stage s on, K_s = ceil(W_s / r_s): p - s for a straight pipeline,
/// NOAM on the input stage. A replica of stage s runs K_s forwards before
/// its first backward and then alternates.
std::vector<int64_t> pipedreamDepths(const std::vector<int> &replicas);

/// Peak number of (microbatch, chunk) pairs whose forward ran and whose last
/// backward op (B, or W where the program has one) has not, on one flat
/// program. Used to size activation stashes.
int64_t peakInflight(const std::vector<SchedOp> &ops);

/// Closed form of the peak in-flight count of stage (device) `stage`:
///   gpipe        m
///   1f1b-flush   min(p - s, m) (policy A), min(2(p - s) - 1, m) (policy B)
///   1f1b, 2bw    min(p - s, m * steps)
///   zb-h1        min(p, m) on every stage (a microbatch stays until its W)
///   zb-h2        min(2p - 1, m) on every stage
///   interleaved  chunk-microbatches: 2(p-s-1) + (v-1)p + 1 when m > p,
///                m*v when m == p (thesis.md §5.4)
///   zb-v         chunk-microbatches: min(m + 1 + s, 2m, 2p), i.e. 2p
///                (1F1B's activation memory) once m >= 2p - 1
///   dualpipev    chunk-microbatches: 2p + 1 (m >= 2p)
///   custom       -1 (a file's order: count it with peakInflight)
/// For replicated stages the same forms per replica with K_s as in
/// generateSchedule and the replica's own microbatch count.
int64_t closedFormInflight(ScheduleKind kind, int stages, int stage,
                           int64_t microbatches);
int64_t closedFormInflight(ScheduleKind kind, int stages, int stage,
                           int64_t microbatches, const ScheduleOptions &options,
                           int replica = 0);

/// Peak number of live weight versions on one rank program, where version
/// v lives from its creation until the later of its last use and the
/// creation of version v+1 (the newest always lives; an update whose
/// backward is the old version's last use happens in place):
///   flush schedules  1
///   1f1b             a new version after every backward (weight stashing:
///                    a forward uses the newest, its backward the same one);
///                    p - s in steady state (thesis.md Table 7.1)
///   2bw              microbatch k (0-based) uses version max(k div m - 1, 0)
///                    for F and B; the backward of the last microbatch of
///                    batch j on this rank creates version j + 1; at most 2
/// `microbatches` is m (per batch). Returns -1 when a forward needs a version
/// that does not exist yet (2bw with too few microbatches per batch).
int64_t peakWeightVersions(ScheduleKind kind, const std::vector<SchedOp> &ops,
                           int64_t microbatches);

/// Closed form of the steady-state weight versions: 1 for flush schedules,
/// min(p - s, m * steps) for 1f1b (K_s per replica with replicas), 2 for 2bw
/// (1 when there is a single batch).
int64_t closedFormWeightVersions(ScheduleKind kind, int stages, int stage,
                                 int64_t microbatches,
                                 const ScheduleOptions &options = {});

//===----------------------------------------------------------------------===//
// Message-level check of rank programs.
//===----------------------------------------------------------------------===//

/// A communication event of one rank program, in program order. Sends do
/// not block; a receive blocks until the matching send was issued.
struct CommEvent {
  enum Kind { Send, Recv } kind;
  int peer;          ///< the other rank
  int64_t channel;   ///< logical tensor channel
  int64_t microbatch;
  std::string type;  ///< printed tensor type; must agree between the two
  std::string where; ///< for diagnostics, e.g. "stage1 op 7"
};

struct CommCheckResult {
  bool ok = true;
  /// One message per problem: unmatched sends/receives, type mismatches,
  /// per-link order mismatches, or the deadlock cycle
  /// ("rank 0 waits for rank 1 (channel 3, mb 2) ...").
  std::vector<std::string> errors;
};

/// Symbolically executes the rank programs: checks that every send has
/// exactly one matching receive (same peer pair, channel, microbatch and
/// type), that on each directed link every channel's send order equals its
/// receive order (an in-order connection per channel; across channels the
/// order is free, as MPI's tags allow), and that execution terminates.
CommCheckResult checkCommunication(
    const std::vector<std::vector<CommEvent>> &programs);

/// The send/receive programs of a generated schedule, one per rank in
/// `schedule.ranks` order, for a chain of p*v virtual stages (`where(rank,
/// op)` names op `op` of rank `rank` in messages; by default "stage S
/// replica R op I"): the forward of
/// virtual stage q receives the activation from q-1 and sends its output to
/// q+1; the backward (input gradient) receives the gradient from q+1 and
/// sends one to q-1; W ops communicate nothing. Channels: activation
/// q -> q+1 is 2q, gradient q+1 -> q is 2q+1. The peer replica of
/// microbatch k is k mod r. Feed the result to checkCommunication. A
/// schedule that failed to generate (ok false) has no programs.
std::vector<std::vector<CommEvent>> scheduleCommPrograms(
    const ScheduleResult &schedule,
    const std::function<std::string(size_t rank, int op)> &where = {});

//===----------------------------------------------------------------------===//
// Schedules in and out: torch.distributed.pipelining's compute-only CSV
// (lib/Schedule/ScheduleCsv.cpp).
//===----------------------------------------------------------------------===//

/// A schedule read from a compute-only CSV: one row per rank, one action per
/// cell in the rank's order, `<stage><F|B|I|W><microbatch>` (as torch's
/// `_Action.from_str` reads them: `2F0` is the forward of microbatch 0 on
/// stage 2; `B` a full backward, `I` its input-gradient half, `W` its
/// weight-gradient half); empty cells are idle slots and are skipped.
struct CsvSchedule {
  bool ok = false;
  /// Why the file cannot run, naming the rank and the step (CSV column,
  /// 0-based) where it can, e.g. "deadlock: rank 0 waits for rank 1 ...".
  std::string error;
  /// kind Custom, stages p (rows), chunks v (stages / p), microbatches m,
  /// one replica per rank; rank r runs virtual stages stageOfChunk(
  /// placement, p, r, c) as chunk c.
  ScheduleResult schedule;
  /// Whether the backwards are split into I and W (then a `B` cell stands
  /// for I followed by W, and every stage gets a weight-gradient half).
  bool splitBackward = false;
  /// The CSV column of every op of rank r, in flatten() order.
  std::vector<std::vector<int>> columns;
};

/// Parses and checks a compute-only CSV: actions well formed (a
/// communication action such as SEND_F is refused: the compute-only format
/// has none), every virtual stage q on rank q mod p (the loop placement of
/// Megatron and of torch's interleaved schedules) or, with two stages per
/// rank, on rank r = q or 2p-1-q (the V of ZB-V and DualPipeV), one forward and
/// one backward (B, or I and W) of every (stage, microbatch), each after its
/// forward on its rank (W after I), and the message-level check of the programs
/// (matching, per-link order, deadlock freedom).
CsvSchedule parseScheduleCsv(const std::string &text);

/// The compute-only CSV of a synchronous schedule without replicas (every
/// rank program of `schedule`, in rank order; a zero-bubble schedule's
/// backwards as I and W). Returns "" and sets `error` for a continuous
/// schedule (1f1b, 2bw: no flush, which torch's schedules always have) or a
/// replicated stage (torch's pipelines have one rank per stage; data
/// parallelism is outside the schedule).
std::string scheduleToCsv(const ScheduleResult &schedule, std::string &error);

} // namespace pipec

#endif // PIPEC_SCHEDULE_H
