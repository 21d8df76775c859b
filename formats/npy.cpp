//===- npy.cpp - NumPy .npy reader and writer -----------------------------===//
//
// Part of pipec. Standard library only; see npy.h.
//
//===----------------------------------------------------------------------===//

#include "pipec/formats/npy.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>

namespace pipec {
namespace npy {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
/// Upper bound on the bytes of one array; keeps size arithmetic overflow-free.
constexpr uint64_t kMaxBytes = uint64_t(1) << 60;

/// Recursive-descent parser of the header's Python dict literal.
class HeaderParser {
public:
  explicit HeaderParser(const std::string &text) : text(text) {}

  bool parse(Array &out, std::string &error) {
    bool haveDescr = false, haveOrder = false, haveShape = false;
    skipSpace();
    if (!consume('{'))
      return fail("header does not start with '{'", error);
    while (true) {
      skipSpace();
      if (consume('}'))
        break;
      std::string key;
      if (!parseString(key))
        return fail("expected a quoted key in the header dict", error);
      skipSpace();
      if (!consume(':'))
        return fail("expected ':' after key '" + key + "'", error);
      skipSpace();
      if (key == "descr") {
        if (!parseString(out.descr))
          return fail("'descr' is not a string (structured dtypes are not "
                      "supported)",
                      error);
        haveDescr = true;
      } else if (key == "fortran_order") {
        if (!parseBool(out.fortranOrder))
          return fail("'fortran_order' is not True or False", error);
        haveOrder = true;
      } else if (key == "shape") {
        if (!parseShape(out.shape))
          return fail("'shape' is not a tuple of non-negative integers", error);
        haveShape = true;
      } else {
        return fail("unexpected key '" + key + "' in the header dict", error);
      }
      skipSpace();
      if (consume(','))
        continue;
      if (consume('}'))
        break;
      return fail("expected ',' or '}' in the header dict", error);
    }
    skipSpace();
    if (pos != text.size())
      return fail("unexpected text after the header dict", error);
    if (!haveDescr || !haveOrder || !haveShape)
      return fail("header lacks one of 'descr', 'fortran_order', 'shape'",
                  error);
    return true;
  }

private:
  static bool fail(const std::string &message, std::string &error) {
    error = "malformed header: " + message;
    return false;
  }

  void skipSpace() {
    while (pos < text.size() && (text[pos] == ' ' || text[pos] == '\n' ||
                                 text[pos] == '\t' || text[pos] == '\r'))
      ++pos;
  }

  bool consume(char c) {
    if (pos < text.size() && text[pos] == c) {
      ++pos;
      return true;
    }
    return false;
  }

  bool parseString(std::string &out) {
    if (pos >= text.size() || (text[pos] != '\'' && text[pos] != '"'))
      return false;
    char quote = text[pos++];
    out.clear();
    while (pos < text.size() && text[pos] != quote) {
      if (text[pos] == '\\')
        return false; // numpy never escapes in dtype strings or keys
      out += text[pos++];
    }
    return consume(quote);
  }

  bool parseBool(bool &out) {
    if (text.compare(pos, 4, "True") == 0) {
      pos += 4;
      out = true;
      return true;
    }
    if (text.compare(pos, 5, "False") == 0) {
      pos += 5;
      out = false;
      return true;
    }
    return false;
  }

  bool parseInt(int64_t &out) {
    size_t start = pos;
    uint64_t value = 0;
    while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') {
      value = value * 10 + uint64_t(text[pos] - '0');
      if (value > kMaxBytes)
        return false;
      ++pos;
    }
    if (pos == start)
      return false;
    consume('L'); // Python 2 long literals
    out = int64_t(value);
    return true;
  }

  bool parseShape(std::vector<int64_t> &shape) {
    shape.clear();
    if (!consume('('))
      return false;
    while (true) {
      skipSpace();
      if (consume(')'))
        return true;
      int64_t dim;
      if (!parseInt(dim))
        return false;
      shape.push_back(dim);
      skipSpace();
      if (consume(','))
        continue;
      if (consume(')'))
        return true;
      return false;
    }
  }

  const std::string &text;
  size_t pos = 0;
};

/// numel(shape) * itemSize, or false when it exceeds kMaxBytes.
bool byteCount(const std::vector<int64_t> &shape, size_t item, uint64_t &out) {
  uint64_t n = item;
  for (int64_t d : shape) {
    if (d < 0)
      return false;
    if (d != 0 && n > kMaxBytes / uint64_t(d))
      return false;
    n *= uint64_t(d);
  }
  out = n;
  return true;
}

uint32_t readLE(const unsigned char *p, size_t n) {
  uint32_t v = 0;
  for (size_t i = 0; i < n; ++i)
    v |= uint32_t(p[i]) << (8 * i);
  return v;
}

std::string shapeString(const std::vector<int64_t> &shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    s += std::to_string(shape[i]);
    if (i + 1 < shape.size() || shape.size() == 1)
      s += ",";
    if (i + 1 < shape.size())
      s += " ";
  }
  return s + ")";
}

