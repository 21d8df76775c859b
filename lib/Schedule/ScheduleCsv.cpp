//===- ScheduleCsv.cpp - torch.distributed.pipelining schedule CSVs -------===//
//
// The compute-only CSV of torch.distributed.pipelining
// (PipelineScheduleMulti._load_csv / _dump_csv): row r is rank r's order of
// actions, one per cell, each `<stage><type><microbatch>` with type F
// (forward), B (full backward), I (backward, input gradient) or W (backward,
// weight gradient); an empty cell is an idle slot. pipec reads such a file
// into the rank programs of a custom schedule and writes its own
// synchronous schedules in the same form.
//
// Decisions (README "Schedules from torch"):
// - Placement is read from the file: the loop (virtual stage q on rank
//   q mod p as chunk q / p: Megatron's interleaving, torch's
//   Interleaved1F1B, LoopedBFS and InterleavedZeroBubble) or, with two
//   stages per rank, the V (rank r holds stages r and 2p-1-r: torch's
//   ZBVZeroBubble and DualPipeV, pipec's zb-v). Anything else is refused
//   naming the first action off the loop.
// - When any I or W appears, every stage's backward is split (pipec splits
//   them all or none) and a B cell stands for I immediately followed by W.
// - Every error names the rank and the step, the CSV column counted from 0
//   (the "Step" of torch's printed pipeline order).
//
//===----------------------------------------------------------------------===//

#include "pipec/Schedule.h"

#include <algorithm>
#include <map>
#include <sstream>

namespace pipec {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

/// One parsed cell.
struct Action {
  int64_t stage = 0;
  char type = 'F';
  int64_t microbatch = 0;
  int column = 0;
};

std::string trim(const std::string &s) {
  size_t b = s.find_first_not_of(" \t\r\"'");
  if (b == std::string::npos)
    return "";
  size_t e = s.find_last_not_of(" \t\r\"'");
  return s.substr(b, e - b + 1);
}

/// Splits one CSV line at commas (the actions contain no commas or quotes
/// that need more than stripping).
std::vector<std::string> cells(const std::string &line) {
  std::vector<std::string> out;
  std::string cell;
  std::istringstream in(line);
  while (std::getline(in, cell, ','))
    out.push_back(trim(cell));
  if (!line.empty() && line.back() == ',')
    out.push_back("");
  return out;
}

bool allDigits(const std::string &s) {
  return !s.empty() && s.size() <= 9 &&
         std::all_of(s.begin(), s.end(),
                     [](char c) { return c >= '0' && c <= '9'; });
}

/// Parses "2F0" into `a`; "" when it is one, else why not.
std::string parseAction(const std::string &text, Action &a) {
  size_t i = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9')
    ++i;
  std::string stage = text.substr(0, i);
  size_t j = i;
  while (j < text.size() && !(text[j] >= '0' && text[j] <= '9'))
    ++j;
  std::string type = text.substr(i, j - i);
  std::string microbatch = text.substr(j);
  static const char *const kCommunication[] = {
      "SEND_F",  "RECV_F",  "SEND_B",     "RECV_B",
      "UNSHARD", "RESHARD", "REDUCE_GRAD"};
  for (const char *c : kCommunication)
    if (type == c)
      return "'" + text + "' is a " + c +
             " action of torch's compute_comms format; pipec reads the "
             "compute_only format (F, B, I, W) and derives the messages "
             "itself";
  if (text.size() > 1 && text.front() == '(')
    return "'" + text +
           "' is an overlapped action group (OVERLAP_F_B); "
           "pipec reads single actions only";
  if (!allDigits(stage) || type.size() != 1 ||
      std::string("FBIW").find(type[0]) == std::string::npos ||
      !allDigits(microbatch))
    return "'" + text +
           "' is not an action <stage><F|B|I|W><microbatch> such as 2F0";
  a.stage = std::stoll(stage);
  a.type = type[0];
  a.microbatch = std::stoll(microbatch);
  return "";
}

std::string at(size_t rank, int column) {
  return "rank " + str(int64_t(rank)) + " step " + str(column);
}

std::string name(const Action &a) {
  return str(a.stage) + a.type + str(a.microbatch);
}

/// The checks and the conversion, one step each.
class Reader {
public:
  CsvSchedule out;

  bool read(const std::string &text) {
    return parseRows(text) && shape() && coverage() && build() && messages();
  }

private:
  std::vector<std::vector<Action>> rows;
  int64_t p = 0, numStages = 0, m = 0;

  bool fail(const std::string &message) {
    out.error = message;
    return false;
  }

