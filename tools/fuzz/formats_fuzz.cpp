//===- formats_fuzz.cpp - libFuzzer target for pipec's file formats -------===//
//
// Feeds arbitrary bytes to the readers of the files a user hands pipec or
// the runtime besides the ONNX model: .npy data, safetensors weights and
// checkpoints, the stage description and manifest of a run folder, and the
// planner's JSON documents (profile, plan, topology, device model) and
// compute-only schedule CSVs. The first byte picks the reader, the rest is
// the file. Each reader must accept the bytes or refuse them with a
// message; a crash, a sanitizer report, a refusal without a message or an
// exception other than the reader's own (say a JSON library's type error,
// whose text names no field) aborts. Built by scripts/fuzz.sh formats with
// clang's -fsanitize=fuzzer,address,undefined.
//
//===----------------------------------------------------------------------===//
#include "pipec/CostModel.h"
#include "pipec/Plan.h"
#include "pipec/Profile.h"
#include "pipec/Schedule.h"
#include "pipec/Topology.h"
#include "pipec/formats/Documents.h"
#include "pipec/formats/npy.h"
#include "pipec/formats/safetensors.h"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

[[noreturn]] void fail(const char *reader, const char *why) {
  std::fprintf(stderr, "formats_fuzz: %s: %s\n", reader, why);
  std::abort();
}

void refusedWith(const char *reader, const std::string &error) {
  if (error.empty())
    fail(reader, "refused without a message");
}

/// A reader that returns {ok, error, ...}.
template <typename Result>
void readWith(const char *reader, Result (*read)(const std::string &),
              const std::string &bytes) {
  Result r = read(bytes);
  if (!r.ok)
    refusedWith(reader, r.error);
}

/// A safetensors image: an 8-byte little-endian header length, the header,
/// then the data section (safetensors::File::open's split, in memory).
void safetensorsImage(const std::string &bytes) {
  std::vector<pipec::safetensors::TensorInfo> entries;
  pipec::safetensors::Metadata metadata;
  std::string error;
  if (bytes.size() < 8)
    return;
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i)
    length = (length << 8) | static_cast<unsigned char>(bytes[i]);
  if (length > bytes.size() - 8)
    return; // File::open refuses this before parsing
  std::string json = bytes.substr(8, length);
  if (!pipec::safetensors::parseHeader(json, bytes.size() - 8 - length, entries,
                                       metadata, error))
    refusedWith("safetensors", error);
}

/// The manifest reader takes a path: the bytes go through a file.
void manifest(const std::string &bytes) {
  // One file per process, removed at exit.
  static std::string path = [] {
    char name[] = "/tmp/pipec-fuzz-manifest-XXXXXX";
    int fd = mkstemp(name);
    if (fd < 0)
      fail("manifest", "cannot make a temporary file");
    close(fd);
    static std::string kept = name;
    std::atexit([] { std::remove(kept.c_str()); });
    return kept;
  }();
  std::FILE *f = std::fopen(path.c_str(), "wb");
  if (!f)
    fail("manifest", "cannot write the temporary file");
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
  // The throwing reader: its wrapper without exceptions turns every
  // exception into a refusal, which would hide another library's.
  try {
    (void)pipec::formats::readManifest(path);
  } catch (const pipec::formats::FormatError &e) {
    refusedWith("manifest", e.what());
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0)
    return 0;
  const std::string bytes(reinterpret_cast<const char *>(data) + 1, size - 1);
  const char *reader = "?";
  try {
    switch (data[0] % 9) {
    case 0: {
      reader = "npy";
      pipec::npy::Array array;
      std::string error;
      if (!pipec::npy::parse(bytes.data(), bytes.size(), array, error))
        refusedWith(reader, error);
      else if (array.data.size() !=
               size_t(array.numel()) * pipec::npy::itemSize(array.descr))
        fail(reader, "accepted data of the wrong length");
      break;
    }
    case 1:
      reader = "safetensors";
      safetensorsImage(bytes);
      break;
    case 2:
      reader = "stage description";
      try {
        (void)pipec::formats::parseStageDesc(bytes);
      } catch (const pipec::formats::FormatError &e) {
        refusedWith(reader, e.what());
      }
      break;
    case 3:
      reader = "manifest";
      manifest(bytes);
      break;
    case 4:
      reader = "plan";
      readWith(reader, &pipec::planFromJson, bytes);
      break;
    case 5:
      reader = "profile";
      readWith(reader, &pipec::profileFromJson, bytes);
      break;
    case 6:
      reader = "topology";
      readWith(reader, &pipec::topologyFromJson, bytes);
      break;
    case 7: {
      reader = "device";
      std::string error;
      if (!pipec::deviceModelFromJson(bytes, error))
        refusedWith(reader, error);
      break;
    }
    case 8:
      reader = "schedule csv";
      readWith(reader, &pipec::parseScheduleCsv, bytes);
      break;
    }
  } catch (const std::exception &e) {
    std::fprintf(stderr, "formats_fuzz: %s threw: %s\n", reader, e.what());
    std::abort();
  }
  return 0;
}
