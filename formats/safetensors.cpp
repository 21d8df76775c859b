//===- safetensors.cpp - safetensors reader and writer --------------------===//
//
// Part of pipec. Standard library, POSIX and nlohmann_json only; never throws
// (nlohmann is used in its non-throwing parse mode). See safetensors.h.
//
//===----------------------------------------------------------------------===//

#include "pipec/formats/safetensors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <set>
#include <sys/stat.h>
#include <unistd.h>

namespace pipec {
namespace safetensors {
namespace {

/// Largest header we accept (the reference implementation's limit).
constexpr uint64_t kMaxHeaderBytes = 100u << 20;
/// Upper bound on one tensor's bytes; keeps size arithmetic overflow-free.
constexpr uint64_t kMaxTensorBytes = uint64_t(1) << 60;

/// numel(shape) * itemSize, or false on a negative dim or overflow.
bool byteCount(const std::vector<int64_t> &shape, size_t item, uint64_t &out) {
  uint64_t n = item;
  for (int64_t d : shape) {
    if (d < 0)
      return false;
    if (d != 0 && n > kMaxTensorBytes / uint64_t(d))
      return false;
    n *= uint64_t(d);
  }
  out = n;
  return true;
}

void appendJsonString(std::string &out, const std::string &s) {
  static const char hex[] = "0123456789abcdef";
  out += '"';
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c < 0x20) {
      out += "\\u00";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += char(c);
    }
  }
  out += '"';
}

/// Builds the padded header and the per-tensor byte sizes.
bool buildHeader(const std::vector<TensorRef> &tensors,
                 const Metadata &metadata, std::string &header,
                 std::vector<uint64_t> &sizes, std::string &error) {
  std::string json = "{";
  bool first = true;
  if (!metadata.empty()) {
    json += "\"__metadata__\":{";
    for (auto it = metadata.begin(); it != metadata.end(); ++it) {
      if (it != metadata.begin())
        json += ',';
      appendJsonString(json, it->first);
      json += ':';
      appendJsonString(json, it->second);
    }
    json += '}';
    first = false;
  }
  std::set<std::string> seen;
  uint64_t offset = 0;
  sizes.clear();
  for (const TensorRef &t : tensors) {
    if (t.name.empty() || t.name == "__metadata__" ||
        !seen.insert(t.name).second) {
      error = "invalid or duplicate tensor name '" + t.name + "'";
      return false;
    }
    size_t item = dtypeSize(t.dtype);
    uint64_t bytes;
    if (item == 0) {
      error = "tensor '" + t.name + "' has unknown dtype '" + t.dtype + "'";
      return false;
    }
    if (!byteCount(t.shape, item, bytes)) {
      error = "tensor '" + t.name + "' has an invalid shape";
      return false;
    }
    if (bytes > 0 && !t.data) {
      error = "tensor '" + t.name + "' has no data";
      return false;
    }
    if (!first)
      json += ',';
    first = false;
    appendJsonString(json, t.name);
    json += ":{\"dtype\":";
    appendJsonString(json, t.dtype);
    json += ",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i)
      json += (i ? "," : "") + std::to_string(t.shape[i]);
    json += "],\"data_offsets\":[" + std::to_string(offset) + "," +
            std::to_string(offset + bytes) + "]}";
    offset += bytes;
    sizes.push_back(bytes);
  }
  json += '}';
  // Pad with spaces so that the data section starts 8-byte aligned.
  json.append((8 - json.size() % 8) % 8, ' ');
  header.clear();
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i)
    header += char((n >> (8 * i)) & 0xff);
  header += json;
  return true;
}

bool getUnsigned(const nlohmann::json &v, uint64_t &out) {
  if (!v.is_number_unsigned())
    return false;
  out = v.get<uint64_t>();
  return true;
}

std::string dirName(const std::string &path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos)
    return ".";
  if (slash == 0)
    return "/";
  return path.substr(0, slash);
}

std::string baseName(const std::string &path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

} // namespace

size_t dtypeSize(const std::string &dtype) {
  static const std::map<std::string, size_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8}};
  auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

