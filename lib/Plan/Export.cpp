//===- Export.cpp - Plans written for other runtimes ----------------------===//
//
// Megatron-Core's layout string and torch.distributed.pipelining's schedule
// CSV from a pipec plan (include/pipec/Export.h). The layout syntax is
// Megatron-Core's documented one: stages separated by `|`, `E` embedding,
// `t` a transformer layer, `L` the loss layer, `x*N` a repeated symbol,
// `(...)*N` a repeated group, `,` cosmetic.
//
//===----------------------------------------------------------------------===//

#include "pipec/Export.h"
#include "pipec/Schedule.h"

#include <algorithm>
#include <map>
#include <regex>
#include <set>

namespace pipec {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

/// The layer index written in an op name by exporters, or -1.
int64_t layerIndexInName(const std::string &name) {
  static const std::regex pattern(
      R"((?:^|[/._:])(?:h|layers?|blocks?|block)[._](\d{1,6})(?:[/._:]|$))");
  std::smatch match;
  if (!std::regex_search(name, match, pattern))
    return -1;
  return std::stoll(match[1].str());
}

/// One stage's symbols: E, the layers, L.
std::string stageToken(bool embedding, int64_t layers, bool loss) {
  std::string token = embedding ? "E" : "";
  if (layers >= 3)
    token += "t*" + str(layers);
  else
    token += std::string(size_t(layers), 't');
  return token + (loss ? "L" : "");
}

/// Stage tokens joined by `|`, a run of equal stages (not the last) as
/// `(tok|)*N,` (the comma is cosmetic in Megatron's syntax; it keeps the
/// count apart from the next symbol).
std::string layoutString(const std::vector<std::string> &tokens) {
  std::string out;
  size_t i = 0;
  while (i + 1 < tokens.size()) {
    size_t j = i;
    while (j + 1 < tokens.size() - 1 && tokens[j + 1] == tokens[i])
      ++j;
    const size_t run = j - i + 1;
    if (run >= 2 && !tokens[i].empty())
      out += "(" + tokens[i] + "|)*" + str(int64_t(run)) + ",";
    else
      for (size_t k = i; k <= j; ++k)
        out += tokens[k] + "|";
    i = j + 1;
  }
  return out + tokens.back();
}

} // namespace

std::vector<int> transformerLayerOfOps(const Profile &profile) {
  const size_t n = profile.ops.size();
  std::vector<int> layer(n, -1);
  std::vector<bool> known(n, false);
  bool byKind =
      std::any_of(profile.ops.begin(), profile.ops.end(),
                  [](const ProfileOp &op) { return op.op == "transformer"; });
  int count = 0;
  std::map<int64_t, int> byName; // index in the name -> layer
  for (size_t i = 0; i < n; ++i) {
    if (byKind) {
      if (profile.ops[i].op == "transformer") {
        layer[i] = count++;
        known[i] = true;
      }
      continue;
    }
    int64_t index = layerIndexInName(profile.ops[i].name);
    if (index < 0)
      continue;
    auto [it, fresh] = byName.try_emplace(index, count);
    if (fresh)
      ++count;
    layer[i] = it->second;
    known[i] = true;
  }
  if (count == 0)
    return {};
  // Ops without a layer: before the first layer op -1, after the last -2,
  // in between the layer before them.
  size_t first = 0, last = n - 1;
  while (!known[first])
    ++first;
  while (!known[last])
    --last;
  for (size_t i = 0; i < n; ++i)
    if (i < first)
      layer[i] = -1;
    else if (i > last)
      layer[i] = -2;
    else if (!known[i])
      layer[i] = layer[i - 1];
  return layer;
}

