//===- SysUtil.cpp - files, paths and programs for the launcher -----------===//
//
// Part of pipec's launcher; see SysUtil.h.
//
//===----------------------------------------------------------------------===//
#include "SysUtil.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <sys/stat.h>
#include <unistd.h>

namespace fs = std::filesystem;

namespace pipec::driver::sys {

std::string absolute(const std::string &path) {
  std::error_code ec;
  fs::path p = fs::absolute(path, ec);
  if (ec)
    p = path;
  std::string text = p.lexically_normal().string();
  // "dir/" -> "dir", as LLVM's remove_dots leaves it.
  while (text.size() > 1 && text.back() == '/')
    text.pop_back();
  return text;
}

std::string parentPath(const std::string &path) {
  return fs::path(path).parent_path().string();
}

bool exists(const std::string &path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool canExecute(const std::string &path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
         ::access(path.c_str(), X_OK) == 0;
}

std::string findProgram(const std::string &name) {
  if (name.empty())
    return "";
  if (name.find('/') != std::string::npos)
    return canExecute(name) ? name : "";
  const char *path = std::getenv("PATH");
  for (const std::string &dir : split(path ? path : "/usr/bin:/bin", ':')) {
    std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (canExecute(candidate))
      return candidate;
  }
  return "";
}

bool readFile(const std::string &path, std::string &text, std::string &error) {
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  if (in)
    os << in.rdbuf();
  if (!in || in.bad()) {
    error = "cannot read '" + path + "': " + std::strerror(errno ? errno : EIO);
    return false;
  }
  text = os.str();
  return true;
}

bool writeFile(const std::string &path, const std::string &text,
               std::string &error) {
  const std::string tmp = path + ".tmp";
  errno = 0;
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out || !(out << text) || !out.flush()) {
      error =
          "cannot write '" + path + "': " + std::strerror(errno ? errno : EIO);
      std::remove(tmp.c_str());
      return false;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    error = "cannot write '" + path + "': " + std::strerror(errno);
    std::remove(tmp.c_str());
    return false;
  }
  return true;
}

std::string makeTempDir(const std::string &prefix, std::string &error) {
  const char *tmp = std::getenv("TMPDIR");
  std::string pattern =
      std::string(tmp && *tmp ? tmp : "/tmp") + "/" + prefix + "-XXXXXX";
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  if (!::mkdtemp(buffer.data())) {
    error = "cannot create a folder like '" + pattern +
            "': " + std::strerror(errno);
    return "";
  }
  return buffer.data();
}

void removeAll(const std::string &path) {
  std::error_code ec;
  fs::remove_all(path, ec);
}

std::vector<std::string> split(const std::string &text, char separator) {
  std::vector<std::string> pieces;
  size_t start = 0;
  while (true) {
    size_t at = text.find(separator, start);
    pieces.push_back(text.substr(start, at - start));
    if (at == std::string::npos)
      return pieces;
    start = at + 1;
  }
}

std::string join(const std::vector<std::string> &pieces,
                 const std::string &separator) {
  std::string text;
  for (size_t i = 0; i < pieces.size(); ++i)
    text += (i ? separator : "") + pieces[i];
  return text;
}

} // namespace pipec::driver::sys
