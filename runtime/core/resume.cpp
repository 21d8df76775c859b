//===- resume.cpp - Resuming from a checkpoint of another plan ------------===//
//
// Part of pipec's runtime core (resume.h says how it works).
//
//===----------------------------------------------------------------------===//

#include "core/resume.h"

#include "core/context.h"
#include "core/error.h"
#include "core/watchdog.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <unistd.h>

namespace pipec {
namespace rt {
namespace {

/// The tag of start-up tensors (no other message is in flight then).
constexpr int kResumeTag = 7;

std::string thisHost() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0)
    return "?";
  return name;
}

std::string shapeText(const nlohmann::json &shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i].get<int64_t>());
  return s + "]";
}

/// "stage0.safetensors, stage1.safetensors on host a (rank 0); ...": what
/// the job's hosts hold, one entry per host.
std::string heldList(const std::vector<nlohmann::json> &offers) {
  std::string out;
  std::vector<std::string> seen;
  for (size_t r = 0; r < offers.size(); ++r) {
    const std::string host = offers[r].value("host", std::string("?"));
    if (std::find(seen.begin(), seen.end(), host) != seen.end())
      continue;
    seen.push_back(host);
    std::string files;
    for (const nlohmann::json &f : offers[r]["files"])
      files += (files.empty() ? "" : ", ") + f.get<std::string>();
    out += (out.empty() ? "" : "; ") +
           (files.empty() ? std::string("nothing") : files) + " on host " +
           host + " (rank " + std::to_string(r) + ")";
  }
  return out;
}

} // namespace

std::unique_ptr<OtherPlanResume>
startResumeFromAnotherPlan(const std::string &from, const StageDesc &desc,
                           char *arena) {
  auto resume = std::make_unique<OtherPlanResume>();
  resume->from = from;
  resume->held = openHeldCheckpoint(from);
  resume->missing = loadHeldWeights(resume->held, desc, arena);
  return resume;
}

