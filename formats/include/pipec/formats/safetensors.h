//===- safetensors.h - safetensors reader and writer ------------*- C++ -*-===//
//
// Part of pipec. The header is self-contained (standard library only) and
// nothing here throws, so the compiler can build safetensors.cpp into its
// own targets (it writes the initial weights files). safetensors.cpp also
// needs nlohmann_json (header-only) to parse headers.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The safetensors format: an 8-byte little-endian header length N, N bytes
/// of JSON header `{"name": {"dtype": "F32", "shape": [..],
/// "data_offsets": [begin, end]}, …, "__metadata__": {"k": "v"}}` (padded
/// with spaces so that the data starts 8-byte aligned), then the data
/// section. Offsets are relative to the data section; tensors must tile it
/// exactly (no gaps, no overlaps), as the reference implementation requires.
///
/// Files are written atomically: to a temporary name in the same folder,
/// flushed and fsync'ed, then renamed over the destination, so a reader
/// sees either the old file or the complete new one.
///
/// Errors are values: functions return false and describe the problem in
/// `error` (one line, naming the file).
///
//===----------------------------------------------------------------------===//

#ifndef PIPEC_FORMATS_SAFETENSORS_H
#define PIPEC_FORMATS_SAFETENSORS_H

#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace pipec {
namespace safetensors {

/// Free-form string metadata stored under "__metadata__".
using Metadata = std::map<std::string, std::string>;

/// Bytes per element of a safetensors dtype ("F32" -> 4, "BF16" -> 2);
/// 0 when the dtype is unknown.
size_t dtypeSize(const std::string &dtype);

/// A tensor to write: it borrows its data, which must hold
/// numel(shape) * dtypeSize(dtype) bytes.
struct TensorRef {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  const void *data = nullptr;
};

/// A tensor entry of a file's header.
struct TensorInfo {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  /// Byte range [begin, end) relative to the start of the data section.
  uint64_t begin = 0, end = 0;

  uint64_t bytes() const { return end - begin; }
};

/// Encodes a complete file image in memory (header padded to 8 bytes).
bool serialize(const std::vector<TensorRef> &tensors, const Metadata &metadata,
               std::string &out, std::string &error);

/// FNV-1a (64 bit) of `n` bytes, continuing from `hash` (start from
/// kFnv1aOffset): the checksum of pipec's checkpoint manifests.
constexpr uint64_t kFnv1aOffset = 1469598103934665603ull;
uint64_t fnv1a64(uint64_t hash, const void *data, size_t n);

/// A written file's size and FNV-1a 64 checksum.
struct FileDigest {
  uint64_t bytes = 0;
  uint64_t fnv1a = kFnv1aOffset;
};

/// Writes a safetensors file atomically (see writeFileAtomic), streaming the
/// tensors' data from where it lies; `digest`, when given, receives the
/// size and checksum of what was written.
bool writeFile(const std::string &path, const std::vector<TensorRef> &tensors,
               const Metadata &metadata, std::string &error,
               FileDigest *digest = nullptr);

/// Atomically replaces `path` by what `body` writes: the body writes to a
/// temporary file `.<name>.tmp.<host>.<pid>` in the same folder; on success the
/// file is flushed, fsync'ed and renamed over `path` and the folder is
/// fsync'ed. If the body returns false (setting `error`) or any step fails,
/// the temporary file is removed and `path` is left untouched.
bool writeFileAtomic(
    const std::string &path,
    const std::function<bool(std::FILE *, std::string &)> &body,
    std::string &error);

/// An open safetensors file: the parsed, validated header; tensor data is
/// read on demand.
class File {
public:
  File();
  ~File();
  File(File &&) noexcept;
  File &operator=(File &&) noexcept;
  File(const File &) = delete;
  File &operator=(const File &) = delete;

  /// Opens `path` and validates the header against the file size: known
  /// dtypes, non-negative shapes, data_offsets consistent with shape and
  /// dtype, and tensors that tile the data section exactly.
  bool open(const std::string &path, std::string &error);

  /// Tensors in data order.
  const std::vector<TensorInfo> &tensors() const { return entries; }
  const Metadata &metadata() const { return meta; }
  /// The entry named `name`, or null.
  const TensorInfo *find(const std::string &name) const;
  /// Copies the tensor's bytes (info.bytes() of them) into `dst`.
  bool read(const TensorInfo &info, void *dst, std::string &error) const;
  const std::string &path() const { return filePath; }

private:
  struct Closer {
    void operator()(std::FILE *f) const { std::fclose(f); }
  };
  std::unique_ptr<std::FILE, Closer> file;
  std::string filePath;
  uint64_t dataStart = 0;
  std::vector<TensorInfo> entries;
  Metadata meta;
};

/// Validates a header (the JSON text between the length and the data) for a
/// data section of `dataBytes` bytes; fills the entries in data order.
bool parseHeader(const std::string &json, uint64_t dataBytes,
                 std::vector<TensorInfo> &entries, Metadata &metadata,
                 std::string &error);

} // namespace safetensors
} // namespace pipec

#endif // PIPEC_FORMATS_SAFETENSORS_H
