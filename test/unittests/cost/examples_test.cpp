//===- examples_test.cpp - The shipped topologies and profiles ------------===//
//
// Every file in examples/topologies and examples/profiles parses, and the
// paper-scale profiles agree with independent numbers: published parameter
// counts (torchvision, Hugging Face, the papers' tables) and Megatron's
// closed forms for GPT-3 (thesis.md §4.6, eqs. 4.2 and 4.3).
//
//===----------------------------------------------------------------------===//

#include "pipec/Calibrate.h"
#include "pipec/CostModel.h"
#include "pipec/Profile.h"
#include "pipec/Topology.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

using namespace pipec;
namespace fs = std::filesystem;

namespace {

fs::path examplesDir(const char *sub) {
  return fs::path(PIPEC_SOURCE_DIR) / "examples" / sub;
}

std::string readText(const fs::path &path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<fs::path> jsonFiles(const char *sub) {
  std::vector<fs::path> files;
  for (const fs::directory_entry &entry :
       fs::directory_iterator(examplesDir(sub)))
    if (entry.path().extension() == ".json")
      files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

/// A shipped profile: the parsed contract plus the raw document for the
/// added fields (params, fwd_flops, bwd_flops, device_model, ...).
struct Example {
  Profile profile;
  nlohmann::json doc;
};

Example loadProfile(const std::string &file) {
  fs::path path = examplesDir("profiles") / file;
  std::string text = readText(path);
  ProfileResult parsed = profileFromJson(text);
  EXPECT_TRUE(parsed.ok) << file << ": " << parsed.error;
  return {parsed.profile, nlohmann::json::parse(text)};
}

double sumField(const nlohmann::json &doc, const char *field) {
  double total = 0;
  for (const nlohmann::json &op : doc["ops"])
    total += op.value(field, 0.0);
  return total;
}

int64_t sumParams(const nlohmann::json &doc) {
  int64_t total = 0;
  for (const nlohmann::json &op : doc["ops"])
    total += op.value("params", int64_t(0));
  return total;
}

const nlohmann::json *findOp(const nlohmann::json &doc,
                             const std::string &name) {
  for (const nlohmann::json &op : doc["ops"])
    if (op["name"] == name)
      return &op;
  return nullptr;
}

//===----------------------------------------------------------------------===//
// Topologies
//===----------------------------------------------------------------------===//

TEST(CostExamples, EveryTopologyParses) {
  std::vector<fs::path> files = jsonFiles("topologies");
  ASSERT_GE(files.size(), 10u);
  for (const fs::path &path : files) {
    SCOPED_TRACE(path.filename().string());
    std::string text = readText(path);
    TopologyResult result = topologyFromJson(text);
    ASSERT_TRUE(result.ok) << result.error;
    EXPECT_GE(result.topology.numDevices(), 4);
    EXPECT_GT(result.topology.deviceMemoryBytes, 0);
    nlohmann::json doc = nlohmann::json::parse(text);
    EXPECT_TRUE(doc.contains("note")) << "every example names its source";
    if (doc.contains("device")) {
      EXPECT_TRUE(deviceModel(doc["device"].get<std::string>()).has_value())
          << doc["device"];
    }
    // Bandwidth never rises outwards in these clusters.
    const std::vector<TopologyLevel> &levels = result.topology.levels;
    for (size_t k = 1; k < levels.size(); ++k)
      EXPECT_LE(levels[k].bandwidth, levels[k - 1].bandwidth);
  }
}

TEST(CostExamples, PaperClustersHaveTheirShapes) {
  std::map<std::string, int> devices = {{"pipedream-cluster-a-4x4.json", 16},
                                        {"pipedream-cluster-b-2x8.json", 16},
                                        {"pipedream-cluster-c-4x1.json", 4},
                                        {"dapple-config-a-2x8.json", 16},
                                        {"dapple-config-a-4x8.json", 32},
                                        {"dapple-config-b-16x1.json", 16},
                                        {"dapple-config-c-16x1.json", 16},
                                        {"madpipe-8gpu-beta12-16gb.json", 8},
                                        {"selene-a100-1536.json", 1536},
                                        {"selene-a100-tp8-384.json", 48},
                                        {"selene-a100-tp8-768.json", 96},
                                        {"selene-a100-tp8-1536.json", 192},
                                        {"dgx-h100-pod-256.json", 256}};
  for (const auto &[file, count] : devices) {
    SCOPED_TRACE(file);
    TopologyResult result =
        topologyFromJson(readText(examplesDir("topologies") / file));
    ASSERT_TRUE(result.ok) << result.error;
    EXPECT_EQ(result.topology.numDevices(), count);
  }
  // Cluster-B: NVLink inside a server, 25 Gbps Ethernet across.
  Topology b = topologyFromJson(readText(examplesDir("topologies") /
                                         "pipedream-cluster-b-2x8.json"))
                   .topology;
  EXPECT_DOUBLE_EQ(b.levels.back().bandwidth, 25e9 / 8);
  EXPECT_EQ(b.levelBetween(7, 8), 1);
  // Selene: 300 GB/s NVSwitch each way, 200 Gb/s HDR per GPU.
  Topology selene = topologyFromJson(readText(examplesDir("topologies") /
                                              "selene-a100-1536.json"))
                        .topology;
  EXPECT_DOUBLE_EQ(selene.levels[0].bandwidth, 300e9);
  EXPECT_DOUBLE_EQ(selene.levels[1].bandwidth, 200e9 / 8);
  EXPECT_EQ(selene.deviceMemoryBytes, int64_t(80) << 30);
}

//===----------------------------------------------------------------------===//
// Profiles: generic checks
//===----------------------------------------------------------------------===//

TEST(CostExamples, EveryProfileParsesAndIsConsistent) {
  std::vector<fs::path> files = jsonFiles("profiles");
  ASSERT_GE(files.size(), 7u);
  for (const fs::path &path : files) {
    SCOPED_TRACE(path.filename().string());
    Example ex = loadProfile(path.filename().string());
    const Profile &p = ex.profile;
    ASSERT_GE(p.ops.size(), 10u);
    EXPECT_LE(p.ops.size(), 200u) << "layer granularity, not per-op";
    std::optional<DeviceModel> device = deviceModel(p.device);
    ASSERT_TRUE(device.has_value()) << p.device;
    // The roofline numbers the script used are CostModel.cpp's.
    const nlohmann::json &dm = ex.doc["device_model"];
    EXPECT_EQ(dm["name"], p.device);
    EXPECT_DOUBLE_EQ(dm["peak_flops"].get<double>(), device->peakFlops);
    EXPECT_DOUBLE_EQ(dm["bandwidth"].get<double>(), device->bandwidth);
    EXPECT_EQ(dm["memory_bytes"].get<int64_t>(), device->memoryBytes);
    EXPECT_DOUBLE_EQ(dm["op_overhead_s"].get<double>(), device->opOverhead);

    for (size_t i = 0; i < p.ops.size(); ++i) {
      const ProfileOp &op = p.ops[i];
      const nlohmann::json &raw = ex.doc["ops"][i];
      SCOPED_TRACE(op.name);
      // No zero costs: every op launches at least one kernel.
      EXPECT_GE(op.fwdSeconds, device->opOverhead);
      EXPECT_GE(op.bwdSeconds, device->opOverhead);
      // Roofline lower bound (times carry six significant digits).
      double fwdFlops = raw["fwd_flops"].get<double>();
      double bwdFlops = raw["bwd_flops"].get<double>();
      EXPECT_GE(op.fwdSeconds * (1 + 1e-5), fwdFlops / device->peakFlops);
      EXPECT_GE(op.bwdSeconds * (1 + 1e-5), bwdFlops / device->peakFlops);
      // Backward = input + weight gradients = 2 x forward FLOPs.
      EXPECT_DOUBLE_EQ(bwdFlops, 2 * fwdFlops);
      EXPECT_GT(op.outBytes, 0);
      // param_bytes: 4 bytes per held parameter (fp32 or fp32 master).
      int64_t held =
          raw["params"].get<int64_t>() + raw.value("tied_params", int64_t(0));
      EXPECT_EQ(op.paramBytes, 4 * held);
    }
  }
}

TEST(CostExamples, TheBriefsModelsAreShipped) {
  for (const char *file :
       {"vgg16.json", "resnet50.json", "gnmt16.json", "bert48.json",
        "bert-large.json", "amoebanet36.json", "gpt3-175b.json"})
    EXPECT_TRUE(fs::exists(examplesDir("profiles") / file)) << file;
  EXPECT_TRUE(fs::exists(examplesDir("profiles") / "make_profiles.py"));
}

//===----------------------------------------------------------------------===//
// Profiles: per-model oracles
//===----------------------------------------------------------------------===//

TEST(CostExamples, CnnParameterCountsMatchTorchvision) {
  // torchvision's models: vgg16 138,357,544; vgg19 143,667,240;
  // resnet50 25,557,032; resnet101 44,549,160.
  EXPECT_EQ(sumParams(loadProfile("vgg16.json").doc), 138357544);
  EXPECT_EQ(sumParams(loadProfile("vgg19.json").doc), 143667240);
  EXPECT_EQ(sumParams(loadProfile("resnet50.json").doc), 25557032);
  EXPECT_EQ(sumParams(loadProfile("resnet50-1000px.json").doc), 25557032);
  EXPECT_EQ(sumParams(loadProfile("resnet101-1000px.json").doc), 44549160);
}

TEST(CostExamples, CnnForwardFlopsMatchTheKnownFigures) {
  // ResNet-50: 4.1 GMAC per 224x224 image; VGG-16: 15.5 GMAC.
  Example resnet = loadProfile("resnet50.json");
  EXPECT_NEAR(sumField(resnet.doc, "fwd_flops") / 128 / 2, 4.1e9, 0.05e9);
  Example vgg = loadProfile("vgg16.json");
  EXPECT_NEAR(sumField(vgg.doc, "fwd_flops") / 64 / 2, 15.5e9, 0.1e9);
  // VGG-19 at batch 32: activations shrink from ~384 MB to ~3 MB
  // (dapple.md §5).
  Example vgg19 = loadProfile("vgg19.json");
  EXPECT_NEAR(double(vgg19.profile.ops.front().outBytes) / (1 << 20), 392, 1);
  const ProfileOp *pool5 = nullptr;
  for (const ProfileOp &op : vgg19.profile.ops)
    if (op.name == "pool5")
      pool5 = &op;
  ASSERT_NE(pool5, nullptr);
  EXPECT_NEAR(double(pool5->outBytes) / 1e6, 3.2, 0.1);
}

TEST(CostExamples, ResNetSkipConnectionsAreInputs) {
  Example ex = loadProfile("resnet50.json");
  const Profile &p = ex.profile;
  int joins = 0;
  for (size_t i = 0; i < p.ops.size(); ++i) {
    if (p.ops[i].op != "add_relu")
      continue;
    ++joins;
    ASSERT_EQ(p.ops[i].inputs.size(), 2u) << p.ops[i].name;
    // The shortcut comes from an earlier op than the residual branch.
    EXPECT_LT(p.ops[i].inputs[1], p.ops[i].inputs[0]);
  }
  EXPECT_EQ(joins, 16);
}

TEST(CostExamples, TransformerParameterCounts) {
  // BERT-Large for SQuAD: Hugging Face's BertModel has 335,141,888
  // parameters with the pooler (1,049,600); SQuAD uses a 2-way head (2,050)
  // instead.
  EXPECT_EQ(sumParams(loadProfile("bert-large.json").doc),
            335141888 - 1049600 + 2050);
  // BERT-48: 640M (DAPPLE Table II).
  EXPECT_NEAR(double(sumParams(loadProfile("bert48.json").doc)), 640e6,
              0.01 * 640e6);
}

TEST(CostExamples, GnmtMatchesDappleTables) {
  Example ex = loadProfile("gnmt16.json");
  // 291M parameters (DAPPLE Table II); our MLPerf-style GNMT has 278M.
  EXPECT_NEAR(double(sumParams(ex.doc)), 291e6, 0.05 * 291e6);
  // Boundary activation inside the decoder: 26 MB (DAPPLE Table I).
  const nlohmann::json *decoder4 = findOp(ex.doc, "decoder4");
  ASSERT_NE(decoder4, nullptr);
  EXPECT_NEAR((*decoder4)["out_bytes"].get<double>(), 26e6, 0.02 * 26e6);
  // Encoder : decoder per-layer work about 1 : 1.45 (dapple.md §5).
  double enc = (*findOp(ex.doc, "encoder4"))["fwd_s"].get<double>() +
               (*findOp(ex.doc, "encoder4"))["bwd_s"].get<double>();
  double dec =
      (*decoder4)["fwd_s"].get<double>() + (*decoder4)["bwd_s"].get<double>();
  EXPECT_NEAR(dec / enc, 1.45, 0.1);
  int lstms = 0;
  for (const ProfileOp &op : ex.profile.ops)
    lstms += op.op == "lstm" || op.op == "lstm_attention";
  EXPECT_EQ(lstms, 16);
}

TEST(CostExamples, AmoebaNetMatchesDappleDescription) {
  Example ex = loadProfile("amoebanet36.json");
  int64_t total = sumParams(ex.doc);
  // 933M parameters (DAPPLE Table II).
  EXPECT_NEAR(double(total), 933e6, 0.01 * 933e6);
  // The last third of the cells holds ~73% of the parameters, and the
  // per-cell compute varies by at most 40% (dapple.md §5).
  int64_t lastThird = 0;
  std::map<int, double> cellSeconds;
  for (const nlohmann::json &op : ex.doc["ops"]) {
    std::string name = op["name"];
    if (name.rfind("cell", 0) != 0)
      continue;
    int cell = std::stoi(name.substr(4));
    if (cell > 24)
      lastThird += op["params"].get<int64_t>();
    cellSeconds[cell] += op["fwd_s"].get<double>() + op["bwd_s"].get<double>();
  }
  EXPECT_EQ(cellSeconds.size(), 36u);
  EXPECT_NEAR(double(lastThird) / double(total), 0.73, 0.04);
  auto [lo, hi] = std::minmax_element(
      cellSeconds.begin(), cellSeconds.end(),
      [](const auto &a, const auto &b) { return a.second < b.second; });
  EXPECT_LE(hi->second / lo->second, 1.4);
  // Cells read the two previous cells: branches and joins in the DAG.
  const ProfileOp *join = nullptr;
  for (const ProfileOp &op : ex.profile.ops)
    if (op.name == "cell20")
      join = &op;
  ASSERT_NE(join, nullptr);
  EXPECT_EQ(join->inputs.size(), 2u);
  // Boundary between cells: h_{i-1} + h_{i-2}, ~11.2 MB (DAPPLE Table I).
  const nlohmann::json *cell5 = findOp(ex.doc, "cell5");
  ASSERT_NE(cell5, nullptr);
  EXPECT_NEAR(2 * (*cell5)["out_bytes"].get<double>(), 11.2e6, 0.1 * 11.2e6);
}

//===----------------------------------------------------------------------===//
// GPT-3 175B: Megatron's closed forms
//===----------------------------------------------------------------------===//

constexpr double kL = 96, kH = 12288, kS = 2048, kV = 51200;

TEST(CostExamples, Gpt3ParameterCountIsMegatrons) {
  Example ex = loadProfile("gpt3-175b.json");
  // P = 12lh^2 (1 + 13/(12h) + (V + s)/(12lh))   (4.3), 174.6B.
  double formula =
      12 * kL * kH * kH * (1 + 13 / (12 * kH) + (kV + kS) / (12 * kL * kH));
  int64_t total = sumParams(ex.doc);
  EXPECT_NEAR(double(total), 174.6e9, 0.005 * 174.6e9);
  // Exactly the formula plus the final LayerNorm (2h), which (4.3) omits.
  EXPECT_EQ(double(total), std::round(formula) + 2 * kH);
  EXPECT_EQ(ex.profile.ops.size(), 98u); // embedding, 96 layers, head
  EXPECT_EQ(ex.profile.microbatch, 1);
  // The output layer is tied to the word embedding; the last stage holds a
  // copy (param_bytes) that is not a parameter of its own.
  const nlohmann::json *head = findOp(ex.doc, "head");
  ASSERT_NE(head, nullptr);
  EXPECT_EQ((*head)["tied_params"].get<double>(), kV * kH);
  EXPECT_EQ((*head)["param_bytes"].get<double>(), 4 * (kV * kH + 2 * kH));
  // Per layer: 12h^2 + 13h parameters; 2 bytes x bsh out (fp16).
  const nlohmann::json *layer = findOp(ex.doc, "layer50");
  ASSERT_NE(layer, nullptr);
  EXPECT_EQ((*layer)["params"].get<double>(), 12 * kH * kH + 13 * kH);
  EXPECT_EQ((*layer)["out_bytes"].get<double>(), 2 * kS * kH);
  // Korthikanti et al.: 34sbh + 5as^2b bytes saved per layer (a = 96).
  EXPECT_EQ((*layer)["saved_bytes"].get<double>(),
            34 * kS * kH + 5 * 96 * kS * kS);
}

TEST(CostExamples, Gpt3FlopsMatchTheClosedForms) {
  Example ex = loadProfile("gpt3-175b.json");
  const double B = 1; // microbatch
  double fwd = sumField(ex.doc, "fwd_flops");
  double bwd = sumField(ex.doc, "bwd_flops");
  double layersFwd = 0;
  for (const nlohmann::json &op : ex.doc["ops"])
    if (op["op"] == "transformer")
      layersFwd += op["fwd_flops"].get<double>();
  // Forward: 24Bslh^2 (1 + s/(6h) + V/(12lh)).
  double forward =
      24 * B * kS * kL * kH * kH * (1 + kS / (6 * kH) + kV / (12 * kL * kH));
  EXPECT_NEAR(fwd / forward, 1.0, 1e-12);
  // Forward + backward: 72Bslh^2 (1 + s/(6h) + V/(12lh)).
  EXPECT_NEAR((fwd + bwd) / (3 * forward), 1.0, 1e-12);
  // With activation recomputation (one more forward of every transformer
  // layer): F = 96Bslh^2 (1 + s/(6h) + V/(16lh))   (4.2).
  double eq42 =
      96 * B * kS * kL * kH * kH * (1 + kS / (6 * kH) + kV / (16 * kL * kH));
  EXPECT_NEAR((fwd + bwd + layersFwd) / eq42, 1.0, 1e-12);
  // Per iteration of Table 4.2 (batch 1536): 1536 microbatches of 1.
  EXPECT_NEAR(1536 * (fwd + bwd + layersFwd) / 1e18, 1536 * eq42 / 1e18, 1e-6);
}

TEST(CostExamples, Gpt3TensorParallelProfileIsPerGpu) {
  Example full = loadProfile("gpt3-175b.json");
  Example tp = loadProfile("gpt3-175b-tp8.json");
  ASSERT_EQ(full.profile.ops.size(), tp.profile.ops.size());
  // GEMM FLOPs are split 8 ways exactly.
  EXPECT_NEAR(8 * sumField(tp.doc, "fwd_flops") /
                  sumField(full.doc, "fwd_flops"),
              1.0, 1e-12);
  const nlohmann::json *layer = findOp(tp.doc, "layer50");
  ASSERT_NE(layer, nullptr);
  // (12h^2 + 7h)/8 sharded + 6h replicated (biases of the row-parallel
  // layers, LayerNorms).
  EXPECT_EQ((*layer)["params"].get<double>(),
            (12 * kH * kH + 7 * kH) / 8 + 6 * kH);
  // Scatter/gather: each GPU sends bsh/t values.
  EXPECT_EQ((*layer)["out_bytes"].get<double>(), 2 * kS * kH / 8);
  // Korthikanti et al. with t = 8: sbh(10 + 24/t + 5as/(ht)).
  EXPECT_EQ((*layer)["saved_bytes"].get<double>(),
            kS * kH * (10 + 24.0 / 8) + 5 * 96 * kS * kS / 8);
  // The NVSwitch allreduces make a layer slower than 1/8 of the full one.
  const nlohmann::json *fullLayer = findOp(full.doc, "layer50");
  EXPECT_GT((*layer)["fwd_s"].get<double>(),
            (*fullLayer)["fwd_s"].get<double>() / 8);
}

} // namespace

TEST(CostExamples, MeasuredDeviceModelsAreTheirProfilesCalibration) {
  // examples/devices: each file is what `pipec calibrate` gives on the
  // measured profile it names (bench/data), with its name and memory.
  struct Shipped {
    const char *file, *run, *profile, *base;
  };
  const fs::path data = fs::path(PIPEC_SOURCE_DIR) / "bench" / "data";
  for (const Shipped &s :
       {Shipped{"h200-fp32-gpt2.json", "h200-2026-11-27",
                "profile_gpt2_fp32.json", "h100"},
        Shipped{"h200-fp32-resnet50.json", "h200-2026-11-27",
                "profile_resnet50_fp32.json", "h100"},
        Shipped{"h200-bf16-gpt2.json", "h200-2026-11-27",
                "profile_gpt2_bf16.json", "h100-bf16"},
        // GPT-3's layer (t = 8) in PyTorch bf16: the GPT-3 anchor's
        // efficiencies (examples/profiles/gpt3-175b-tp8-measured.json).
        Shipped{"h200-bf16-measured.json", "h200-2026-11-27c",
                "profile_gpt3_layer_bf16.json", "h200-bf16"}}) {
    SCOPED_TRACE(s.file);
    std::string error;
    std::optional<DeviceModel> shipped =
        deviceModelFromJson(readText(examplesDir("devices") / s.file), error);
    ASSERT_TRUE(shipped) << error;
    ProfileResult measured =
        profileFromJson(readText(data / s.run / s.profile));
    ASSERT_TRUE(measured.ok) << measured.error;
    std::optional<DeviceModel> base = deviceModelByNameOrFile(s.base, error);
    ASSERT_TRUE(base) << error;
    Calibration fresh = calibrateDevice(measured.profile, *base);
    ASSERT_TRUE(fresh.ok) << fresh.error;
    fresh.model.name = shipped->name;
    fresh.model.memoryBytes = shipped->memoryBytes;
    EXPECT_EQ(deviceModelToJson(fresh.model), deviceModelToJson(*shipped));
    EXPECT_EQ(shipped->memoryBytes, 150109880320) << "the H200's memory";
  }
}
