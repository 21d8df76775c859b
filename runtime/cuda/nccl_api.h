//===- nccl_api.h - NCCL, opened at run time ---------------------*- C++
//-*-===//
//
// Part of pipec's CUDA runtime.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// NCCL's entry points as the CUDA communicator (comm_cuda.cpp) and its
/// point-to-point path (nccl_p2p.cpp) call them: opened with dlopen, so
/// that the runtime library neither links NCCL nor needs it on a GPU node
/// that does not use it.
///
//===----------------------------------------------------------------------===//

#ifndef PIPEC_RUNTIME_CUDA_NCCL_API_H
#define PIPEC_RUNTIME_CUDA_NCCL_API_H

#include "core/error.h"

#include <dlfcn.h>
#include <nccl.h>

#include <string>

namespace pipec {
namespace cuda {

/// NCCL's entry points, opened with dlopen ("libnccl.so.2") when
/// PIPEC_NCCL=1 or PIPEC_NCCL_P2P=1 (<nccl.h> gives the signatures only: a
/// GPU node without NCCL still runs every stage).
struct Nccl {
  void *library = nullptr;
  decltype(&ncclGetUniqueId) getUniqueId = nullptr;
  decltype(&ncclCommInitRank) commInitRank = nullptr;
  decltype(&ncclAllReduce) allReduce = nullptr;
  decltype(&ncclCommDestroy) commDestroy = nullptr;
  decltype(&ncclGetErrorString) errorString = nullptr;
  decltype(&ncclCommInitRankConfig) commInitRankConfig = nullptr;
  /// Point-to-point (PIPEC_NCCL_P2P=1); null in an NCCL without them.
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  decltype(&ncclCommAbort) commAbort = nullptr;
  decltype(&ncclGroupStart) groupStart = nullptr;
  decltype(&ncclGroupEnd) groupEnd = nullptr;
  std::string why; ///< why it is not there

  /// ncclCommInitRank, blocking whatever NCCL_COMM_BLOCKING says (a
  /// non-blocking communicator would answer ncclInProgress).
  ncclResult_t init(ncclComm_t *comm, int nranks, ncclUniqueId id,
                    int rank) const {
    if (!commInitRankConfig)
      return commInitRank(comm, nranks, id, rank);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 1;
    return commInitRankConfig(comm, nranks, id, rank, &config);
  }

  bool load() {
    if (library)
      return true;
    for (const char *name : {"libnccl.so.2", "libnccl.so"})
      if ((library = dlopen(name, RTLD_NOW | RTLD_LOCAL)))
        break;
    if (!library) {
      const char *error = dlerror();
      why = error ? error : "libnccl.so.2 not found";
      return false;
    }
    getUniqueId = reinterpret_cast<decltype(getUniqueId)>(
        dlsym(library, "ncclGetUniqueId"));
    commInitRank = reinterpret_cast<decltype(commInitRank)>(
        dlsym(library, "ncclCommInitRank"));
    allReduce =
        reinterpret_cast<decltype(allReduce)>(dlsym(library, "ncclAllReduce"));
    commDestroy = reinterpret_cast<decltype(commDestroy)>(
        dlsym(library, "ncclCommDestroy"));
    errorString = reinterpret_cast<decltype(errorString)>(
        dlsym(library, "ncclGetErrorString"));
    commInitRankConfig = reinterpret_cast<decltype(commInitRankConfig)>(
        dlsym(library, "ncclCommInitRankConfig"));
    send = reinterpret_cast<decltype(send)>(dlsym(library, "ncclSend"));
    recv = reinterpret_cast<decltype(recv)>(dlsym(library, "ncclRecv"));
    commAbort =
        reinterpret_cast<decltype(commAbort)>(dlsym(library, "ncclCommAbort"));
    groupStart = reinterpret_cast<decltype(groupStart)>(
        dlsym(library, "ncclGroupStart"));
    groupEnd =
        reinterpret_cast<decltype(groupEnd)>(dlsym(library, "ncclGroupEnd"));
    if (getUniqueId && commInitRank && allReduce && commDestroy && errorString)
      return true;
    why = "the NCCL found lacks ncclGetUniqueId, ncclCommInitRank, "
          "ncclAllReduce, ncclCommDestroy or ncclGetErrorString";
    dlclose(library);
    library = nullptr;
    return false;
  }

  void check(ncclResult_t r, const std::string &what) const {
    if (r != ncclSuccess)
      throw rt::RtError(what + ": " + errorString(r));
  }
};

} // namespace cuda
} // namespace pipec

#endif // PIPEC_RUNTIME_CUDA_NCCL_API_H