  bool parseRows(const std::string &raw) {
    // A UTF-8 byte order mark (spreadsheets write one) is not a cell, and
    // a lone CR (old Mac line ends) ends a line as LF and CRLF do.
    std::string text = raw.rfind("\xEF\xBB\xBF", 0) == 0 ? raw.substr(3) : raw;
    for (size_t i = 0; i < text.size(); ++i)
      if (text[i] == '\r' && (i + 1 == text.size() || text[i + 1] != '\n'))
        text[i] = '\n';
    std::istringstream in(text);
    std::string line;
    std::vector<std::vector<Action>> parsed;
    while (std::getline(in, line)) {
      std::vector<Action> row;
      std::vector<std::string> line_cells = cells(line);
      for (size_t c = 0; c < line_cells.size(); ++c) {
        if (line_cells[c].empty())
          continue;
        Action a;
        std::string why = parseAction(line_cells[c], a);
        if (!why.empty())
          return fail(at(parsed.size(), int(c)) + ": " + why);
        a.column = int(c);
        row.push_back(a);
      }
      parsed.push_back(std::move(row));
    }
    // Trailing blank lines are not ranks.
    while (!parsed.empty() && parsed.back().empty())
      parsed.pop_back();
    if (parsed.empty())
      return fail("the schedule has no actions (expected one row of actions "
                  "per rank, e.g. 0F0,0F1,0B0,0B1)");
    rows = std::move(parsed);
    p = int64_t(rows.size());
    return true;
  }

  /// Stages, chunks, microbatches, placement.
  bool shape() {
    for (const std::vector<Action> &row : rows)
      for (const Action &a : row) {
        numStages = std::max(numStages, a.stage + 1);
        m = std::max(m, a.microbatch + 1);
      }
    for (size_t r = 0; r < rows.size(); ++r)
      if (rows[r].empty())
        return fail("rank " + str(int64_t(r)) +
                    " has no actions; every rank runs at least one stage");
    // The loop placement, or with two stages per rank the V.
    std::optional<std::pair<size_t, Action>> offLoop =
        misplaced(Placement::Loop);
    if (!offLoop) {
      out.schedule.placement = Placement::Loop;
    } else if (numStages == 2 * p && !misplaced(Placement::V)) {
      out.schedule.placement = Placement::V;
    } else {
      const auto &[r, a] = *offLoop;
      return fail(at(r, a.column) + ": " + name(a) + " runs stage " +
                  str(a.stage) + " on rank " + str(int64_t(r)) +
                  ", but the stages must be placed in a loop (stage q on "
                  "rank q mod p, as Megatron's and torch's interleaved "
                  "schedules do) or, with two stages per rank, in a V "
                  "(rank r runs stages r and 2p-1-r, as ZB-V and DualPipeV "
                  "do)");
    }
    if (numStages % p != 0)
      return fail("the schedule has " + str(numStages) + " stages on " +
                  str(p) + " ranks; the stages must fill every rank " +
                  "equally (a multiple of " + str(p) + ")");
    for (const std::vector<Action> &row : rows)
      for (const Action &a : row)
        out.splitBackward |= a.type == 'I' || a.type == 'W';
    return true;
  }

  /// The first action (with its rank) that `placement` puts on another
  /// rank, if any.
  std::optional<std::pair<size_t, Action>>
  misplaced(Placement placement) const {
    for (size_t r = 0; r < rows.size(); ++r)
      for (const Action &a : rows[r])
        if (positionOfStage(placement, p, a.stage) != int64_t(r))
          return std::make_pair(r, a);
    return std::nullopt;
  }

  /// One F and one backward (B, or I and W) of every (stage, microbatch),
  /// each after its forward, W after I.
  bool coverage() {
    struct Seen {
      int f = -1, b = -1, i = -1, w = -1;
    };
    for (size_t r = 0; r < rows.size(); ++r) {
      std::map<std::pair<int64_t, int64_t>, Seen> seen;
      for (const Action &a : rows[r]) {
        Seen &s = seen[{a.stage, a.microbatch}];
        int *slot = a.type == 'F'   ? &s.f
                    : a.type == 'B' ? &s.b
                    : a.type == 'I' ? &s.i
                                    : &s.w;
        if (*slot >= 0)
          return fail(at(r, a.column) + ": " + name(a) +
                      " runs a second time (first at step " + str(*slot) + ")");
        *slot = a.column;
        if (a.type != 'F' && s.f < 0)
          return fail(at(r, a.column) + ": " + name(a) +
                      " runs before the forward " + str(a.stage) + "F" +
                      str(a.microbatch) + " on its rank");
        // (A W after a full backward B: the mixed case below says it.)
        if (a.type == 'W' && s.i < 0 && s.b < 0)
          return fail(at(r, a.column) + ": " + name(a) +
                      " runs before its input gradient " + str(a.stage) + "I" +
                      str(a.microbatch));
        if ((a.type == 'B' && (s.i >= 0 || s.w >= 0)) ||
            (a.type != 'F' && a.type != 'B' && s.b >= 0))
          return fail(at(r, a.column) + ": stage " + str(a.stage) +
                      " microbatch " + str(a.microbatch) +
                      " has both a full backward (B) and a split one (I/W)");
      }
      for (int64_t c = 0; c < numStages / p; ++c)
        for (int64_t k = 0; k < m; ++k) {
          const int64_t q =
              stageOfChunk(out.schedule.placement, p, int64_t(r), c);
          auto it = seen.find({q, k});
          std::string what = "stage " + str(q) + " microbatch " + str(k);
          if (it == seen.end() || it->second.f < 0)
            return fail("rank " + str(int64_t(r)) + ": no forward of " + what +
                        " (" + str(q) + "F" + str(k) +
                        "); every stage runs every microbatch of the " +
                        str(m) + " once");
          const Seen &s = it->second;
          if (s.b < 0 && (s.i < 0 || s.w < 0))
            return fail("rank " + str(int64_t(r)) + ": no " +
                        (s.i >= 0 ? std::string("weight gradient (") + str(q) +
                                        "W" + str(k) + ")"
                                  : "backward (" + str(q) + "B" + str(k) +
                                        ", or " + str(q) + "I" + str(k) +
                                        " and " + str(q) + "W" + str(k) + ")") +
                        " of " + what);
        }
    }
    return true;
  }

