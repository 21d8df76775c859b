//===- timeline.cpp - Chrome-trace timeline of a real run -----------------===//
//
// Part of pipec's runtime core. See timeline.h.
//
//===----------------------------------------------------------------------===//

#include "core/timeline.h"
#include "core/error.h"

#include <nlohmann/json.hpp>

namespace pipec {
namespace rt {

namespace {
const char *kindName(int kind) {
  static const char *names[] = {"forward", "backward", "update", "recv",
                                "send",    "allreduce", "flush"};
  return kind >= 0 && kind < Timeline::NumKinds ? names[kind] : "?";
}
} // namespace

void Timeline::enable(int rank, int stage, int replica) {
  on = true;
  this->rank = rank;
  this->stage = stage;
  this->replica = replica;
  events.reserve(4096);
  start();
}

void Timeline::start() { zero = Clock::now(); }

void Timeline::begin(int kind, int64_t mb, int64_t step, int64_t mark) {
  if (!on)
    return;
  if (kind < 0 || kind >= NumKinds)
    throw RtError("timeline: unknown span kind " + std::to_string(kind));
  open[kind] = std::chrono::duration<double>(Clock::now() - zero).count();
  openMark[kind] = mark;
  openMb[kind] = mb;
  openStep[kind] = step;
}

void Timeline::end(int kind, int64_t mark) {
  if (!on)
    return;
  if (kind < 0 || kind >= NumKinds)
    throw RtError("timeline: unknown span kind " + std::to_string(kind));
  if (mark >= 0 && openMark[kind] >= 0) {
    events.push_back(
        {kind, openMb[kind], openStep[kind], 0, 0, openMark[kind], mark});
    return;
  }
  double t1 = std::chrono::duration<double>(Clock::now() - zero).count();
  total[kind] += t1 - open[kind];
  events.push_back({kind, openMb[kind], openStep[kind], open[kind], t1});
}

void Timeline::resolve(const std::vector<double> &markSeconds) {
  const double zeroSeconds =
      std::chrono::duration<double>(zero.time_since_epoch()).count();
  for (; unresolved < events.size(); ++unresolved) {
    Event &e = events[unresolved];
    if (e.mark0 < 0)
      continue;
    if (size_t(e.mark0) >= markSeconds.size() ||
        size_t(e.mark1) >= markSeconds.size())
      throw RtError("timeline: a queue mark has no time (marks of two steps "
                    "mixed)");
    e.t0 = markSeconds[size_t(e.mark0)] - zeroSeconds;
    e.t1 = markSeconds[size_t(e.mark1)] - zeroSeconds;
    e.mark0 = e.mark1 = -1;
    total[e.kind] += e.t1 - e.t0;
  }
}

std::string Timeline::toJson() const {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  std::string process = "rank " + std::to_string(rank) + " (stage " +
                        std::to_string(stage) +
                        (replica ? ", replica " + std::to_string(replica) : "") +
                        ")";
  out.push_back({{"name", "process_name"},
                 {"ph", "M"},
                 {"pid", rank},
                 {"args", {{"name", process}}}});
  out.push_back({{"name", "process_sort_index"},
                 {"ph", "M"},
                 {"pid", rank},
                 {"args", {{"sort_index", rank}}}});
  for (const Event &e : events) {
    if (e.mark0 >= 0)
      continue; // never resolved (a step cut short)
    std::string name = kindName(e.kind);
    if (e.mb >= 0 && (e.kind == Forward || e.kind == Backward))
      name = std::string(e.kind == Forward ? "F" : "B") + std::to_string(e.mb);
    nlohmann::ordered_json ev = {{"name", name},
                                 {"cat", kindName(e.kind)},
                                 {"ph", "X"},
                                 {"ts", e.t0 * 1e6},
                                 {"dur", (e.t1 - e.t0) * 1e6},
                                 {"pid", rank},
                                 {"tid", e.kind >= Recv ? 1 : 0}};
    ev["args"] = {{"step", e.step + 1}};
    if (e.mb >= 0)
      ev["args"]["microbatch"] = e.mb;
    out.push_back(std::move(ev));
  }
  return out.dump();
}

} // namespace rt
} // namespace pipec
