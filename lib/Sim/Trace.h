//===- Trace.h - Chrome trace events of a simulated run ---------*- C++ -*-===//
//
// Internal to lib/Sim: the events the simulator records and their Chrome
// trace JSON (the "X" complete events of the Trace Event Format, one
// process per device, threads 0 compute / 1 send / 2 recv / 3 allreduce and
// optimizer), which Perfetto and chrome://tracing open.
//
//===----------------------------------------------------------------------===//
#ifndef PIPEC_LIB_SIM_TRACE_H
#define PIPEC_LIB_SIM_TRACE_H

#include <cstdint>
#include <string>
#include <vector>

namespace pipec {
namespace sim {

/// Thread ids of the trace: one lane per resource of a device.
enum TraceLane : int { Compute = 0, Send = 1, Recv = 2, Collective = 3 };

struct TraceEvent {
  std::string name;
  int device = 0;          ///< "pid"
  int lane = Compute;      ///< "tid"
  double startSeconds = 0; ///< "ts" (written in microseconds)
  double durationSeconds = 0;
  int64_t microbatch = -1; ///< args; -1 for whole-step events
  int chunk = 0;
  int stage = 0; ///< plan stage (virtual stage for interleaved)
};

/// A JSON array of Chrome trace events: one "M" process_name / thread_name
/// record per device and lane used, then one "X" event per TraceEvent.
std::string traceToJson(const std::vector<TraceEvent> &events);

} // namespace sim
} // namespace pipec

#endif // PIPEC_LIB_SIM_TRACE_H