bool serialize(const std::vector<TensorRef> &tensors, const Metadata &metadata,
               std::string &out, std::string &error) {
  std::vector<uint64_t> sizes;
  if (!buildHeader(tensors, metadata, out, sizes, error))
    return false;
  for (size_t i = 0; i < tensors.size(); ++i)
    out.append(static_cast<const char *>(tensors[i].data), sizes[i]);
  return true;
}

bool writeFileAtomic(
    const std::string &path,
    const std::function<bool(std::FILE *, std::string &)> &body,
    std::string &error) {
  std::string dir = dirName(path);
  // Unique per process and host: ranks of several machines may write the
  // same file on a shared filesystem (identical contents; last rename wins).
  char host[64] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0)
    host[0] = '\0';
  std::string tmp = dir + "/." + baseName(path) + ".tmp." + host + "." +
                    std::to_string(long(::getpid()));
  std::FILE *f = std::fopen(tmp.c_str(), "wb");
  if (!f) {
    error = "cannot create '" + tmp + "': " + std::strerror(errno);
    return false;
  }
  std::string why;
  bool ok = body(f, why);
  if (ok && (std::fflush(f) != 0 || ::fsync(::fileno(f)) != 0)) {
    why = std::string("cannot flush: ") + std::strerror(errno);
    ok = false;
  }
  if (std::fclose(f) != 0 && ok) {
    why = std::string("cannot close: ") + std::strerror(errno);
    ok = false;
  }
  if (ok && std::rename(tmp.c_str(), path.c_str()) != 0) {
    why = "cannot rename '" + tmp + "' to it: " + std::strerror(errno);
    ok = false;
  }
  if (!ok) {
    std::remove(tmp.c_str());
    error = "cannot write '" + path + "': " + why;
    return false;
  }
  // Make the rename itself durable.
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
  return true;
}

uint64_t fnv1a64(uint64_t hash, const void *data, size_t n) {
  const auto *p = static_cast<const unsigned char *>(data);
  for (size_t i = 0; i < n; ++i)
    hash = (hash ^ p[i]) * 1099511628211ull;
  return hash;
}

bool writeFile(const std::string &path, const std::vector<TensorRef> &tensors,
               const Metadata &metadata, std::string &error,
               FileDigest *digest) {
  std::string header;
  std::vector<uint64_t> sizes;
  if (!buildHeader(tensors, metadata, header, sizes, error)) {
    error = "cannot write '" + path + "': " + error;
    return false;
  }
  FileDigest written;
  auto put = [&](std::FILE *f, const void *data, size_t n) {
    if (digest) {
      written.fnv1a = fnv1a64(written.fnv1a, data, n);
      written.bytes += n;
    }
    return std::fwrite(data, 1, n, f) == n;
  };
  bool ok = writeFileAtomic(
      path,
      [&](std::FILE *f, std::string &why) {
        bool ok = put(f, header.data(), header.size());
        for (size_t i = 0; ok && i < tensors.size(); ++i)
          ok = put(f, tensors[i].data, sizes[i]);
        if (!ok)
          why = std::strerror(errno);
        return ok;
      },
      error);
  if (ok && digest)
    *digest = written;
  return ok;
}

