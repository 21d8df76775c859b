//===- npy.h - NumPy .npy reader and writer ---------------------*- C++ -*-===//
//
// Part of pipec. Self-contained (standard library only, no exceptions thrown)
// so that the compiler can build npy.cpp into its own targets too.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Reads and writes NumPy's `.npy` format (versions 1.0, 2.0 and 3.0): the
/// magic `\x93NUMPY`, a version, a little-endian header length and a Python
/// dict literal `{'descr': '<f4', 'fortran_order': False, 'shape': (N, …), }`
/// followed by the raw data. Only C-order arrays of the plain little-endian
/// dtypes that training data needs are accepted by the converters.
///
/// Errors are values: functions return false and describe the problem in
/// `error` (one line, naming the file where there is one).
///
//===----------------------------------------------------------------------===//

#ifndef PIPEC_FORMATS_NPY_H
#define PIPEC_FORMATS_NPY_H

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace pipec {
namespace npy {

/// A decoded `.npy` array: the header fields and the raw data bytes.
struct Array {
  /// NumPy dtype string, e.g. "<f4".
  std::string descr;
  bool fortranOrder = false;
  std::vector<int64_t> shape;
  /// Raw element bytes, exactly numel() * itemSize(descr).
  std::vector<char> data;

  /// Number of elements (1 for a 0-d array).
  int64_t numel() const;
};

/// Bytes per element of a supported dtype string ("<f4" -> 4, "|u1" -> 1);
/// 0 for anything else (big-endian, structured, unknown).
size_t itemSize(const std::string &descr);

/// Decodes a complete `.npy` image held in memory. Rejects a bad magic, an
/// unsupported version, a malformed header, an unknown dtype, and data that
/// is shorter or longer than the header promises.
bool parse(const char *bytes, size_t size, Array &out, std::string &error);

/// Reads and decodes a `.npy` file; errors name the file.
bool readFile(const std::string &path, Array &out, std::string &error);

/// Reads only the header of a `.npy` file (dtype, order, shape; `data` left
/// empty), without reading the data; errors name the file.
bool readHeader(const std::string &path, Array &out, std::string &error);

/// Encodes an array (version 1.0 header, or 2.0 when the header does not fit
/// in 65535 bytes). `bytes` must equal numel(shape) * itemSize(descr).
bool serialize(const std::string &descr, const std::vector<int64_t> &shape,
               const void *data, size_t bytes, std::string &out,
               std::string &error);

/// Writes an array to `path` (see serialize).
bool writeFile(const std::string &path, const std::string &descr,
               const std::vector<int64_t> &shape, const void *data,
               size_t bytes, std::string &error);

/// Converts a C-order `<f4` or `<f8` array to float32.
bool toFloat32(const Array &array, std::vector<float> &out, std::string &error);

/// Converts a C-order `<f4` or `<f8` array to float64 (exact).
bool toFloat64(const Array &array, std::vector<double> &out,
               std::string &error);

/// Converts a C-order `<i8` or `<i4` array to int64.
bool toInt64(const Array &array, std::vector<int64_t> &out, std::string &error);

} // namespace npy
} // namespace pipec

#endif // PIPEC_FORMATS_NPY_H
