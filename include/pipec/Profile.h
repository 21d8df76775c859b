//===- Profile.h - Per-op cost profiles (pipec.profile/1) -------*- C++ -*-===//
//
// The profile a runtime run writes and the planners read (DESIGN.md §7).
// Plain C++, no MLIR.
//
//===----------------------------------------------------------------------===//
#ifndef PIPEC_PROFILE_H
#define PIPEC_PROFILE_H

#include <cstdint>
#include <string>
#include <vector>

namespace pipec {

/// One op (or whole layer) of a profile, in topological order.
struct ProfileOp {
  std::string name;
  std::string op;
  double fwdSeconds = 0;
  double bwdSeconds = 0;
  int64_t outBytes = 0;
  int64_t paramBytes = 0;
  int64_t savedBytes = 0;
  /// Indices of the producing ops. Empty means "the previous op" (a chain).
  std::vector<int> inputs;
};

struct Profile {
  std::string device = "cpu";
  int64_t microbatch = 1;
  std::vector<ProfileOp> ops;

  /// Producers of op i with the chain default applied (op i-1 when the
  /// list is empty and i > 0).
  std::vector<int> producersOf(int i) const;
};

struct ProfileResult {
  bool ok = false;
  Profile profile;
  std::string error;
};

/// Parses `pipec.profile/1` JSON. `inputs` may hold op names or indices.
/// Rejects a wrong or missing format tag, negative times or sizes, unknown
/// or forward-referencing inputs, with a message naming the op.
ProfileResult profileFromJson(const std::string &text);
/// Serialises a profile; `inputs` are written as op names.
std::string profileToJson(const Profile &profile);

} // namespace pipec

#endif // PIPEC_PROFILE_H