struct FileCloser {
  void operator()(std::FILE *f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

} // namespace

int64_t Array::numel() const {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

size_t itemSize(const std::string &descr) {
  if (descr == "<f4" || descr == "<i4" || descr == "<u4")
    return 4;
  if (descr == "<f8" || descr == "<i8" || descr == "<u8")
    return 8;
  if (descr == "<f2" || descr == "<i2" || descr == "<u2")
    return 2;
  if (descr == "|u1" || descr == "|i1" || descr == "|b1")
    return 1;
  return 0;
}

namespace {
/// The header of a `.npy` image (`out` without data) and where its data
/// begins; `size` may be the header's part of the file only.
bool parseHeaderOf(const char *bytes, size_t size, Array &out,
                   size_t &dataOffset, std::string &error) {
  const auto *p = reinterpret_cast<const unsigned char *>(bytes);
  if (size < kMagicLen + 2 || std::memcmp(bytes, kMagic, kMagicLen) != 0) {
    error = "not a .npy file (bad magic; expected \\x93NUMPY)";
    return false;
  }
  unsigned major = p[6], minor = p[7];
  size_t lenBytes;
  if (major == 1)
    lenBytes = 2;
  else if (major == 2 || major == 3)
    lenBytes = 4;
  else {
    error = "unsupported .npy version " + std::to_string(major) + "." +
            std::to_string(minor);
    return false;
  }
  size_t prefix = kMagicLen + 2 + lenBytes;
  if (size < prefix) {
    error = "truncated header";
    return false;
  }
  size_t headerLen = readLE(p + kMagicLen + 2, lenBytes);
  if (size - prefix < headerLen) {
    error = "truncated header (header length " + std::to_string(headerLen) +
            ", file has " + std::to_string(size - prefix) + " bytes after it)";
    return false;
  }
  std::string header(bytes + prefix, headerLen);
  Array array;
  if (!HeaderParser(header).parse(array, error))
    return false;
  if (itemSize(array.descr) == 0) {
    error = "unsupported dtype '" + array.descr +
            "' (little-endian numeric dtypes only)";
    return false;
  }
  dataOffset = prefix + headerLen;
  out = std::move(array);
  return true;
}
} // namespace

bool parse(const char *bytes, size_t size, Array &out, std::string &error) {
  Array array;
  size_t dataOffset = 0;
  if (!parseHeaderOf(bytes, size, array, dataOffset, error))
    return false;
  uint64_t expected;
  if (!byteCount(array.shape, itemSize(array.descr), expected)) {
    error = "shape " + shapeString(array.shape) + " is too large";
    return false;
  }
  uint64_t have = size - dataOffset;
  if (have < expected) {
    error = "truncated data: shape " + shapeString(array.shape) + " of '" +
            array.descr + "' needs " + std::to_string(expected) +
            " bytes, the file has " + std::to_string(have);
    return false;
  }
  if (have > expected) {
    error = std::to_string(have - expected) +
            " unexpected bytes after the data of shape " +
            shapeString(array.shape);
    return false;
  }
  array.data.assign(bytes + dataOffset, bytes + size);
  out = std::move(array);
  return true;
}

bool readHeader(const std::string &path, Array &out, std::string &error) {
  FilePtr f(std::fopen(path.c_str(), "rb"));
  if (!f) {
    error = "cannot open '" + path + "': " + std::strerror(errno);
    return false;
  }
  // A version 1 header is at most 65535 + 10 bytes; a larger one (version
  // 2 or 3) is read whole below.
  std::vector<char> bytes(65536 + 16);
  bytes.resize(std::fread(bytes.data(), 1, bytes.size(), f.get()));
  size_t dataOffset = 0;
  std::string why;
  if (bytes.size() >= kMagicLen + 2 + 4 && bytes[6] >= 2 &&
      std::memcmp(bytes.data(), kMagic, kMagicLen) == 0) {
    size_t need = kMagicLen + 2 + 4 +
                  readLE(reinterpret_cast<const unsigned char *>(bytes.data() +
                                                                 kMagicLen + 2),
                         4);
    if (need > bytes.size() && need < (size_t(1) << 30)) {
      size_t had = bytes.size();
      bytes.resize(need);
      bytes.resize(had +
                   std::fread(bytes.data() + had, 1, need - had, f.get()));
    }
  }
  if (!parseHeaderOf(bytes.data(), bytes.size(), out, dataOffset, why)) {
    error = "'" + path + "' is not a valid .npy file: " + why;
    return false;
  }
  return true;
}

bool readFile(const std::string &path, Array &out, std::string &error) {
  FilePtr f(std::fopen(path.c_str(), "rb"));
  if (!f) {
    error = "cannot open '" + path + "': " + std::strerror(errno);
    return false;
  }
  std::vector<char> bytes;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f.get())) > 0)
    bytes.insert(bytes.end(), buf, buf + n);
  if (std::ferror(f.get())) {
    error = "cannot read '" + path + "': " + std::strerror(errno);
    return false;
  }
  std::string why;
  if (!parse(bytes.data(), bytes.size(), out, why)) {
    error = "'" + path + "' is not a valid .npy file: " + why;
    return false;
  }
  return true;
}

