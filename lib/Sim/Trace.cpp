//===- Trace.cpp - Chrome trace writer
//-------------------------------------===//
//
// Writes simulator events in the Chrome Trace Event Format (JSON array form)
// so that a predicted timeline opens in Perfetto beside a measured one.
//
//===----------------------------------------------------------------------===//

#include "Trace.h"

#include <cstdio>
#include <set>
#include <utility>

namespace pipec {
namespace sim {

namespace {

const char *laneName(int lane) {
  switch (lane) {
  case Compute:
    return "compute";
  case Send:
    return "send";
  case Recv:
    return "recv";
  case Collective:
    return "allreduce";
  }
  return "other";
}

/// Event names are generated here ("F3", "send activation", ...), but escape
/// anyway so that the output is JSON whatever a caller puts in.
std::string escaped(const std::string &text) {
  std::string out;
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

} // namespace

std::string traceToJson(const std::vector<TraceEvent> &events) {
  std::string out = "[";
  bool first = true;
  auto separator = [&]() {
    out += first ? "\n" : ",\n";
    first = false;
  };
  std::set<int> devices;
  std::set<std::pair<int, int>> lanes;
  for (const TraceEvent &event : events) {
    devices.insert(event.device);
    lanes.insert({event.device, event.lane});
  }
  char buf[512];
  for (int device : devices) {
    separator();
    std::snprintf(buf, sizeof buf,
                  "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,"
                  "\"tid\":0,\"args\":{\"name\":\"device %d\"}}",
                  device, device);
    out += buf;
  }
  for (const auto &[device, lane] : lanes) {
    separator();
    std::snprintf(buf, sizeof buf,
                  "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,"
                  "\"tid\":%d,\"args\":{\"name\":\"%s\"}}",
                  device, lane, laneName(lane));
    out += buf;
  }
  for (const TraceEvent &event : events) {
    separator();
    out += "{\"name\":\"" + escaped(event.name) + "\"";
    // Microseconds with nanosecond resolution.
    std::snprintf(buf, sizeof buf,
                  ",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,"
                  "\"tid\":%d,\"args\":{\"microbatch\":%lld,\"chunk\":%d,"
                  "\"stage\":%d}}",
                  event.startSeconds * 1e6, event.durationSeconds * 1e6,
                  event.device, event.lane,
                  static_cast<long long>(event.microbatch), event.chunk,
                  event.stage);
    out += buf;
  }
  out += "\n]\n";
  return out;
}

} // namespace sim
} // namespace pipec
