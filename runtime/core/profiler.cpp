//===- profiler.cpp - Per-op wall-time profiler ---------------------------===//
//
// Part of pipec's runtime core.
//
//===----------------------------------------------------------------------===//

#include "core/profiler.h"

#include "core/error.h"

#include <nlohmann/json.hpp>

namespace pipec {
namespace rt {

void Profiler::enable(size_t numOps) {
  on = true;
  slots.assign(numOps * kPhases, Slot());
}

Profiler::Slot &Profiler::slot(int64_t op, int64_t phase) {
  if (op < 0 || size_t(op) * kPhases >= slots.size() || phase < 0 ||
      phase >= kPhases)
    throw RtError("profiler hook for op " + std::to_string(op) + " phase " +
                  std::to_string(phase) + " is out of range (" +
                  std::to_string(slots.size() / kPhases) +
                  " ops, phases 0..2)");
  return slots[size_t(op) * kPhases + size_t(phase)];
}

void Profiler::begin(int64_t op, int64_t phase, int64_t mark) {
  Slot &s = slot(op, phase);
  s.open = true;
  s.startMark = mark;
  if (mark < 0)
    s.start = Clock::now();
}

void Profiler::end(int64_t op, int64_t phase, int64_t mark) {
  Clock::time_point now = Clock::now();
  Slot &s = slot(op, phase);
  if (!s.open)
    throw RtError("pipec_rt_op_end for op " + std::to_string(op) + " phase " +
                  std::to_string(phase) + " without pipec_rt_op_begin");
  s.open = false;
  if (!counting)
    return;
  ++s.calls;
  if (mark >= 0 && s.startMark >= 0) {
    marked = true;
    pending.push_back({size_t(&s - slots.data()), s.startMark, mark});
    return;
  }
  s.total += std::chrono::duration<double>(now - s.start).count();
}

void Profiler::resolve(const std::vector<double> &markSeconds) {
  for (const Pending &p : pending) {
    if (size_t(p.begin) >= markSeconds.size() ||
        size_t(p.end) >= markSeconds.size())
      throw RtError("profiler: a queue mark has no time (marks of two steps "
                    "mixed)");
    slots[p.slot].total +=
        markSeconds[size_t(p.end)] - markSeconds[size_t(p.begin)];
  }
  pending.clear();
}

double Profiler::seconds(size_t op, int phase) const {
  return slots[op * kPhases + size_t(phase)].total;
}

int64_t Profiler::calls(size_t op, int phase) const {
  return slots[op * kPhases + size_t(phase)].calls;
}

std::string Profiler::toJson(const StageDesc &desc,
                             const std::string &device) const {
  using Json = nlohmann::ordered_json;
  double steps = double(countedSteps > 0 ? countedSteps : 1);
  double perMicrobatch = steps * double(desc.microbatches);
  // A multi-tensor update call (profiler op ops.size() + g) is one span:
  // its ops share it by elements.
  std::vector<double> shared(desc.ops.size(), 0);
  for (size_t g = 0; g < desc.fusedUpdates.size(); ++g) {
    const FusedUpdate &f = desc.fusedUpdates[g];
    double elements = 0;
    for (int64_t n : f.elements)
      elements += double(n);
    const double span = seconds(desc.ops.size() + g, 2);
    for (size_t i = 0; i < f.ops.size(); ++i)
      shared[size_t(f.ops[i])] += elements > 0
                                      ? span * double(f.elements[i]) / elements
                                      : span / double(f.ops.size());
  }
  Json ops = Json::array();
  for (size_t i = 0; i < desc.ops.size(); ++i) {
    const OpSpec &op = desc.ops[i];
    Json o;
    o["name"] = op.name;
    o["op"] = op.op;
    o["fwd_s"] = seconds(i, 0) / perMicrobatch;
    o["bwd_s"] = seconds(i, 1) / perMicrobatch;
    o["opt_s"] = (seconds(i, 2) + shared[i]) / steps;
    o["out_bytes"] = op.outBytes;
    o["param_bytes"] = op.paramBytes;
    o["saved_bytes"] = op.savedBytes;
    o["fwd_scratch_bytes"] = op.fwdScratchBytes;
    o["bwd_scratch_bytes"] = op.bwdScratchBytes;
    o["carried_bytes"] = op.carriedBytes;
    o["bwd_scratch_recomputed_bytes"] = op.bwdRecomputedScratchBytes;
    if (!op.savedReads.empty())
      o["saved_reads"] = op.savedReads;
    if (op.fwdFlops > 0 || op.bwdFlops > 0 || op.touchedBytes > 0) {
      o["fwd_flops"] = op.fwdFlops;
      o["bwd_flops"] = op.bwdFlops;
      o["bytes"] = op.touchedBytes;
    }
    o["inputs"] = op.inputs;
    ops.push_back(std::move(o));
  }
  Json doc;
  doc["format"] = "pipec.profile/1";
  doc["device"] = device;
  // How the times were taken: the device queue's own clock (CUDA events),
  // or the host's clock with the device synchronised around each op.
  doc["timing"] = marked ? "device-queue" : "host";
  doc["microbatch"] = desc.microbatch;
  // saved_bytes and the scratch bytes are the compiled stage's, and the
  // model's as a whole on one stage without recomputation.
  if (!desc.memoryModel.empty())
    doc["memory_model"] = desc.memoryModel;
  if (copyRate > 0)
    doc["copy_bytes_per_s"] = copyRate;
  // What the data feeds put in a stash slot per microbatch.
  int64_t inputBytes = 0, labelBytes = 0;
  for (const FeedSpec &f : desc.feeds)
    (f.kind == FeedSpec::Kind::Labels ? labelBytes : inputBytes) += f.bytes;
  doc["input_bytes"] = inputBytes;
  doc["label_bytes"] = labelBytes;
  doc["stage"] = desc.stage;
  doc["steps"] = countedSteps;
  if (countedWall > 0 && desc.numStages == 1) {
    // A stage of several would count its waits for messages too.
    double opSeconds = 0, calls = 0;
    for (size_t i = 0; i < slots.size(); ++i) {
      opSeconds += slots[i].total;
      if (i % kPhases < 2) // forward and backward calls
        calls += double(slots[i].calls);
    }
    const double stepSeconds = countedWall / steps;
    doc["step_s"] = stepSeconds;
    doc["op_overhead_s"] =
        calls > 0
            ? std::max(0.0, stepSeconds - opSeconds / steps) / (calls / steps)
            : 0.0;
  }
  doc["ops"] = std::move(ops);
  return doc.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

} // namespace rt
} // namespace pipec
