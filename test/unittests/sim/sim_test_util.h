//===- sim_test_util.h - Profiles shared by the simulator tests -*- C++ -*-===//
//
// Part of pipec's simulator unit tests.
//
//===----------------------------------------------------------------------===//

#ifndef PIPEC_TEST_UNITTESTS_SIM_SIM_TEST_UTIL_H
#define PIPEC_TEST_UNITTESTS_SIM_SIM_TEST_UTIL_H

#include "pipec/Profile.h"

#include <cstdint>
#include <string>

namespace pipec {
namespace simtest {

/// A chain of `layers` identical layers ("Gemm" ops).
inline Profile uniformProfile(int layers, double fwd, double bwd,
                              int64_t outBytes = 0, int64_t paramBytes = 0,
                              int64_t savedBytes = 0) {
  Profile profile;
  profile.microbatch = 1;
  for (int i = 0; i < layers; ++i) {
    ProfileOp op;
    op.name = "layer" + std::to_string(i);
    op.op = "Gemm";
    op.fwdSeconds = fwd;
    op.bwdSeconds = bwd;
    op.outBytes = outBytes;
    op.paramBytes = paramBytes;
    op.savedBytes = savedBytes;
    profile.ops.push_back(op);
  }
  return profile;
}

} // namespace simtest
} // namespace pipec

#endif // PIPEC_TEST_UNITTESTS_SIM_SIM_TEST_UTIL_H
