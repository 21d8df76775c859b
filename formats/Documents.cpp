//===- Documents.cpp - the stage description and the manifest -------------===//
//
// Part of pipec's formats library; see Documents.h.
//
//===----------------------------------------------------------------------===//

#include "pipec/formats/Documents.h"

#include "pipec_rt.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <tuple>

namespace pipec {
namespace formats {
namespace {

using Json = nlohmann::json;

/// Field access with errors that say which document and field is wrong.
class Reader {
public:
  Reader(const Json &obj, std::string what) : obj(obj), what(std::move(what)) {
    if (!obj.is_object())
      throw FormatError(this->what + " is not a JSON object");
  }

  const Json &get(const char *key) const {
    auto it = obj.find(key);
    if (it == obj.end())
      throw FormatError(what + " lacks \"" + key + "\"");
    return *it;
  }
  bool has(const char *key) const { return obj.find(key) != obj.end(); }

  std::string str(const char *key) const {
    const Json &v = get(key);
    if (!v.is_string())
      throw FormatError(what + ": \"" + key + "\" is not a string");
    return v.get<std::string>();
  }
  int64_t integer(const char *key, int64_t min = 0) const {
    const Json &v = get(key);
    if (!v.is_number_integer() || v.get<int64_t>() < min)
      throw FormatError(what + ": \"" + key +
                        "\" is not an integer >= " + std::to_string(min));
    return v.get<int64_t>();
  }
  /// An integer >= `min`, `dflt` when absent.
  int64_t integerOr(const char *key, int64_t dflt, int64_t min = 0) const {
    return has(key) ? integer(key, min) : dflt;
  }
  /// A non-negative finite number, `dflt` when absent.
  double number(const char *key, double dflt) const {
    if (!has(key))
      return dflt;
    const Json &v = get(key);
    if (!v.is_number() || !std::isfinite(v.get<double>()) ||
        v.get<double>() < 0)
      throw FormatError(what + ": \"" + key +
                        "\" is not a non-negative number");
    return v.get<double>();
  }
  bool boolean(const char *key, bool dflt) const {
    if (!has(key))
      return dflt;
    const Json &v = get(key);
    if (!v.is_boolean())
      throw FormatError(what + ": \"" + key + "\" is not a boolean");
    return v.get<bool>();
  }
  std::vector<int64_t> shape(const char *key) const {
    const Json &v = get(key);
    std::vector<int64_t> dims;
    if (v.is_array())
      for (const Json &d : v) {
        if (!d.is_number_integer() || d.get<int64_t>() < 0)
          break;
        dims.push_back(d.get<int64_t>());
      }
    if (!v.is_array() || dims.size() != v.size())
      throw FormatError(what + ": \"" + key +
                        "\" is not a list of non-negative integers");
    return dims;
  }
  const Json &list(const char *key) const {
    const Json &v = get(key);
    if (!v.is_array())
      throw FormatError(what + ": \"" + key + "\" is not a list");
    return v;
  }

private:
  const Json &obj;
  std::string what;
};

int64_t product(const std::vector<int64_t> &dims, size_t from = 0) {
  int64_t n = 1;
  for (size_t i = from; i < dims.size(); ++i) {
    if (dims[i] != 0 && n > (int64_t(1) << 50) / dims[i])
      throw FormatError("tensor shape is too large");
    n *= dims[i];
  }
  return n;
}

Json parseJson(const std::string &text, const std::string &what) {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    throw FormatError(what + " is not valid JSON");
  return j;
}

std::string listString(const std::vector<int> &v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i)
    s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

} // namespace

namespace {

/// The stage description's "policy" (StagePolicy.h).
void parsePolicy(const Reader &r, const std::string &what, StageDesc &d) {
  Reader policy(r.get("policy"), what + ": \"policy\"");
  auto rule = formats::parseUpdateRule(policy.str("update"));
  if (!rule)
    throw FormatError(what + ": unknown update rule \"" + policy.str("update") +
                      "\" (flush, per-microbatch or 2bw)");
  d.policy.update = *rule;
  d.policy.flush = policy.boolean("flush", true);
  d.policy.versionsKept = policy.integer("versions_kept", 1);
  if (d.policy.flush != (*rule == formats::UpdateRule::Flush))
    throw FormatError(what + ": \"policy\": the update rule \"" +
                      policy.str("update") + "\" and \"flush\": " +
                      (d.policy.flush ? "true" : "false") + " disagree");
}

/// "weights": each inside the arena, of the stage's precision, once.
void parseWeights(const Reader &r, const std::string &what,
                  const std::string &precision, StageDesc &d) {
  std::set<std::string> names;
  for (const Json &w : r.list("weights")) {
    Reader wr(w, what + " weight");
    WeightSpec spec;
    spec.name = wr.str("name");
    Reader named(w, what + " weight '" + spec.name + "'");
    spec.offset = named.integer("offset");
    spec.shape = named.shape("shape");
    std::string dtype = named.has("dtype") ? named.str("dtype") : "f32";
    if (dtype != precision)
      throw FormatError(what + " weight '" + spec.name + "' has dtype " +
                        dtype + " in a " + precision + " stage");
    spec.bytes = product(spec.shape) * d.realBytes;
    if (spec.offset % d.realBytes != 0 ||
        spec.offset + spec.bytes > d.arenaBytes)
      throw FormatError(what + " weight '" + spec.name + "' at offset " +
                        std::to_string(spec.offset) + " (" +
                        std::to_string(spec.bytes) +
                        " bytes) is misaligned or outside the arena of " +
                        std::to_string(d.arenaBytes) + " bytes");
    if (!names.insert(spec.name).second)
      throw FormatError(what + " lists weight '" + spec.name + "' twice");
    d.weights.push_back(std::move(spec));
  }
}

/// "feeds": model inputs and labels at the microbatch (or the replica's
/// slice of it).
void parseFeeds(const Reader &r, const std::string &what,
                const std::string &precision, StageDesc &d) {
  if (!r.has("feeds"))
    return;
  for (const Json &f : r.list("feeds")) {
    Reader fr(f, what + " feed");
    FeedSpec spec;
    spec.name = fr.str("name");
    Reader named(f, what + " feed '" + spec.name + "'");
    std::string kind = named.str("kind");
    std::string dtype = named.str("dtype");
    spec.shape = named.shape("shape");
    if (spec.shape.empty() || spec.shape[0] != d.sliceSize)
      throw FormatError(what + " feed '" + spec.name +
                        "': the leading dimension of \"shape\" must be the "
                        "microbatch size " +
                        std::to_string(d.microbatch) +
                        (d.replicaSplit
                             ? " split over " + std::to_string(d.replicas) +
                                   " replicas (" + std::to_string(d.sliceSize) +
                                   ")"
                             : std::string()));
    spec.sampleElems = product(spec.shape, 1);
    if (kind == "input") {
      spec.kind = FeedSpec::Kind::Input;
      spec.index = named.integer("index");
      if (dtype == "i64") {
        // Integer inputs (token ids) are bounded like labels.
        spec.isInt = true;
        spec.classes = named.integer("classes", 1);
        spec.bytes = product(spec.shape) * 8;
      } else if (dtype == precision) {
        spec.realBytes = d.realBytes;
        spec.bytes = product(spec.shape) * d.realBytes;
      } else {
        throw FormatError(what + " feed '" + spec.name + "' has dtype " +
                          dtype + "; model inputs of a " + precision +
                          " stage must be " + precision + " or i64");
      }
    } else if (kind == "labels") {
      spec.kind = FeedSpec::Kind::Labels;
      spec.isInt = true;
      spec.classes = named.integer("classes", 1);
      if (dtype != "i64")
        throw FormatError(what + " feed '" + spec.name + "' has dtype " +
                          dtype + "; labels must be i64");
      spec.bytes = product(spec.shape) * 8;
    } else {
      throw FormatError(what + " feed '" + spec.name + "' has kind \"" + kind +
                        "\" (expected \"input\" or \"labels\")");
    }
    d.feeds.push_back(std::move(spec));
  }
}

/// "ops": the profiler's metadata.
void parseOps(const Reader &r, const std::string &what, StageDesc &d) {
  if (!r.has("ops"))
    return;
  for (const Json &o : r.list("ops")) {
    Reader orr(o, what + " op");
    OpSpec spec;
    spec.name = orr.str("name");
    Reader named(o, what + " op '" + spec.name + "'");
    spec.op = named.str("op");
    spec.outBytes = named.integerOr("out_bytes", 0);
    spec.paramBytes = named.integerOr("param_bytes", 0);
    spec.savedBytes = named.integerOr("saved_bytes", 0);
    spec.fwdScratchBytes = named.integerOr("fwd_scratch_bytes", 0);
    spec.bwdScratchBytes = named.integerOr("bwd_scratch_bytes", 0);
    spec.carriedBytes = named.integerOr("carried_bytes", 0);
    spec.bwdRecomputedScratchBytes =
        named.integerOr("bwd_scratch_recomputed_bytes", 0);
    if (named.has("saved_reads"))
      for (const Json &read : named.list("saved_reads")) {
        if (!read.is_array() || read.size() != 2 ||
            !read[0].is_number_integer() || !read[1].is_number_integer() ||
            read[1].get<int64_t>() < 0)
          throw FormatError(what + " op '" + spec.name +
                            "': \"saved_reads\" must list [op offset, bytes] "
                            "pairs of integers (bytes >= 0)");
        spec.savedReads.push_back(
            {read[0].get<int64_t>(), read[1].get<int64_t>()});
      }
    spec.fwdFlops = named.number("fwd_flops", 0);
    spec.bwdFlops = named.number("bwd_flops", 0);
    spec.touchedBytes = named.number("bytes", 0);
    if (named.has("inputs"))
      for (const Json &in : named.list("inputs")) {
        if (!in.is_string())
          throw FormatError(what + " op '" + spec.name +
                            "': \"inputs\" must list op names");
        spec.inputs.push_back(in.get<std::string>());
      }
    d.ops.push_back(std::move(spec));
  }
  if (!r.has("fused_updates"))
    return;
  for (const Json &f : r.list("fused_updates")) {
    FusedUpdate fused;
    bool ok = f.is_object() && f.contains("ops") && f["ops"].is_array() &&
              f.contains("elements") && f["elements"].is_array() &&
              f["ops"].size() == f["elements"].size();
    if (ok)
      for (size_t i = 0; i < f["ops"].size(); ++i) {
        const Json &op = f["ops"][i], &n = f["elements"][i];
        ok = ok && op.is_number_integer() && op.get<int64_t>() >= 0 &&
             size_t(op.get<int64_t>()) < d.ops.size() &&
             n.is_number_integer() && n.get<int64_t>() >= 0;
        if (ok) {
          fused.ops.push_back(op.get<int64_t>());
          fused.elements.push_back(n.get<int64_t>());
        }
      }
    if (!ok)
      throw FormatError(what + ": \"fused_updates\" must list objects with "
                               "\"ops\" (indices of \"ops\") and as many "
                               "\"elements\" (counts)");
    d.fusedUpdates.push_back(std::move(fused));
  }
}

} // namespace

StageDesc parseStageDesc(const std::string &json) {
  const std::string what = "stage description";
  Json doc = parseJson(json, what);
  Reader r(doc, what);
  std::string format = r.str("format");
  if (format != "pipec.stage/2")
    throw FormatError("stage description has format \"" + format +
                      "\"; this runtime reads \"pipec.stage/2\"");
  int64_t abi = r.integer("abi");
  if (abi != PIPEC_RT_ABI_VERSION)
    throw FormatError("stage binary was generated for runtime ABI " +
                      std::to_string(abi) +
                      " but this runtime implements ABI " +
                      std::to_string(PIPEC_RT_ABI_VERSION));
  StageDesc d;
  d.buildId = r.str("build_id");
  d.numStages = int(r.integer("num_stages", 1));
  d.stage = int(r.integer("stage"));
  if (d.stage >= d.numStages)
    throw FormatError(what + ": stage " + std::to_string(d.stage) +
                      " is not below num_stages " +
                      std::to_string(d.numStages));
  d.microbatches = r.integer("microbatches", 1);
  d.microbatch = r.integer("microbatch", 1);
  d.globalBatch = r.integer("global_batch", 1);
  if (d.microbatches * d.microbatch != d.globalBatch)
    throw FormatError(what + ": microbatches (" +
                      std::to_string(d.microbatches) + ") * microbatch (" +
                      std::to_string(d.microbatch) + ") != global_batch (" +
                      std::to_string(d.globalBatch) + ")");
  d.schedule = r.has("schedule") ? r.str("schedule") : "";
  parsePolicy(r, what, d);
  d.windowReach = r.integerOr("window_reach", int64_t(d.numStages - 1));
  d.arenaBytes = r.integer("arena_bytes");
  d.replica = r.integerOr("replica", 0);
  d.chunks = r.integerOr("chunks", 1, 1);
  if (r.has("placement")) {
    std::string placement = r.str("placement");
    if (placement != "loop" && placement != "v")
      throw FormatError(what + ": unknown placement '" + placement +
                        "' (loop, v)");
    d.vPlacement = placement == "v";
    if (d.vPlacement && d.chunks != 2)
      throw FormatError(what +
                        ": the v placement runs 2 chunks per rank, "
                        "not " +
                        std::to_string(d.chunks));
  }
  d.replicas = r.integerOr("replicas", 1, 1);
  if (d.replica >= d.replicas)
    throw FormatError(what + ": replica " + std::to_string(d.replica) +
                      " is not below replicas " + std::to_string(d.replicas));
  d.replicaSplit = r.boolean("replica_split", false);
  if (d.replicaSplit && d.replicas > d.microbatch)
    throw FormatError(what + ": " + std::to_string(d.replicas) +
                      " split replicas but a microbatch has only " +
                      std::to_string(d.microbatch) + " samples");
  std::tie(d.sliceFirst, d.sliceSize) =
      d.replicaSplit ? replicaSlice(d.microbatch, d.replicas, d.replica)
                     : std::make_pair(int64_t(0), d.microbatch);
  d.versionedBytes = r.integerOr("versioned_bytes", 0);
  d.slots = r.integerOr("slots", 1, 1);
  if (d.versionedBytes < 0 || d.versionedBytes > d.arenaBytes || d.slots < 1)
    throw FormatError(what + ": versioned_bytes (" +
                      std::to_string(d.versionedBytes) + ") or slots (" +
                      std::to_string(d.slots) + ") out of range");
  d.loss = r.boolean("loss", false);
  d.memoryModel = r.has("memory_model") ? r.str("memory_model") : "";
  const std::string precision = r.has("precision") ? r.str("precision") : "f32";
  if (precision != "f32" && precision != "f64")
    throw FormatError(what + ": precision \"" + precision +
                      "\" (expected \"f32\" or \"f64\")");
  d.realBytes = precision == "f64" ? 8 : 4;
  d.target = r.has("target") ? r.str("target") : "cpu";
  if (d.target != "cpu" && d.target != "cuda")
    throw FormatError(what + ": target \"" + d.target +
                      "\" (expected \"cpu\" or \"cuda\")");
  d.matmulPrecision =
      r.has("matmul_precision") ? r.str("matmul_precision") : "f32";
  if (d.matmulPrecision != "f32" && d.matmulPrecision != "bf16")
    throw FormatError(what + ": matmul_precision \"" + d.matmulPrecision +
                      "\" (expected \"f32\" or \"bf16\")");
  if (d.matmulPrecision == "bf16" && d.isF64())
    throw FormatError(what + ": matmul_precision \"bf16\" needs float32 "
                             "tensors");
  if (r.has("tie_groups")) {
    for (const Json &g : r.list("tie_groups")) {
      std::vector<int64_t> stages;
      if (g.is_array())
        for (const Json &st : g)
          if (st.is_number_integer() && st.get<int64_t>() >= 0 &&
              st.get<int64_t>() < d.numStages)
            stages.push_back(st.get<int64_t>());
      if (!g.is_array() || stages.size() < 2 || stages.size() != g.size())
        throw FormatError(what + ": \"tie_groups\" must list groups of two or "
                                 "more stage numbers below num_stages");
      d.tieGroups.push_back(std::move(stages));
    }
  }

  parseWeights(r, what, precision, d);
  parseFeeds(r, what, precision, d);
  parseOps(r, what, d);
  return d;
}

Manifest readManifest(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw FormatError("cannot open manifest '" + path +
                      "' (pass --manifest PATH)");
  std::stringstream text;
  text << in.rdbuf();
  const std::string what = "manifest '" + path + "'";
  Json doc = parseJson(text.str(), what);
  Reader r(doc, what);
  std::string format = r.str("format");
  if (format != "pipec.manifest/1")
    throw FormatError(what + " has format \"" + format +
                      "\"; this runtime reads \"pipec.manifest/1\"");
  Manifest m;
  m.path = path;
  m.buildId = r.str("build_id");
  m.numRanks = int(r.integer("num_ranks", 1));
  m.microbatches = r.integer("microbatches", 1);
  m.microbatch = r.integer("microbatch", 1);
  m.globalBatch = r.integer("global_batch", 1);
  m.model = r.has("model") ? r.str("model") : "";
  m.modelHash = r.has("model_hash") ? r.str("model_hash") : "";
  m.schedule = r.has("schedule") ? r.str("schedule") : "";
  m.precision = r.has("precision") ? r.str("precision") : "f32";
  m.target = r.has("target") ? r.str("target") : "cpu";
  if (r.has("inputs")) {
    m.numInputs = int(r.list("inputs").size());
    for (const Json &in : r.list("inputs")) {
      Reader ir(in, what + " input");
      m.inputs.push_back({ir.has("name") ? ir.str("name") : "",
                          ir.shape("shape"),
                          ir.has("dtype") ? ir.str("dtype") : "f32", 0});
    }
  }
  if (r.has("labels") && !r.get("labels").is_null()) {
    Reader lr(r.get("labels"), what + " labels");
    m.hasLabels = true;
    m.labels = {"labels", lr.shape("shape"),
                lr.has("dtype") ? lr.str("dtype") : "i64",
                lr.integerOr("classes", 0)};
  }
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  for (const Json &s : r.list("stages")) {
    Reader sr(s, what + " stage");
    ManifestStage st;
    st.stage = int(sr.integer("stage"));
    st.binary = sr.has("binary") ? sr.str("binary") : "";
    if (sr.has("binaries"))
      for (const Json &b : sr.list("binaries")) {
        if (!b.is_string())
          throw FormatError(what + ": stage " + std::to_string(st.stage) +
                            " has a binary that is not a string");
        st.binaries.push_back(b.get<std::string>());
      }
    if (sr.has("weights")) {
      std::filesystem::path w = sr.str("weights");
      st.weights = (w.is_absolute() ? w : dir / w).string();
    }
    for (const Json &rank : sr.list("ranks")) {
      if (!rank.is_number_integer() || rank.get<int64_t>() < 0)
        throw FormatError(what + ": stage " + std::to_string(st.stage) +
                          " has a rank that is not a non-negative integer");
      st.ranks.push_back(rank.get<int>());
    }
    st.arenaBytes = sr.integerOr("arena_bytes", 0);
    m.stages.push_back(std::move(st));
  }
  return m;
}

bool readManifest(const std::string &path, Manifest &out, std::string &error) {
  try {
    out = readManifest(path);
    return true;
  } catch (const std::exception &e) {
    error = e.what();
    return false;
  }
}

std::string writeStageDesc(const StageDesc &d) {
  const std::string real = d.isF64() ? "f64" : "f32";
  Json j;
  j["format"] = kStageFormat;
  j["abi"] = PIPEC_RT_ABI_VERSION;
  j["build_id"] = d.buildId;
  j["stage"] = d.stage;
  j["num_stages"] = d.numStages;
  j["replica"] = d.replica;
  j["replicas"] = d.replicas;
  j["replica_split"] = d.replicaSplit;
  j["chunks"] = d.chunks;
  if (d.vPlacement)
    j["placement"] = "v";
  j["microbatches"] = d.microbatches;
  j["microbatch"] = d.microbatch;
  j["global_batch"] = d.globalBatch;
  j["schedule"] = d.schedule;
  j["policy"] = {{"update", updateRuleName(d.policy.update)},
                 {"flush", d.policy.flush},
                 {"versions_kept", d.policy.versionsKept}};
  j["window_reach"] = d.windowReach;
  j["tie_groups"] = Json::array();
  for (const std::vector<int64_t> &g : d.tieGroups)
    j["tie_groups"].push_back(g);
  j["slots"] = d.slots;
  j["versioned_bytes"] = d.versionedBytes;
  j["arena_bytes"] = d.arenaBytes;
  j["precision"] = real;
  j["target"] = d.target;
  if (d.matmulPrecision != "f32")
    j["matmul_precision"] = d.matmulPrecision;
  if (!d.memoryModel.empty())
    j["memory_model"] = d.memoryModel;
  j["weights"] = Json::array();
  for (const WeightSpec &w : d.weights)
    j["weights"].push_back({{"name", w.name},
                            {"offset", w.offset},
                            {"shape", w.shape},
                            {"dtype", real}});
  j["feeds"] = Json::array();
  for (const FeedSpec &f : d.feeds) {
    Json e = {{"name", f.name},
              {"shape", f.shape},
              {"dtype", f.isInt ? "i64" : real}};
    if (f.kind == FeedSpec::Kind::Labels) {
      e["kind"] = "labels";
      e["classes"] = f.classes;
    } else {
      e["kind"] = "input";
      e["index"] = f.index;
      if (f.isInt)
        e["classes"] = f.classes;
    }
    j["feeds"].push_back(std::move(e));
  }
  j["loss"] = d.loss;
  j["ops"] = Json::array();
  for (const OpSpec &o : d.ops)
    j["ops"].push_back(
        {{"name", o.name},
         {"op", o.op},
         {"out_bytes", o.outBytes},
         {"param_bytes", o.paramBytes},
         {"saved_bytes", o.savedBytes},
         {"fwd_scratch_bytes", o.fwdScratchBytes},
         {"bwd_scratch_bytes", o.bwdScratchBytes},
         {"carried_bytes", o.carriedBytes},
         {"saved_reads", o.savedReads},
         {"bwd_scratch_recomputed_bytes", o.bwdRecomputedScratchBytes},
         {"fwd_flops", o.fwdFlops},
         {"bwd_flops", o.bwdFlops},
         {"bytes", o.touchedBytes},
         {"inputs", o.inputs}});
  if (!d.fusedUpdates.empty()) {
    j["fused_updates"] = Json::array();
    for (const FusedUpdate &f : d.fusedUpdates)
      j["fused_updates"].push_back({{"ops", f.ops}, {"elements", f.elements}});
  }
  return j.dump();
}

std::string writeManifest(const Manifest &m) {
  nlohmann::ordered_json j;
  j["format"] = kManifestFormat;
  j["build_id"] = m.buildId;
  j["model"] = m.model;
  j["model_hash"] = m.modelHash;
  j["schedule"] = m.schedule;
  j["precision"] = m.precision;
  j["target"] = m.target;
  j["microbatches"] = m.microbatches;
  j["microbatch"] = m.microbatch;
  j["global_batch"] = m.globalBatch;
  j["num_stages"] = m.stages.size();
  j["num_ranks"] = m.numRanks;
  j["stages"] = nlohmann::ordered_json::array();
  for (const ManifestStage &s : m.stages) {
    nlohmann::ordered_json e;
    e["stage"] = s.stage;
    e["binary"] = s.binary;
    e["weights"] = s.weights;
    e["ranks"] = s.ranks;
    if (!s.binaries.empty())
      e["binaries"] = s.binaries;
    if (s.arenaBytes > 0)
      e["arena_bytes"] = s.arenaBytes;
    j["stages"].push_back(std::move(e));
  }
  j["inputs"] = nlohmann::ordered_json::array();
  for (const ManifestTensor &t : m.inputs)
    j["inputs"].push_back(
        {{"name", t.name}, {"shape", t.shape}, {"dtype", t.dtype}});
  if (m.hasLabels)
    j["labels"] = {{"shape", m.labels.shape},
                   {"dtype", m.labels.dtype},
                   {"classes", m.labels.classes}};
  else
    j["labels"] = nullptr;
  return j.dump(2) + "\n";
}

const ManifestStage &manifestStage(const Manifest &manifest, int stage) {
  for (const ManifestStage &s : manifest.stages)
    if (s.stage == stage)
      return s;
  throw FormatError("manifest '" + manifest.path + "' has no stage " +
                    std::to_string(stage));
}

void checkManifest(const StageDesc &desc, const Manifest &m, int rank,
                   int worldSize) {
  const std::string name = m.path;
  if (desc.buildId != m.buildId)
    throw FormatError("stage binary was built for build " + desc.buildId +
                      " but " + name + " is for build " + m.buildId);
  if (m.numRanks != worldSize)
    throw FormatError(name + " is for " + std::to_string(m.numRanks) +
                      " ranks (num_ranks) but the job has " +
                      std::to_string(worldSize) + " (mpirun -np)");
  auto mismatch = [&](const char *field, int64_t mine, int64_t theirs) {
    if (mine != theirs)
      throw FormatError("stage binary has " + std::string(field) + " " +
                        std::to_string(mine) + " but " + name + " has " +
                        std::to_string(theirs));
  };
  mismatch("num_stages", desc.numStages, int64_t(m.stages.size()));
  mismatch("microbatches", desc.microbatches, m.microbatches);
  mismatch("microbatch", desc.microbatch, m.microbatch);
  mismatch("global_batch", desc.globalBatch, m.globalBatch);

  std::set<int> stagesSeen, ranksSeen;
  for (const ManifestStage &s : m.stages) {
    if (s.stage < 0 || s.stage >= desc.numStages ||
        !stagesSeen.insert(s.stage).second)
      throw FormatError(name + " lists stage " + std::to_string(s.stage) +
                        " twice or out of range");
    // One rank per replica of the stage (1F1B-RR).
    if (s.ranks.empty())
      throw FormatError(name + " gives stage " + std::to_string(s.stage) +
                        " no rank");
    for (int r : s.ranks)
      if (r >= worldSize || !ranksSeen.insert(r).second)
        throw FormatError(name + " gives rank " + std::to_string(r) +
                          " to two stages or it is outside the job of " +
                          std::to_string(worldSize) + " ranks");
  }
  const ManifestStage &mine = manifestStage(m, desc.stage);
  if (int64_t(mine.ranks.size()) != desc.replicas)
    throw FormatError(
        "stage binary is one of " + std::to_string(desc.replicas) +
        " replicas of stage " + std::to_string(desc.stage) + " but " + name +
        " runs that stage on " + std::to_string(mine.ranks.size()) + " ranks");
  if (mine.ranks[size_t(desc.replica)] != rank)
    throw FormatError("this is stage " + std::to_string(desc.stage) +
                      " on rank " + std::to_string(rank) + " but " + name +
                      " runs stage " + std::to_string(desc.stage) +
                      " on ranks " + listString(mine.ranks) +
                      " (check the order of the mpirun MPMD line)");
}

} // namespace formats
} // namespace pipec
