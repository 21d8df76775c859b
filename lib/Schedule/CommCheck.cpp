//===- CommCheck.cpp - Message-level check of rank programs ---------------===//
//
// Symbolic execution of per-rank send/receive programs (DESIGN.md §3, the
// cross-program verifier; thesis.md §7 invariant 10). Sends never block; a
// receive blocks until the send with the same (src, dst, channel,
// microbatch) was issued. All ranks run until they finish or none can make
// progress. Matching is by key with FIFO order among equal keys; the
// per-link order check then says whether untagged in-order transports
// (NCCL p2p) would match the same pairs. A link is a (sender, receiver)
// pair and a channel (one boundary tensor and direction): messages of one
// channel must be received in the order they were sent, as an in-order
// connection per channel would deliver them; across channels the order is
// free (MPI matches by tag). A V placement (zb-v) sends several channels
// over one rank pair in different orders on the two sides (activations of
// chunk 0 and gradients of chunk 1, skip connections from both chunks).
//
// Cost: O(E) hash-map operations for E events in total, plus a linear pass
// per link, so ~100 ranks x thousands of events check instantly.
//
//===----------------------------------------------------------------------===//

#include "pipec/Schedule.h"

#include <deque>
#include <map>
#include <unordered_map>

namespace pipec {

namespace {

/// Identifies a message: the directed link, the channel and the microbatch.
struct MessageKey {
  int src;
  int dst;
  int64_t channel;
  int64_t microbatch;
  bool operator==(const MessageKey &o) const {
    return src == o.src && dst == o.dst && channel == o.channel &&
           microbatch == o.microbatch;
  }
};

struct MessageKeyHash {
  size_t operator()(const MessageKey &k) const {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&](uint64_t v) {
      h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    };
    mix(static_cast<uint32_t>(k.src));
    mix(static_cast<uint32_t>(k.dst));
    mix(static_cast<uint64_t>(k.channel));
    mix(static_cast<uint64_t>(k.microbatch));
    return static_cast<size_t>(h);
  }
};

/// One issued send.
struct SendRecord {
  int rank;
  size_t event;
  bool matched = false;
  /// Next pending send with the same key (FIFO chain), or kNone.
  size_t next;
};

constexpr size_t kNone = ~size_t(0);

/// The pending (issued, not yet received) sends of one key, oldest first.
struct PendingQueue {
  size_t head;
  size_t tail;
};

/// Per directed link: the issue order of sends and the order in which
/// receives matched them (both as send ids).
struct LinkLog {
  std::vector<size_t> sent;
  std::vector<std::pair<size_t, size_t>> received; ///< (send id, recv event)
};

/// Collects errors, keeping at most a few per kind so that one systematic
/// mistake in a 1,000-rank program does not print a million lines.
class ErrorLog {
public:
  explicit ErrorLog(std::vector<std::string> &out) : out(out) {}

  void add(const std::string &kind, std::string message) {
    int &count = counts[kind];
    if (count++ < kMaxPerKind)
      out.push_back(std::move(message));
  }

  void finish() {
    for (const auto &[kind, count] : counts)
      if (count > kMaxPerKind)
        out.push_back("... and " + std::to_string(count - kMaxPerKind) +
                      " more " + kind + " errors");
  }

private:
  static constexpr int kMaxPerKind = 20;
  std::vector<std::string> &out;
  std::map<std::string, int> counts;
};

std::string at(const CommEvent &event) {
  return event.where.empty() ? std::string() : ", at '" + event.where + "'";
}

std::string describeMessage(const CommEvent &event) {
  return "channel " + std::to_string(event.channel) + ", mb " +
         std::to_string(event.microbatch) + at(event);
}

/// The key of the message an event sends or receives on `rank`.
MessageKey keyOf(int rank, const CommEvent &event) {
  if (event.kind == CommEvent::Send)
    return MessageKey{rank, event.peer, event.channel, event.microbatch};
  return MessageKey{event.peer, rank, event.channel, event.microbatch};
}

/// The symbolic execution of a set of rank programs and the checks on its
/// final state.
class Execution {
public:
  Execution(const std::vector<std::vector<CommEvent>> &programs, ErrorLog &log)
      : programs(programs), log(log),
        numRanks(static_cast<int>(programs.size())), pc(numRanks, 0),
        blocked(numRanks, false) {}

