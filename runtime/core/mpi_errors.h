//===- mpi_errors.h - MPI failures as RtErrors ------------------*- C++ -*-===//
//
// Part of pipec's runtime core.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The errors the MPI-based communicators report (core/comm_mpi.cpp, and
/// the CUDA communicator's IPC path, runtime/cuda/comm_cuda.cpp), worded
/// alike.
///
//===----------------------------------------------------------------------===//

#ifndef PIPEC_RUNTIME_CORE_MPI_ERRORS_H
#define PIPEC_RUNTIME_CORE_MPI_ERRORS_H

#include "core/error.h"
#include "core/mpi_c.h"

#include <cstdint>
#include <string>

namespace pipec {
namespace rt {

/// Throws RtError "<what>: <call> failed: <MPI's text>" unless `rc` is
/// MPI_SUCCESS.
inline void mpiCheck(int rc, const char *call, const std::string &what) {
  if (rc == MPI_SUCCESS)
    return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw RtError(what + ": " + call +
                " failed: " + std::string(text, size_t(len)));
}

/// A received message of `got` bytes where `expected` were: both sizes.
inline std::string sizeMismatch(const std::string &what, int64_t got,
                                int64_t expected) {
  return what + ": received " + std::to_string(got) + " bytes but expected " +
         std::to_string(expected) +
         " (sender and receiver disagree on the tensor size)";
}

} // namespace rt
} // namespace pipec

#endif // PIPEC_RUNTIME_CORE_MPI_ERRORS_H
