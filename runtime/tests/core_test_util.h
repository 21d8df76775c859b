//===- core_test_util.h - Helpers for the runtime core tests ----*- C++ -*-===//
//
// Part of pipec's runtime tests.
//
//===----------------------------------------------------------------------===//

#ifndef PIPEC_RUNTIME_TESTS_CORE_TEST_UTIL_H
#define PIPEC_RUNTIME_TESTS_CORE_TEST_UTIL_H

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>

namespace pipec {
namespace coretest {

/// A fresh temporary folder, removed with its contents on destruction.
class TempDir {
public:
  TempDir() {
    std::string base = ::testing::TempDir();
    std::string pattern = base +
                          (base.empty() || base.back() != '/' ? "/" : "") +
                          "pipec-core-XXXXXX";
    char *made = ::mkdtemp(pattern.data());
    if (!made)
      std::abort();
    dir = made;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  TempDir(const TempDir &) = delete;
  TempDir &operator=(const TempDir &) = delete;

  /// `name` inside the folder.
  std::string operator/(const std::string &name) const {
    return (dir / name).string();
  }
  const std::filesystem::path &path() const { return dir; }

private:
  std::filesystem::path dir;
};

inline void writeBytes(const std::string &path, const std::string &bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

inline std::string readBytes(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// Names of the entries of a folder.
inline std::set<std::string> listDir(const std::filesystem::path &dir) {
  std::set<std::string> names;
  for (const auto &entry : std::filesystem::directory_iterator(dir))
    names.insert(entry.path().filename().string());
  return names;
}

} // namespace coretest
} // namespace pipec

#endif // PIPEC_RUNTIME_TESTS_CORE_TEST_UTIL_H
