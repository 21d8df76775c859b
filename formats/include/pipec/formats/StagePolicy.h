//===- StagePolicy.h - the schedule policy of a stage description -*- C++ -*-===//
//
// Part of pipec's formats library, shared by the compiler (which writes the
// stage description, passes/LowerToRuntime.cpp) and the runtime (which reads
// it, runtime/core/stage.cpp). Header-only, standard library only.
//
// The runtime takes its behaviour from these explicit fields, never from
// the schedule's name (which the description keeps for messages):
//
//   "policy": {
//     "update": "flush" | "per-microbatch" | "2bw",
//     "flush": true | false,
//     "versions_kept": N
//   }
//
//   update          flush: gradients of every microbatch accumulate and one
//                   update follows the step's flush (gpipe, 1f1b-flush,
//                   interleaved, zb-h1); per-microbatch: PipeDream's update
//                   after every backward, each microbatch a minibatch with
//                   its own loss (weight stashing, 1f1b); 2bw: one update per
//                   batch of m microbatches, double-buffered (PipeDream-2BW)
//   flush           false for the continuous schedules, which run batches
//                   back to back (1f1b, 2bw)
//   versions_kept   the most weight versions (live included) a rank of this
//                   stage holds in steady state under the default policy
//                   (closed forms of lib/Schedule: 1, p - s, 2); the runtime
//                   refuses to go past it
//
// The stash depth, the activation slots of in-flight microbatches, is the
// description's "slots".
//
//===----------------------------------------------------------------------===//
#ifndef PIPEC_FORMATS_STAGEPOLICY_H
#define PIPEC_FORMATS_STAGEPOLICY_H

#include <cstdint>
#include <optional>
#include <string>

namespace pipec {
namespace formats {

enum class UpdateRule { Flush, PerMicrobatch, TwoBW };

inline const char *updateRuleName(UpdateRule rule) {
  switch (rule) {
  case UpdateRule::Flush:
    return "flush";
  case UpdateRule::PerMicrobatch:
    return "per-microbatch";
  case UpdateRule::TwoBW:
    return "2bw";
  }
  return "flush";
}

inline std::optional<UpdateRule> parseUpdateRule(const std::string &name) {
  for (UpdateRule r :
       {UpdateRule::Flush, UpdateRule::PerMicrobatch, UpdateRule::TwoBW})
    if (name == updateRuleName(r))
      return r;
  return std::nullopt;
}

struct StagePolicy {
  UpdateRule update = UpdateRule::Flush;
  bool flush = true;
  int64_t versionsKept = 1;
};

} // namespace formats
} // namespace pipec

#endif // PIPEC_FORMATS_STAGEPOLICY_H