ExportResult exportMegatronLayout(const Profile &profile, const Plan &plan) {
  ExportResult result;
  std::string invalid = validatePlan(plan, int(profile.ops.size()));
  if (!invalid.empty()) {
    result.error = "the plan does not fit the profile: " + invalid;
    return result;
  }
  const std::vector<int> layerOf = transformerLayerOfOps(profile);
  if (layerOf.empty()) {
    result.error =
        "the profile has no transformer layers (ops of kind 'transformer', "
        "or op names with a layer index such as /h.3/..., layers.3, "
        "blocks.3); Megatron's layout describes transformer models only";
    return result;
  }
  for (const StagePlan &stage : plan.stages)
    if (stage.replicas != plan.stages.front().replicas) {
      result.error =
          "the plan replicates stages differently (" +
          str(plan.stages.front().replicas) + " and " + str(stage.replicas) +
          " replicas); Megatron's data parallelism replicates the whole "
          "pipeline, so every stage needs the same count";
      return result;
    }
  const int numQ = plan.numStages();
  const int layers = 1 + *std::max_element(layerOf.begin(), layerOf.end());
  // Each layer goes whole to the stage with most of its forward time.
  std::vector<std::vector<double>> time(size_t(layers),
                                        std::vector<double>(size_t(numQ), 0));
  std::vector<std::set<int>> stagesOf(static_cast<size_t>(layers));
  for (int q = 0; q < numQ; ++q)
    for (int i = plan.stages[q].firstLayer; i <= plan.stages[q].lastLayer; ++i)
      if (layerOf[size_t(i)] >= 0) {
        // A tiny weight so that zero-time profiles still count ops.
        time[size_t(layerOf[size_t(i)])][size_t(q)] +=
            profile.ops[size_t(i)].fwdSeconds + 1e-12;
        stagesOf[size_t(layerOf[size_t(i)])].insert(q);
      }
  std::vector<int64_t> perStage(size_t(numQ), 0);
  for (int l = 0; l < layers; ++l) {
    const std::vector<double> &t = time[size_t(l)];
    const int q = int(std::max_element(t.begin(), t.end()) - t.begin());
    ++perStage[size_t(q)];
    if (stagesOf[size_t(l)].size() > 1)
      result.notes.push_back(
          "transformer layer " + str(l) + " is cut between stages " +
          str(*stagesOf[size_t(l)].begin()) + " and " +
          str(*stagesOf[size_t(l)].rbegin()) +
          "; Megatron places whole layers, so the layout puts it on stage " +
          str(q) + " (most of its forward time)");
  }
  std::vector<std::string> tokens;
  for (int q = 0; q < numQ; ++q)
    tokens.push_back(stageToken(q == 0, perStage[size_t(q)], q == numQ - 1));
  const int v = std::max(plan.chunks, 1);
  const int p = numQ / v;
  const int dp = plan.stages.front().replicas;
  if (plan.schedule != "1f1b-flush" && plan.schedule != "interleaved")
    result.notes.push_back(
        "Megatron-Core runs 1F1B with a flush (interleaved with " +
        std::string("virtual stages); the plan's schedule '") + plan.schedule +
        "' has no Megatron equivalent, so only the partition carries over");
  const int64_t global = int64_t(plan.microbatches) * plan.microbatchSize * dp;
  result.text =
      "# Megatron-Core flags for the " + plan.algorithm + " plan: " + str(p) +
      " pipeline ranks" + (v > 1 ? " x " + str(v) + " virtual stages" : "") +
      (dp > 1 ? ", data parallel " + str(dp) : "") + ", " +
      str(plan.microbatches) + " microbatches of " + str(plan.microbatchSize) +
      (dp > 1 ? " per replica; launch " + str(int64_t(p) * dp) + " ranks"
              : "") +
      "\n--pipeline-model-parallel-size " + str(p) + " \\\n--num-layers " +
      str(layers) + " \\\n--pipeline-model-parallel-layout \"" +
      layoutString(tokens) + "\" \\\n--micro-batch-size " +
      str(plan.microbatchSize) + " \\\n--global-batch-size " + str(global) +
      "\n";
  result.ok = true;
  return result;
}

ExportResult exportTorchSchedule(const Plan &plan) {
  ExportResult result;
  auto kind = parseScheduleKind(plan.schedule);
  if (!kind) {
    result.error = "unknown schedule '" + plan.schedule + "'";
    return result;
  }
  const int v = std::max(plan.chunks, 1);
  if (plan.numStages() % v != 0) {
    result.error = "the plan's " + str(plan.numStages()) +
                   " stages are not a multiple of its " + str(v) + " chunks";
    return result;
  }
  for (size_t q = 0; q < plan.stages.size(); ++q)
    if (plan.stages[q].replicas != 1) {
      result.error = "stage " + str(int64_t(q)) + " has " +
                     str(plan.stages[q].replicas) +
                     " replicas; a torch pipeline schedule has one rank per "
                     "stage (data parallelism is outside the schedule)";
      return result;
    }
  ScheduleOptions options;
  options.chunks = v;
  ScheduleResult schedule =
      generateSchedule(*kind, plan.numStages() / v, plan.microbatches, options);
  if (!schedule.ok) {
    result.error = schedule.error;
    return result;
  }
  result.text = scheduleToCsv(schedule, result.error);
  result.ok = result.error.empty();
  if (result.ok &&
      (*kind == ScheduleKind::ZeroBubbleH1 ||
       *kind == ScheduleKind::ZeroBubbleH2 ||
       *kind == ScheduleKind::ZeroBubbleV || *kind == ScheduleKind::DualPipeV))
    result.notes.push_back("the backwards are split: I is the input "
                           "gradient, W the weight gradient (torch's "
                           "BACKWARD_INPUT and BACKWARD_WEIGHT)");
  return result;
}

} // namespace pipec