int64_t finishResumeFromAnotherPlan(pipec_ctx &ctx, OtherPlanResume &resume) {
  Communicator &comm = *ctx.comm;
  const StageDesc &desc = ctx.desc;
  const std::string &from = resume.from;
  // What this host holds and what this rank lacks, to every rank.
  nlohmann::json offer, need = nlohmann::json::array();
  offer["step"] = resume.held.step;
  offer["host"] = thisHost();
  offer["files"] = nlohmann::json::array();
  offer["tensors"] = nlohmann::json::object();
  for (size_t k = 0; k < resume.held.files.size(); ++k) {
    offer["files"].push_back(
        std::filesystem::path(resume.held.paths[k]).filename().string());
    for (const safetensors::TensorInfo &t : resume.held.files[k].tensors())
      if (!offer["tensors"].contains(t.name))
        offer["tensors"][t.name] = {{"dtype", t.dtype}, {"shape", t.shape}};
  }
  for (const WeightSpec &w : resume.missing)
    need.push_back({{"name", w.name}, {"shape", w.shape}});
  std::vector<nlohmann::json> offers, needs;
  std::vector<int64_t> stageOf;
  {
    BlockedOn wait(WaitKind::Collective);
    for (const std::string &text :
         comm.allgather(offer.dump(), "telling the ranks what each host holds"))
      offers.push_back(nlohmann::json::parse(text));
    nlohmann::json mine = {{"stage", desc.stage}, {"need", need}};
    for (const std::string &text :
         comm.allgather(mine.dump(), "telling the ranks what each one lacks")) {
      nlohmann::json j = nlohmann::json::parse(text);
      stageOf.push_back(j["stage"].get<int64_t>());
      needs.push_back(j["need"]);
    }
  }
  const int n = comm.size();

  // From here every rank decides alike: the same error on every rank, or
  // the same list of moves.
  int64_t step = -1;
  int stepRank = -1;
  for (int r = 0; r < n; ++r) {
    int64_t s = offers[size_t(r)]["step"].get<int64_t>();
    if (s < 0)
      continue;
    if (step >= 0 && s != step)
      throw RtError("cannot resume from '" + from +
                    "': the hosts hold different steps (" +
                    std::to_string(step) + " on host " +
                    offers[size_t(stepRank)]["host"].get<std::string>() + ", " +
                    std::to_string(s) + " on host " +
                    offers[size_t(r)]["host"].get<std::string>() +
                    "); point every host's latest at one step");
    step = s;
    stepRank = r;
  }
  if (step < 0)
    throw RtError("cannot resume from '" + from +
                  "': no host of this job holds its stage files (a "
                  "checkpoint step folder, or a checkpoints folder with "
                  "`latest`, on the hosts that wrote it)");
  struct Move {
    int from, to;
    std::string name, dtype;
  };
  std::vector<Move> moves;
  for (int to = 0; to < n; ++to)
    for (const nlohmann::json &w : needs[size_t(to)]) {
      const std::string name = w["name"].get<std::string>();
      int provider = -1;
      for (int r = 0; r < n && provider < 0; ++r)
        if (offers[size_t(r)]["tensors"].contains(name))
          provider = r;
      const std::string who = "rank " + std::to_string(to) + " (stage " +
                              std::to_string(stageOf[size_t(to)]) + ")";
      if (provider < 0)
        throw RtError("cannot resume from '" + from + "': " + who +
                      " needs tensor '" + name +
                      "', which no stage file on this job's hosts holds (" +
                      heldList(offers) +
                      "; another model, another optimizer, or a host "
                      "missing from the job?)");
      const nlohmann::json &t = offers[size_t(provider)]["tensors"][name];
      const std::string dtype = t["dtype"].get<std::string>();
      if ((dtype != "F32" && dtype != "F64") || t["shape"] != w["shape"])
        throw RtError("cannot resume from '" + from + "': tensor '" + name +
                      "' on host " +
                      offers[size_t(provider)]["host"].get<std::string>() +
                      " is " + dtype + " " + shapeText(t["shape"]) + " but " +
                      who + " needs F32 or F64 " + shapeText(w["shape"]));
      moves.push_back({provider, to, name, dtype});
    }

  // The moves: every tensor this rank sends read from its host's files
  // first, and a read that fails agreed on by every rank before anything
  // moves (a receiver must not wait for a tensor that will never come);
  // then the sends posted, and this rank's receives in the order sent,
  // into the arena.
  const int me = comm.rank();
  std::vector<std::vector<char>> outgoing;
  std::string readError;
  for (const Move &m : moves)
    if (m.from == me && readError.empty()) {
      try {
        outgoing.push_back(resume.held.read(m.name));
      } catch (const std::exception &e) {
        readError = e.what();
      }
    }
  for (const std::string &error :
       comm.allgather(readError, "agreeing that every tensor was read"))
    if (!error.empty())
      throw RtError(error);
  std::vector<std::unique_ptr<Transfer>> sends;
  size_t next = 0;
  for (const Move &m : moves)
    if (m.from == me) {
      const std::vector<char> &bytes = outgoing[next++];
      sends.push_back(comm.sendHost(
          bytes.data(), int64_t(bytes.size()), m.to, kResumeTag,
          "sending tensor '" + m.name + "' to rank " + std::to_string(m.to)));
    }
  if (!resume.missing.empty()) {
    HostView arena(*ctx.device, ctx.arena, desc.arenaBytes);
    arena.pull();
    for (const Move &m : moves) {
      if (m.to != me)
        continue;
      const WeightSpec *w = nullptr;
      for (const WeightSpec &x : resume.missing)
        if (x.name == m.name)
          w = &x;
      const int64_t elems = w->bytes / desc.realBytes;
      std::vector<char> raw(
          size_t(std::max<int64_t>(elems * (m.dtype == "F64" ? 8 : 4), 1)));
      BlockedOn wait(WaitKind::Collective);
      comm.receiveHost(raw.data(), elems * (m.dtype == "F64" ? 8 : 4), m.from,
                       kResumeTag,
                       "receiving tensor '" + m.name + "' from rank " +
                           std::to_string(m.from));
      storeWeight(desc, *w, m.dtype, raw.data(), arena.get());
    }
    arena.push();
  }
  for (std::unique_ptr<Transfer> &s : sends)
    s->wait();
  return step;
}

} // namespace rt
} // namespace pipec
