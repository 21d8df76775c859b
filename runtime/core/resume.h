//===- resume.h - Resuming from a checkpoint of another plan ----*- C++ -*-===//
//
// Part of pipec's runtime core.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// `--resume-from DIR` continues from a checkpoint written by another build
/// of the same model (other stage count, schedule, replicas or hosts).
/// Checkpoints are keyed by the model's tensor names, so each rank loads
/// its stage's weights (and optimizer state) by name, wherever they are:
///
/// 1. locally (`startResumeFromAnotherPlan`, in the start-up phase that
///    may fail on one rank): the stage files of DIR that this host holds
///    are checked against checkpoint.json and opened, and every weight they
///    hold is loaded;
/// 2. across hosts (`finishResumeFromAnotherPlan`, collective): every rank
///    tells every other which files and tensors its host holds and which
///    weights it still lacks; each lacking weight is sent by the lowest
///    rank whose host holds it. The plan is computed alike on every rank,
///    so a tensor that no host of the job holds, a shape that differs, or
///    hosts holding different steps are refused by every rank with one
///    message before any tensor moves.
///
/// So a job that lost a host continues on the others as long as every
/// stage file is still held somewhere in the job, and a job may grow onto
/// hosts that hold nothing.
///
//===----------------------------------------------------------------------===//

#ifndef PIPEC_RUNTIME_CORE_RESUME_H
#define PIPEC_RUNTIME_CORE_RESUME_H

#include "core/checkpoint.h"

#include <memory>
#include <string>
#include <vector>

struct pipec_ctx;

namespace pipec {
namespace rt {

/// A resume from another plan between its local and its collective part.
struct OtherPlanResume {
  std::string from;
  HeldCheckpoint held;
  /// Weights of this stage that this host's files do not hold.
  std::vector<WeightSpec> missing;
};

/// Part 1 (local): opens the files of `from` held here and loads the
/// weights they have into `arena` (host bytes of the stage's arena).
std::unique_ptr<OtherPlanResume>
startResumeFromAnotherPlan(const std::string &from, const StageDesc &desc,
                           char *arena);

/// Part 2 (collective over every rank): fetches the missing weights from
/// the hosts that hold them into the device arena; returns the step.
int64_t finishResumeFromAnotherPlan(pipec_ctx &ctx, OtherPlanResume &resume);

} // namespace rt
} // namespace pipec

#endif // PIPEC_RUNTIME_CORE_RESUME_H
