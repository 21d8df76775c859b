//===- SysUtil.h - files, paths and programs for the launcher -------------===//
//
// Part of pipec's launcher (pipec train, pipec-run). Plain C++ and POSIX:
// pipec-run links no LLVM and no MLIR, so that a GPU node needs only a run
// folder, pipec-run and the runtime's shared libraries (see README,
// "Running without the compiler").
//
//===----------------------------------------------------------------------===//
#ifndef PIPEC_TOOLS_PIPEC_SYSUTIL_H
#define PIPEC_TOOLS_PIPEC_SYSUTIL_H

#include <string>
#include <vector>

namespace pipec::driver::sys {

/// The absolute, normalised form of `path` (no "." or ".." left).
std::string absolute(const std::string &path);
/// "a/b/c" -> "a/b"; "c" -> "".
std::string parentPath(const std::string &path);
bool exists(const std::string &path);
/// A regular file this process may execute.
bool canExecute(const std::string &path);
/// `name` itself when it holds a '/', else the first executable `name` on
/// PATH; "" when there is none.
std::string findProgram(const std::string &name);
/// The whole file; false with `error` ("cannot read 'PATH': reason") when
/// it cannot be read.
bool readFile(const std::string &path, std::string &text, std::string &error);
/// Writes `text` to PATH.tmp and renames it to `path`, so that `path` is
/// never half-written; false with `error` on failure.
bool writeFile(const std::string &path, const std::string &text,
               std::string &error);
/// A new folder "$TMPDIR/PREFIX-XXXXXX" (/tmp without TMPDIR); "" with
/// `error` on failure.
std::string makeTempDir(const std::string &prefix, std::string &error);
/// Removes a file or a folder with everything in it (errors ignored).
void removeAll(const std::string &path);
/// `text` cut at every `separator` (empty pieces kept).
std::vector<std::string> split(const std::string &text, char separator);
std::string join(const std::vector<std::string> &pieces,
                 const std::string &separator);
} // namespace pipec::driver::sys

#endif // PIPEC_TOOLS_PIPEC_SYSUTIL_H