  /// Runs every rank until it finishes or blocks on a receive that no
  /// issued send matches.
  void run() {
    std::deque<int> ready;
    for (int r = 0; r < numRanks; ++r)
      ready.push_back(r);
    while (!ready.empty()) {
      int rank = ready.front();
      ready.pop_front();
      const std::vector<CommEvent> &program = programs[rank];
      while (pc[rank] < program.size()) {
        const CommEvent &event = program[pc[rank]];
        if (event.peer < 0 || event.peer >= numRanks) {
          log.add("invalid event",
                  "invalid event: rank " + std::to_string(rank) + " event " +
                      std::to_string(pc[rank]) + at(event) + " names peer " +
                      std::to_string(event.peer) + " but there are " +
                      std::to_string(numRanks) + " ranks");
          ++pc[rank];
          continue;
        }
        if (event.kind == CommEvent::Send) {
          send(rank, keyOf(rank, event), ready);
          continue;
        }
        if (!receive(rank, event)) {
          blocked[rank] = true;
          break;
        }
      }
    }
  }

  /// Per-link order: the matched sends in issue order against the same
  /// messages in receive order; reports the first divergence.
  void checkLinkOrder() {
    for (const auto &[link, linkLog] : links) {
      size_t position = 0;
      for (size_t id : linkLog.sent) {
        if (!sends[id].matched)
          continue;
        // Every matched send appears exactly once in `received`.
        const auto &[receivedId, recvEvent] = linkLog.received[position];
        if (receivedId != id) {
          const auto &[src, dst, channel] = link;
          const CommEvent &sent = programs[src][sends[id].event];
          const CommEvent &recv = programs[dst][recvEvent];
          log.add("link order",
                  "link order mismatch on rank " + std::to_string(src) +
                      " -> rank " + std::to_string(dst) + " channel " +
                      std::to_string(channel) + ": message " +
                      std::to_string(position) + " sent is (" +
                      describeMessage(sent) + ") but message " +
                      std::to_string(position) + " received is (" +
                      describeMessage(recv) + ")");
          break;
        }
        ++position;
      }
    }
  }

  /// Deadlock: every blocked rank waits for exactly one peer, so the
  /// wait-for graph is functional; walks it to report the cycles, then the
  /// ranks waiting on a blocked or finished peer.
  void reportBlocked() {
    std::vector<int> waitsFor(numRanks, -1);
    bool anyBlocked = false;
    for (int r = 0; r < numRanks; ++r)
      if (blocked[r]) {
        waitsFor[r] = programs[r][pc[r]].peer;
        anyBlocked = true;
      }
    if (!anyBlocked)
      return;
    std::vector<bool> onCycle = reportCycles(waitsFor);
    for (int r = 0; r < numRanks; ++r) {
      if (!blocked[r] || onCycle[r])
        continue;
      int peer = waitsFor[r];
      if (blocked[peer])
        log.add("deadlock", "deadlock: " + waitText(r) +
                                ", which is blocked "
                                "itself and never sends it");
      else
        log.add("unmatched receive", "receive never matched: " + waitText(r) +
                                         ", but rank " + std::to_string(peer) +
                                         " finished without sending it");
    }
  }

  /// Sends never received. A send whose receiver is stuck before a matching
  /// receive is a consequence of the deadlock already reported; skip it.
  void reportUnmatchedSends() {
    std::unordered_map<MessageKey, int64_t, MessageKeyHash> unreachedRecvs;
    for (int r = 0; r < numRanks; ++r)
      if (blocked[r])
        for (size_t e = pc[r]; e < programs[r].size(); ++e) {
          const CommEvent &event = programs[r][e];
          if (event.kind == CommEvent::Recv && event.peer >= 0 &&
              event.peer < numRanks)
            ++unreachedRecvs[keyOf(r, event)];
        }
    for (size_t id = 0; id < sends.size(); ++id) {
      if (sends[id].matched)
        continue;
      const CommEvent &event = programs[sends[id].rank][sends[id].event];
      MessageKey key = keyOf(sends[id].rank, event);
      auto it = unreachedRecvs.find(key);
      if (it != unreachedRecvs.end() && it->second > 0) {
        --it->second;
        continue;
      }
      log.add("unmatched send",
              "send never received: rank " + std::to_string(key.src) +
                  " sends '" + event.type + "' to rank " +
                  std::to_string(key.dst) + " (" + describeMessage(event) +
                  ") but rank " + std::to_string(key.dst) +
                  " has no matching receive");
    }
  }

private:
  /// Issues the send of `rank`'s current event and wakes its receiver if
  /// it waits for exactly this message.
  void send(int rank, const MessageKey &key, std::deque<int> &ready) {
    size_t id = sends.size();
    sends.push_back({rank, pc[rank], false, kNone});
    auto [slot, inserted] = pending.try_emplace(key, PendingQueue{id, id});
    if (!inserted) {
      sends[slot->second.tail].next = id;
      slot->second.tail = id;
    }
    links[{key.src, key.dst, key.channel}].sent.push_back(id);
    ++pc[rank];
    // Wake the receiver if it waits for exactly this message.
    int dst = key.dst;
    if (blocked[dst] && keyOf(dst, programs[dst][pc[dst]]) == key) {
      blocked[dst] = false;
      ready.push_back(dst);
    }
  }