bool serialize(const std::string &descr, const std::vector<int64_t> &shape,
               const void *data, size_t bytes, std::string &out,
               std::string &error) {
  size_t item = itemSize(descr);
  uint64_t expected;
  if (item == 0) {
    error = "unsupported dtype '" + descr + "'";
    return false;
  }
  if (!byteCount(shape, item, expected) || expected != bytes) {
    error = "data size " + std::to_string(bytes) + " does not match shape " +
            shapeString(shape) + " of '" + descr + "'";
    return false;
  }
  std::string dict =
      "{'descr': '" + descr +
      "', 'fortran_order': False, 'shape': " + shapeString(shape) + ", }";
  // Pad with spaces so that the data starts on a 64-byte boundary; the
  // header ends with a newline. Version 2.0 only when 1.0's 16-bit header
  // length does not suffice.
  size_t lenBytes = 2, prefix = 0, headerLen = 0;
  auto layout = [&] {
    prefix = kMagicLen + 2 + lenBytes;
    headerLen = (prefix + dict.size() + 1 + 63) / 64 * 64 - prefix;
  };
  layout();
  if (headerLen > 65535) {
    lenBytes = 4;
    layout();
  }
  dict.append(headerLen - dict.size() - 1, ' ');
  dict += '\n';
  out.assign(kMagic, kMagicLen);
  out += char(lenBytes == 2 ? 1 : 2);
  out += char(0);
  for (size_t i = 0; i < lenBytes; ++i)
    out += char((headerLen >> (8 * i)) & 0xff);
  out += dict;
  out.append(static_cast<const char *>(data), bytes);
  return true;
}

bool writeFile(const std::string &path, const std::string &descr,
               const std::vector<int64_t> &shape, const void *data,
               size_t bytes, std::string &error) {
  std::string image;
  if (!serialize(descr, shape, data, bytes, image, error))
    return false;
  FilePtr f(std::fopen(path.c_str(), "wb"));
  if (!f ||
      std::fwrite(image.data(), 1, image.size(), f.get()) != image.size()) {
    error = "cannot write '" + path + "': " + std::strerror(errno);
    return false;
  }
  if (std::fclose(f.release()) != 0) {
    error = "cannot write '" + path + "': " + std::strerror(errno);
    return false;
  }
  return true;
}

namespace {
/// A C-order `<f4` or `<f8` array as T (float64 -> float32 rounds).
template <class T>
bool toReal(const Array &array, std::vector<T> &out, std::string &error) {
  if (array.fortranOrder) {
    error = "array is in Fortran order; save it in C order "
            "(numpy.ascontiguousarray)";
    return false;
  }
  size_t n = size_t(array.numel());
  out.resize(n);
  auto convert = [&](auto source) {
    for (size_t i = 0; i < n; ++i) {
      decltype(source) v;
      std::memcpy(&v, array.data.data() + i * sizeof v, sizeof v);
      out[i] = T(v);
    }
  };
  if (array.descr == "<f4") {
    convert(float());
    return true;
  }
  if (array.descr == "<f8") {
    convert(double());
    return true;
  }
  error =
      "dtype '" + array.descr + "' is not float32 or float64 ('<f4' or '<f8')";
  return false;
}
} // namespace

bool toFloat32(const Array &array, std::vector<float> &out,
               std::string &error) {
  return toReal(array, out, error);
}

bool toFloat64(const Array &array, std::vector<double> &out,
               std::string &error) {
  return toReal(array, out, error);
}

bool toInt64(const Array &array, std::vector<int64_t> &out,
             std::string &error) {
  if (array.fortranOrder) {
    error = "array is in Fortran order; save it in C order "
            "(numpy.ascontiguousarray)";
    return false;
  }
  size_t n = size_t(array.numel());
  out.resize(n);
  if (array.descr == "<i8") {
    std::memcpy(out.data(), array.data.data(), n * sizeof(int64_t));
    return true;
  }
  if (array.descr == "<i4") {
    for (size_t i = 0; i < n; ++i) {
      int32_t v;
      std::memcpy(&v, array.data.data() + i * sizeof(int32_t), sizeof(v));
      out[i] = v;
    }
    return true;
  }
  error = "dtype '" + array.descr + "' is not int64 or int32 ('<i8' or '<i4')";
  return false;
}

} // namespace npy
} // namespace pipec
