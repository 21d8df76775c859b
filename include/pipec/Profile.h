//===- Profile.h - Per-op cost profiles (pipec.profile/1) -------*- C++ -*-===//
//
// The profile a runtime run writes and the planners read (DESIGN.md §7).
// Plain C++, no MLIR.
//
//===----------------------------------------------------------------------===//
#ifndef PIPEC_PROFILE_H
#define PIPEC_PROFILE_H

#include <cstdint>
#include <string>
#include <vector>

namespace pipec {

/// One op (or whole layer) of a profile, in topological order.
struct ProfileOp {
  std::string name;
  std::string op;
  double fwdSeconds = 0;
  double bwdSeconds = 0;
  int64_t outBytes = 0;
  int64_t paramBytes = 0;
  int64_t savedBytes = 0;
  /// Indices of the producing ops. Empty means "the previous op" (a chain).
  std::vector<int> inputs;
  /// The most scratch bytes live while one of the op's kernels runs in the
  /// forward, and in the backward (its working set together with what flows
  /// past it; 0: unknown). `pipec profile` measures them, with saved_bytes,
  /// from the compiled stage.
  int64_t fwdScratchBytes = 0, bwdScratchBytes = 0;
  /// What a zero-bubble schedule's split backward carries in the stash
  /// slot from its input half to the op's weight gradient (0: nothing, or
  /// unknown).
  int64_t carriedBytes = 0;
  /// Recomputation's lifetimes (memory_model "arena"; `pipec profile`
  /// measures them): the op's saved values by the op whose backward reads
  /// them last, as (that op's index minus this op's, bytes), and the op's
  /// backward working set with the saved values it reads last in scratch
  /// until their last read. A recomputed value lives in scratch from the
  /// start of the backward until that read. Empty / 0: unknown (the model
  /// then keeps a value until the backward of the op after its own).
  std::vector<std::pair<int, int64_t>> savedReads = {};
  int64_t bwdRecomputedScratchBytes = 0;
  /// The optimizer's update of this op's parameters, once (per step, or per
  /// update of a continuous schedule); independent of the microbatch size.
  /// `pipec profile` measures it with the optimizer it compiled for.
  double optSeconds = 0;
  /// The work of one microbatch's forward and backward kernels as the
  /// analytic cost model counts it (nn::CostOpInterface): floating-point
  /// operations, and the bytes the forward touches (its inputs, weights
  /// and outputs; the model charges the backward twice that). `pipec
  /// profile` records them beside the measured times, so a device model
  /// can be calibrated against them (pipec/Calibrate.h); 0: unknown.
  double fwdFlops = 0, bwdFlops = 0, touchedBytes = 0;
};

struct Profile {
  std::string device = "cpu";
  int64_t microbatch = 1;
  std::vector<ProfileOp> ops;
  /// "arena" (written by pipec's profiler): saved_bytes is what the
  /// compiled backward stashes, charged to the op that computes it (a value
  /// is charged once, however many backward ops read it), and the scratch
  /// bytes are measured, so the simulator models a stage's arena as the
  /// lowering lays it out (lib/Sim/Simulator.cpp). Empty: saved_bytes is an
  /// estimate per op (hand-written or paper profiles), stashed per microbatch.
  std::string memoryModel;
  /// Bytes per microbatch of the model's inputs and of the labels as the
  /// data feeds deliver them (each held in its stage's stash slot).
  int64_t inputBytes = 0, labelBytes = 0;
  /// Bytes per second of a copy within the device's memory, as the runtime
  /// copies a stage's weights into a stashed version (1f1b's weight
  /// stashing, 2bw's shadow copy); 0: unknown (such copies are then free).
  double copyBytesPerSecond = 0;
  /// What a step of the whole model took beyond its ops' own times, per
  /// forward or backward op call (`pipec profile`: the measured step's wall
  /// time less its ops' times, over its op calls): the runtime between ops,
  /// the feeds and the loss, a device waiting for the host. The simulator
  /// adds it to every op's forward, and to every backward that takes time.
  /// 0: none, or not measured.
  double opOverheadSeconds = 0;

  /// Producers of op i with the chain default applied (op i-1 when the
  /// list is empty and i > 0).
  std::vector<int> producersOf(int i) const;
};

struct ProfileResult {
  bool ok = false;
  Profile profile;
  std::string error;
};

/// Parses `pipec.profile/1` JSON. `inputs` may hold op names or indices.
/// Rejects a wrong or missing format tag, negative times or sizes, unknown
/// or forward-referencing inputs, with a message naming the op.
ProfileResult profileFromJson(const std::string &text);
/// Serialises a profile; `inputs` are written as op names.
std::string profileToJson(const Profile &profile);

} // namespace pipec

#endif // PIPEC_PROFILE_H