  /// Matches `rank`'s current receive with the oldest pending send of its
  /// key (checking the types); false when there is none yet.
  bool receive(int rank, const CommEvent &event) {
    MessageKey key = keyOf(rank, event);
    auto it = pending.find(key);
    if (it == pending.end())
      return false;
    size_t id = it->second.head;
    if (sends[id].next == kNone)
      pending.erase(it);
    else
      it->second.head = sends[id].next;
    SendRecord &record = sends[id];
    record.matched = true;
    const CommEvent &sendEvent = programs[record.rank][record.event];
    if (sendEvent.type != event.type)
      log.add("type mismatch",
              "type mismatch: rank " + std::to_string(key.src) + " sends '" +
                  sendEvent.type + "' to rank " + std::to_string(key.dst) +
                  " (" + describeMessage(sendEvent) +
                  ") but the receive expects '" + event.type + "'" + at(event));
    links[{key.src, key.dst, key.channel}].received.push_back({id, pc[rank]});
    ++pc[rank];
    return true;
  }

  /// What blocked rank r waits for.
  std::string waitText(int r) const {
    const CommEvent &event = programs[r][pc[r]];
    return "rank " + std::to_string(r) + " waits for rank " +
           std::to_string(event.peer) + " (" + describeMessage(event) + ")";
  }

  /// Reports every cycle of the wait-for graph once; returns the ranks on
  /// one.
  std::vector<bool> reportCycles(const std::vector<int> &waitsFor) {
    enum Color { Unvisited, OnPath, Done };
    std::vector<Color> color(numRanks, Unvisited);
    std::vector<bool> onCycle(numRanks, false);
    for (int start = 0; start < numRanks; ++start) {
      if (!blocked[start] || color[start] != Unvisited)
        continue;
      std::vector<int> path;
      int r = start;
      while (r >= 0 && blocked[r] && color[r] == Unvisited) {
        color[r] = OnPath;
        path.push_back(r);
        r = waitsFor[r];
      }
      if (r >= 0 && blocked[r] && color[r] == OnPath) {
        // The path from `r` onwards is a new cycle.
        std::string message = "deadlock: ";
        int c = r;
        do {
          message += waitText(c) + " -> ";
          onCycle[c] = true;
          c = waitsFor[c];
        } while (c != r);
        message += "back to rank " + std::to_string(r);
        log.add("deadlock", message);
      }
      for (int p : path)
        color[p] = Done;
    }
    return onCycle;
  }

  const std::vector<std::vector<CommEvent>> &programs;
  ErrorLog &log;
  const int numRanks;
  std::vector<size_t> pc;
  std::vector<bool> blocked;
  std::vector<SendRecord> sends;
  // Only messages in flight live here, so the map stays small.
  std::unordered_map<MessageKey, PendingQueue, MessageKeyHash> pending;
  /// Per (sender, receiver, channel).
  std::map<std::tuple<int, int, int64_t>, LinkLog> links;
};

} // namespace

CommCheckResult
checkCommunication(const std::vector<std::vector<CommEvent>> &programs) {
  CommCheckResult result;
  ErrorLog log(result.errors);
  Execution execution(programs, log);
  execution.run();
  execution.checkLinkOrder();
  execution.reportBlocked();
  execution.reportUnmatchedSends();
  log.finish();
  result.ok = result.errors.empty();
  return result;
}

} // namespace pipec