  bool build() {
    ScheduleResult &s = out.schedule;
    s.ok = true;
    s.kind = ScheduleKind::Custom;
    // (placement set by shape())
    s.stages = int(p);
    s.chunks = int(numStages / p);
    s.microbatches = m;
    s.steps = 1;
    s.replicas.assign(size_t(p), 1);
    out.columns.assign(size_t(p), {});
    for (size_t r = 0; r < rows.size(); ++r) {
      Segment segment;
      segment.trips = 1;
      for (const Action &a : rows[r]) {
        const int chunk = int(chunkOfStage(s.placement, p, a.stage));
        auto add = [&](PassKind kind) {
          segment.body.push_back({kind, a.microbatch, chunk});
          out.columns[r].push_back(a.column);
        };
        if (a.type == 'F')
          add(PassKind::Forward);
        else if (a.type == 'W')
          add(PassKind::BackwardWeight);
        else
          add(PassKind::Backward);
        if (a.type == 'B' && out.splitBackward)
          add(PassKind::BackwardWeight);
      }
      s.ranks.push_back({int(r), 0, StageSchedule{{segment}}});
    }
    return true;
  }

  /// Matching messages, per-link order and deadlock freedom.
  bool messages() {
    auto where = [&](size_t rank, int op) {
      const RankSchedule &program = out.schedule.ranks[rank];
      const SchedOp &o = program.schedule.segments[0].body[size_t(op)];
      const int64_t q =
          stageOfChunk(out.schedule.placement, p, int64_t(rank), o.chunk);
      const char type = o.kind == PassKind::Forward          ? 'F'
                        : o.kind == PassKind::BackwardWeight ? 'W'
                        : out.splitBackward                  ? 'I'
                                                             : 'B';
      return at(rank, out.columns[rank][size_t(op)]) + " (" + str(q) + type +
             str(o.microbatch) + ")";
    };
    CommCheckResult check =
        checkCommunication(scheduleCommPrograms(out.schedule, where));
    if (check.ok) {
      out.ok = true;
      return true;
    }
    std::string all;
    for (const std::string &e : check.errors)
      all += (all.empty() ? "" : "\n") + e;
    out.schedule = ScheduleResult();
    return fail(all);
  }
};

} // namespace

CsvSchedule parseScheduleCsv(const std::string &text) {
  Reader reader;
  if (!reader.read(text)) {
    reader.out.ok = false;
    reader.out.schedule.ok = false;
  }
  return reader.out;
}

std::string scheduleToCsv(const ScheduleResult &schedule, std::string &error) {
  if (!schedule.ok) {
    error = "the schedule is not valid: " + schedule.error;
    return "";
  }
  if (!isFlushSchedule(schedule.kind)) {
    error = std::string("torch.distributed.pipelining runs synchronous "
                        "schedules (a flush every step); '") +
            scheduleKindName(schedule.kind) +
            "' runs batches back to back with " +
            (schedule.kind == ScheduleKind::TwoBW ? "two weight versions"
                                                  : "weight stashing") +
            " and has no CSV form: use 1f1b-flush (torch's Schedule1F1B)";
    return "";
  }
  for (size_t s = 0; s < schedule.replicas.size(); ++s)
    if (schedule.replicas[s] != 1) {
      error = "stage " + str(int64_t(s)) + " has " + str(schedule.replicas[s]) +
              " replicas; a torch pipeline schedule has one rank per stage "
              "(data parallelism is outside the schedule)";
      return "";
    }
  bool split = false;
  for (const RankSchedule &rank : schedule.ranks)
    for (const SchedOp &op : rank.schedule.flatten())
      split |= op.kind == PassKind::BackwardWeight;
  std::string text;
  for (const RankSchedule &rank : schedule.ranks) {
    std::string row;
    for (const SchedOp &op : rank.schedule.flatten()) {
      const int64_t q = stageOfChunk(schedule.placement, schedule.stages,
                                     rank.stage, op.chunk);
      const char type = op.kind == PassKind::Forward          ? 'F'
                        : op.kind == PassKind::BackwardWeight ? 'W'
                        : split                               ? 'I'
                                                              : 'B';
      row += (row.empty() ? "" : ",") + str(q) + type + str(op.microbatch);
    }
    text += row + "\n";
  }
  return text;
}

} // namespace pipec