bool parseHeader(const std::string &json, uint64_t dataBytes,
                 std::vector<TensorInfo> &entries, Metadata &metadata,
                 std::string &error) {
  entries.clear();
  metadata.clear();
  nlohmann::json h =
      nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (h.is_discarded() || !h.is_object()) {
    error = "header is not a JSON object";
    return false;
  }
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string &name = it.key();
    const nlohmann::json &v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) {
        error = "__metadata__ is not an object";
        return false;
      }
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) {
          error = "__metadata__ value of '" + m.key() + "' is not a string";
          return false;
        }
        metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    std::string where = "tensor '" + name + "': ";
    if (!v.is_object()) {
      error = where + "entry is not an object";
      return false;
    }
    auto dtype = v.find("dtype"), shape = v.find("shape"),
         offsets = v.find("data_offsets");
    if (dtype == v.end() || !dtype->is_string() || shape == v.end() ||
        !shape->is_array() || offsets == v.end() || !offsets->is_array() ||
        offsets->size() != 2) {
      error = where + "needs \"dtype\", \"shape\" and \"data_offsets\"";
      return false;
    }
    TensorInfo info;
    info.name = name;
    info.dtype = dtype->get<std::string>();
    size_t item = dtypeSize(info.dtype);
    if (item == 0) {
      error = where + "unknown dtype '" + info.dtype + "'";
      return false;
    }
    for (const nlohmann::json &d : *shape) {
      uint64_t dim;
      if (!getUnsigned(d, dim) || dim > kMaxTensorBytes) {
        error = where + "shape is not a list of non-negative integers";
        return false;
      }
      info.shape.push_back(int64_t(dim));
    }
    uint64_t bytes;
    if (!byteCount(info.shape, item, bytes)) {
      error = where + "shape is too large";
      return false;
    }
    if (!getUnsigned((*offsets)[0], info.begin) ||
        !getUnsigned((*offsets)[1], info.end) || info.begin > info.end ||
        info.end > dataBytes) {
      error = where + "data_offsets are outside the " +
              std::to_string(dataBytes) +
              "-byte data section (file truncated?)";
      return false;
    }
    if (info.end - info.begin != bytes) {
      error = where + "data_offsets span " +
              std::to_string(info.end - info.begin) + " bytes but dtype " +
              info.dtype + " and its shape need " + std::to_string(bytes);
      return false;
    }
    entries.push_back(std::move(info));
  }
  std::sort(entries.begin(), entries.end(),
            [](const TensorInfo &a, const TensorInfo &b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  uint64_t covered = 0;
  for (const TensorInfo &e : entries) {
    if (e.begin != covered) {
      error = "tensor '" + e.name + "' " +
              (e.begin < covered ? "overlaps another tensor"
                                 : "leaves a gap in the data section");
      return false;
    }
    covered = e.end;
  }
  if (covered != dataBytes) {
    error = "the data section has " + std::to_string(dataBytes - covered) +
            " bytes that no tensor covers";
    return false;
  }
  return true;
}

//===----------------------------------------------------------------------===//
// File
//===----------------------------------------------------------------------===//

File::File() = default;
File::~File() = default;
File::File(File &&) noexcept = default;
File &File::operator=(File &&) noexcept = default;

bool File::open(const std::string &path, std::string &error) {
  filePath = path;
  entries.clear();
  meta.clear();
  file.reset(std::fopen(path.c_str(), "rb"));
  auto fail = [&](const std::string &why) {
    error = "'" + path + "' is not a valid safetensors file: " + why;
    file.reset();
    return false;
  };
  if (!file) {
    error = "cannot open '" + path + "': " + std::strerror(errno);
    return false;
  }
  if (::fseeko(file.get(), 0, SEEK_END) != 0)
    return fail(std::strerror(errno));
  off_t size = ::ftello(file.get());
  std::rewind(file.get());
  unsigned char len[8];
  if (size < 8 || std::fread(len, 1, 8, file.get()) != 8)
    return fail("shorter than the 8-byte header length");
  uint64_t headerLen = 0;
  for (int i = 0; i < 8; ++i)
    headerLen |= uint64_t(len[i]) << (8 * i);
  if (headerLen > kMaxHeaderBytes || headerLen > uint64_t(size) - 8)
    return fail("header length " + std::to_string(headerLen) +
                " exceeds the file size " + std::to_string(size) +
                " (truncated or corrupt)");
  std::string json(headerLen, '\0');
  if (std::fread(&json[0], 1, headerLen, file.get()) != headerLen)
    return fail("cannot read the header");
  dataStart = 8 + headerLen;
  std::string why;
  if (!parseHeader(json, uint64_t(size) - dataStart, entries, meta, why))
    return fail(why);
  return true;
}

const TensorInfo *File::find(const std::string &name) const {
  for (const TensorInfo &e : entries)
    if (e.name == name)
      return &e;
  return nullptr;
}

bool File::read(const TensorInfo &info, void *dst, std::string &error) const {
  if (!file) {
    error = "safetensors file is not open";
    return false;
  }
  if (::fseeko(file.get(), off_t(dataStart + info.begin), SEEK_SET) != 0 ||
      std::fread(dst, 1, info.bytes(), file.get()) != info.bytes()) {
    error = "cannot read tensor '" + info.name + "' from '" + filePath + "': " +
            (std::ferror(file.get()) ? std::strerror(errno)
                                     : "unexpected end of file");
    return false;
  }
  return true;
}

} // namespace safetensors
} // namespace pipec
