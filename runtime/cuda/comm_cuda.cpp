//===- comm_cuda.cpp - The communicator of CUDA stages: MPI, IPC, NCCL ----===//
//
// Part of pipec's CUDA runtime.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The communicator of CUDA stage executables (`makeCudaCommunicator`): the
/// MPI communicator (core/comm_mpi.cpp) for the job, host values and every
/// tensor, except that
///  - the tensors between two ranks on the same GPU move through CUDA IPC
///    instead of host memory (below; `PIPEC_CUDA_IPC=0` turns it off);
///  - with `PIPEC_NCCL=1` the sums over a group (a stage's replicas, the
///    stages of tied weights) whose ranks each have a GPU of their own go
///    by ncclAllReduce on the kernels' stream, then cuBLAS's scal for the
///    scale. NCCL is opened with dlopen; its communicator is made at the
///    group's first sum, bootstrapped over MPI (the first member's unique
///    id reaches the others through the MPI group's own sum). A group with
///    two ranks on one GPU (NCCL refuses it) keeps MPI;
///  - with `PIPEC_NCCL_P2P=1`, where every rank has a GPU of its own, every
///    tensor message goes by ncclSend / ncclRecv (nccl_p2p.h: NCCL pairs
///    messages by order, the runtime's contract by tag).
/// At start-up the ranks sharing a GPU try CUDA IPC once (probeIpc); a
/// pair that cannot open each other's memory keeps host memory.
/// CUDA IPC is on by default since the GPU suite of 2026-11-27 (an H200:
/// the communicator contract, five e2e cases bit for bit as host-staged,
/// and the 4-stage GPT 5.6% faster). NCCL stays opt-in: the machines lent
/// to this project have one GPU, where NCCL can only make groups of one
/// rank (the communicator contract checks those, and they passed there),
/// so a sum between two GPUs by NCCL has never run.
///
/// Which GPU: every rank publishes its host name, its GPU's UUID and PCI
/// bus id when the device is set (`useDevice`, an allgather over MPI). For
/// IPC a peer with the same host and UUID shares the GPU (a MIG instance
/// has a UUID of its own, and instances cannot open each other's memory).
/// For NCCL the key is the host (NCCL_HOSTID where set) and bus id, as
/// NCCL's own duplicate check has it.
///
/// CUDA IPC: the host-staged path costs a copy to the host, MPI's copy and
/// a copy back (3.3 GB/s between two ranks sharing an H200, 2026-11-27);
/// this one copy on the GPU.
///
/// A message of `bytes` from rank A to rank B, tag T:
///  1. A takes a staging slot of its own for B (device memory from
///     cudaMalloc, one allocation per slot, so that its IPC handle is the
///     allocation's; a slot is reused once B acknowledged its last read,
///     and A's stream first waits for B's "read" event of that slot),
///     copies the source into it on its stream and records the slot's
///     interprocess "written" event: the source may be overwritten by any
///     later work of A's stream, as `send` promises;
///  2. A sends B a control record (the size, the slot's id, and on the
///     slot's first use its memory and event handles) over MPI on a
///     communicator of its own (MPI_Comm_dup), with tag T: MPI keeps the
///     records of one tag in order, so the messages are;
///  3. B receives the record (blocking, as a host-staged receive would),
///     checks the size, opens the slot's handles on first use, makes its
///     stream wait for "written", copies the slot into the destination on
///     its stream and records its own interprocess "read" event for the
///     slot, then sends A an acknowledgement (the slot, and on first use
///     the read event's handle) on a second duplicated communicator.
/// Neither side's host waits for the GPU: the order is kept by the two
/// events on the device. A slot is kept until the job ends, so a rank
/// holds at most the bytes it had in flight to each peer at once (what
/// the host-staged path holds in page-locked staging). A receive of
/// another size than sent, blocking or posted, reports both sizes and
/// leaves the message to be received with its own size. At the end
/// (`finalize`, every rank) each rank takes the acknowledgements still on
/// their way (it learns how many from an allgather), closes what it
/// imported, and only after a barrier frees what it exported.
/// Acknowledgements are taken without CUDA calls (`progress` may run
/// inside a stream capture); a slot's read event is opened in `send`.
///
//===----------------------------------------------------------------------===//

#include "core/communicator.h"
#include "core/device.h"
#include "core/error.h"
#include "core/mpi_c.h"
#include "core/mpi_errors.h"
#include "core/options.h"
#include "cuda_rt.h"
#include "device_factory.h"
#include "nccl_api.h"
#include "nccl_p2p.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <unistd.h>
#include <vector>

namespace pipec {
namespace cuda {
namespace {

using rt::CommGroup;
using rt::Communicator;
using rt::Device;
using rt::mpiCheck;
using rt::PostedReceive;
using rt::ReduceOp;
using rt::RtError;
using rt::sizeMismatch;
using rt::switchedOn;
using rt::Transfer;

constexpr uint32_t kMagic = 0x70697063; // "pipc"

/// What A sends B per message (step 2 above).
struct Control {
  uint32_t magic = kMagic;
  int32_t slot = -1; ///< -1: an empty message, no slot
  int64_t bytes = 0;
  int32_t firstUse = 0; ///< the handles below are set
  int32_t pad = 0;
  cudaIpcMemHandle_t memory{};
  cudaIpcEventHandle_t written{};
};

/// What B sends A once its read of a slot is queued (step 3).
struct Ack {
  int32_t slot = -1;
  int32_t firstUse = 0;
  cudaIpcEventHandle_t read{};
};

/// A sender's slot for one peer.
struct Slot {
  char *data = nullptr;
  int64_t capacity = 0;
  cudaEvent_t written = nullptr;
  /// The peer's read event of this slot, opened (in `send`, never during
  /// a stream capture) from the handle its first ack brought.
  cudaEvent_t read = nullptr;
  cudaIpcEventHandle_t readHandle{};
  bool readHandleCame = false;
  bool busy = false, sent = false, readSinceWait = false;
};

/// A receiver's view of a peer's slot.
struct Opened {
  char *data = nullptr;
  cudaEvent_t written = nullptr;
  cudaEvent_t read = nullptr; ///< this rank's, exported in the first ack
  bool acked = false;
};

/// A control record in flight (the send's transfer).
class IpcTransfer : public Transfer {
public:
  Control control;
  MPI_Request request = MPI_REQUEST_NULL;
  std::string what;
  bool test() override {
    int flag = 0;
    mpiCheck(MPI_Test(&request, &flag, MPI_STATUS_IGNORE), "MPI_Test", what);
    return flag != 0;
  }
  void wait() override {
    mpiCheck(MPI_Wait(&request, MPI_STATUS_IGNORE), "MPI_Wait", what);
  }
};

/// A group of the CUDA communicator: the MPI group, and a NCCL
/// communicator over the same ranks when every member has a GPU of its own
/// (made at the group's first sum).
class CudaGroup final : public CommGroup {
public:
  CudaGroup(std::unique_ptr<CommGroup> mpi, std::vector<int> members, int index,
            const Nccl &nccl)
      : mpi(std::move(mpi)), members(std::move(members)), index(index),
        nccl_(nccl) {}
  ~CudaGroup() override {
    if (comm)
      nccl_.commDestroy(comm);
  }
  int size() const override { return mpi->size(); }

  std::unique_ptr<CommGroup> mpi;
  /// The members' world ranks in the group's order (key, then rank, as
  /// MPI_Comm_split orders them), and this rank's place among them.
  std::vector<int> members;
  int index = -1;
  bool decided = false;
  ncclComm_t comm = nullptr;

private:
  const Nccl &nccl_;
};

class CudaCommunicator;

/// A posted receive of the NCCL path: NCCL's order is the sender's, so the
/// receive is queued when the program asks for the message (nccl_p2p.h).
class NcclPostedReceive : public PostedReceive {
public:
  NcclPostedReceive(NcclP2p &p2p, int64_t bytes, int peer, int tag,
                    std::string what)
      : p2p_(p2p), bytes_(bytes), peer_(peer), tag_(tag),
        what_(std::move(what)) {}
  void finish(void *dst) override {
    p2p_.receive(dst, bytes_, peer_, tag_, what_);
  }
  int64_t stagingBytes() const override { return 0; }

private:
  NcclP2p &p2p_;
  int64_t bytes_;
  int peer_, tag_;
  std::string what_;
};

class IpcPostedReceive : public PostedReceive {
public:
  IpcPostedReceive(CudaCommunicator &owner, int64_t bytes, int peer, int tag,
                   std::string what)
      : owner_(owner), bytes_(bytes), peer_(peer), tag_(tag),
        what_(std::move(what)) {}
  Control control;
  MPI_Request request = MPI_REQUEST_NULL;
  void finish(void *dst) override;
  int64_t stagingBytes() const override { return 0; }

private:
  CudaCommunicator &owner_;
  int64_t bytes_;
  int peer_, tag_;
  std::string what_;
};

class CudaCommunicator final : public Communicator {
public:
  explicit CudaCommunicator(std::unique_ptr<Communicator> inner)
      : inner_(std::move(inner)) {}

  std::string name() const override {
    return inner_->name() +
           (ipcPeers_ ? " + CUDA IPC between ranks sharing a GPU" : "") +
           (ncclUsed_ ? " + NCCL sums where a group's ranks have GPUs of "
                        "their own"
                      : "") +
           (p2p_ ? " + NCCL messages" : "");
  }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  int localRank() const override { return inner_->localRank(); }
  int localSize() const override { return inner_->localSize(); }
  int tagUpperBound() const override { return inner_->tagUpperBound(); }

  void useDevice(Device &device) override {
    inner_->useDevice(device);
    device_ = &device;
    const bool ipc = switchedOn("PIPEC_CUDA_IPC", true,
                                "CUDA IPC between ranks sharing a GPU",
                                "every tensor through host memory");
    const bool ncclWanted = switchedOn(
        "PIPEC_NCCL", false,
        "sums over groups of ranks on GPUs of their own by NCCL", "by MPI");
    const bool p2pWanted = switchedOn(
        "PIPEC_NCCL_P2P", false,
        "tensors between ranks on GPUs of their own by ncclSend/ncclRecv",
        "by MPI or CUDA IPC");
    const bool ncclLoaded = (ncclWanted || p2pWanted) && nccl_.load();
    if ((ncclWanted || p2pWanted) && !ncclLoaded)
      std::fprintf(stderr,
                   "pipec-rt: note: %s but NCCL cannot be opened (%s): it "
                   "is not used\n",
                   ncclWanted ? "PIPEC_NCCL=1" : "PIPEC_NCCL_P2P=1",
                   nccl_.why.c_str());
    const bool p2pReady = p2pWanted && ncclLoaded && nccl_.send && nccl_.recv &&
                          !std::getenv("NCCL_COMM_ID");
    // Every rank takes part in the allgather, so that the choice is the
    // same on both sides of every pair (each rank reads the variable the
    // launcher exported to all). The GPU is named by its UUID (one per MIG
    // instance, whose instances share a bus id and cannot open each
    // other's memory) and the host's name.
    int ordinal = -1;
    check(cudaGetDevice(&ordinal), "CUDA IPC: the current GPU");
    cudaDeviceProp prop;
    check(cudaGetDeviceProperties(&prop, ordinal), "CUDA IPC: the GPU's UUID");
    std::string uuid;
    for (unsigned char byte : prop.uuid.bytes) {
      static const char hex[] = "0123456789abcdef";
      uuid += hex[byte >> 4];
      uuid += hex[byte & 15];
    }
    char host[256] = {0};
    gethostname(host, sizeof host - 1);
    char bus[64] = {0};
    check(cudaDeviceGetPCIBusId(bus, sizeof bus - 1, ordinal),
          "the CUDA communicator: the GPU's PCI bus id");
    // NCCL's own duplicate check compares its host hash, which it takes
    // from NCCL_HOSTID when that is set (else the host), and the bus id.
    // Mirrored here, so that ranks given hosts of their own by NCCL_HOSTID
    // on one GPU (the GPU suite's way to run NCCL between two ranks on a
    // one-GPU machine, over its socket transport) use NCCL as it lets them.
    const char *hostId = std::getenv("NCCL_HOSTID");
    std::string ncclHost = hostId ? hostId : host;
    std::replace(ncclHost.begin(), ncclHost.end(), '|', '_');
    // "IPC mode, NCCL mode, NCCL opened, NCCL P2P mode, NCCL's ncclSend
    // and ncclRecv found|bus id|NCCL's host|host|UUID" of every rank.
    const std::string gpu = std::string(host) + "|" + uuid;
    const std::string mine =
        std::string(ipc ? "1" : "0") + (ncclWanted ? "1" : "0") +
        (ncclLoaded ? "1" : "0") + (p2pWanted ? "1" : "0") +
        (p2pReady ? "1" : "0") + "|" + std::string(bus) + "|" + ncclHost + "|" +
        gpu;
    constexpr size_t kFlags = 5;
    const std::vector<std::string> all = inner_->allgather(
        mine, "the CUDA communicator: which ranks share a GPU");
    samePeer_.assign(all.size(), false);
    ncclGpuOf_.assign(all.size(), "");
    bool everyoneOpenedNccl = true, everyoneHasP2p = true;
    for (size_t r = 0; r < all.size(); ++r) {
      const size_t busEnd = all[r].find('|', kFlags + 1);
      const size_t ncclHostEnd = all[r].find('|', busEnd + 1);
      const std::string gpuOfR = all[r].substr(ncclHostEnd + 1);
      ncclGpuOf_[r] = all[r].substr(busEnd + 1, ncclHostEnd - busEnd - 1) +
                      "|" +
                      all[r].substr(kFlags + 1,
                                    busEnd - kFlags - 1); // host|bus id
      everyoneOpenedNccl = everyoneOpenedNccl && all[r][2] == '1';
      everyoneHasP2p = everyoneHasP2p && all[r][4] == '1';
      if (int(r) == rank())
        continue;
      for (auto [at, variable] :
           {std::pair{0, "PIPEC_CUDA_IPC"}, std::pair{1, "PIPEC_NCCL"},
            std::pair{3, "PIPEC_NCCL_P2P"}})
        if (all[r][size_t(at)] != mine[size_t(at)])
          throw RtError(std::string(variable) + " differs between rank " +
                        std::to_string(rank()) + " (" + mine[size_t(at)] +
                        ") and rank " + std::to_string(r) + " (" +
                        all[r][size_t(at)] + ")");
      samePeer_[r] = ipc && gpuOfR == gpu;
    }
    // Ranks sharing a GPU try CUDA IPC once first (every rank takes part:
    // the same decision everywhere, from the allgathered records).
    std::vector<std::string> gpuOfRank;
    for (const std::string &record : all)
      gpuOfRank.push_back(record.substr(
          record.find('|', record.find('|', kFlags + 1) + 1) + 1));
    if (ipc &&
        std::set<std::string>(gpuOfRank.begin(), gpuOfRank.end()).size() !=
            gpuOfRank.size())
      probeIpc();
    ipcPeers_ = int(std::count(samePeer_.begin(), samePeer_.end(), true));
    ncclOn_ = ncclWanted && everyoneOpenedNccl;
    stream_ = context(device.kernelContext(), "the CUDA communicator").stream;
    // NCCL's messages: a communicator per ordered pair of ranks, so every
    // rank needs a GPU of its own as NCCL tells them apart (the same
    // decision on every rank: it is made from the allgathered records).
    if (p2pWanted) {
      const std::set<std::string> gpus(ncclGpuOf_.begin(), ncclGpuOf_.end());
      const char *whyNot =
          !everyoneHasP2p
              ? "on some rank NCCL or its ncclSend/ncclRecv is missing, or "
                "NCCL_COMM_ID is set (which would give every pair's "
                "communicator the same id)"
          : gpus.size() != ncclGpuOf_.size()
              ? "some ranks share a GPU (NCCL refuses them; NCCL_HOSTID "
                "tells them apart for a test)"
              : nullptr;
      if (whyNot) {
        if (rank() == 0)
          std::fprintf(stderr,
                       "pipec-rt: note: PIPEC_NCCL_P2P=1 but %s: the tensors "
                       "go by MPI or CUDA IPC\n",
                       whyNot);
      } else {
        p2p_ = std::make_unique<NcclP2p>(nccl_, stream_, rank(), size());
        p2p_->start(*inner_);
      }
    }
    // (Collective over every rank: with the variable on, each makes the
    // two communicators, whether it has a peer on its GPU or not.)
    if (!ipc)
      return;
    mpiCheck(MPI_Comm_dup(MPI_COMM_WORLD, &control_), "MPI_Comm_dup",
             "CUDA IPC: its control records");
    mpiCheck(MPI_Comm_dup(MPI_COMM_WORLD, &acks_), "MPI_Comm_dup",
             "CUDA IPC: its acknowledgements");
    MPI_Comm_set_errhandler(control_, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(acks_, MPI_ERRORS_RETURN);
  }

  void finalize() override {
    // Both closes below are collective (NCCL's destroy, IPC's barriers). A
    // rank whose part fails (a device in a bad state) cannot finish it, and
    // its peers would wait in it for ever (the watchdog has stopped by
    // now): it ends the job instead, saying why. The job's result is
    // already out by then.
    auto closeOrEndJob = [&](const char *what, auto close) {
      try {
        close();
      } catch (const std::exception &e) {
        std::fprintf(stderr,
                     "pipec-rt: error: closing %s: %s (rank %d); ending the "
                     "job, whose other ranks wait in the same close\n",
                     what, e.what(), rank());
        inner_->abort(1);
      }
    };
    if (p2p_)
      closeOrEndJob("NCCL's messages", [&] { p2p_->finish(*inner_); });
    closeOrEndJob("CUDA IPC", [&] { closeIpc(); });
    inner_->finalize();
  }

  /// Whether each pair of ranks sharing a GPU can open each other's CUDA
  /// IPC memory (it cannot in some containers, or where the processes do
  /// not see each other): each rank exports a small allocation, opens its
  /// peers', and a pair keeps CUDA IPC only where both directions worked;
  /// the others' tensors go through host memory, with a note. Collective
  /// over every rank.
  void probeIpc() {
    const int n = size();
    // (A message exports both: memory and an interprocess event.)
    struct Exported {
      cudaIpcMemHandle_t handle;
      cudaIpcEventHandle_t event;
      int32_t ok;
    } mine{};
    void *probe = nullptr;
    cudaEvent_t event = nullptr;
    const bool allocated = cudaMalloc(&probe, 256) == cudaSuccess;
    const bool eventMade =
        cudaEventCreateWithFlags(&event, cudaEventDisableTiming |
                                             cudaEventInterprocess) ==
        cudaSuccess;
    mine.ok = allocated && eventMade &&
              cudaIpcGetMemHandle(&mine.handle, probe) == cudaSuccess &&
              cudaIpcGetEventHandle(&mine.event, event) == cudaSuccess;
    std::string why = mine.ok ? ""
                              : std::string("exporting: ") +
                                    cudaGetErrorString(cudaGetLastError());
    std::vector<Exported> all(static_cast<size_t>(n));
    inner_->allgather(&mine, int(sizeof mine), all.data(),
                      "CUDA IPC: trying it between ranks sharing a GPU");
    std::vector<char> opened(static_cast<size_t>(n), 0);
    for (int r = 0; r < n; ++r) {
      if (!samePeer_[size_t(r)] || !all[size_t(r)].ok)
        continue;
      void *mapped = nullptr;
      cudaEvent_t theirs = nullptr;
      cudaError_t e = cudaIpcOpenMemHandle(&mapped, all[size_t(r)].handle,
                                           cudaIpcMemLazyEnablePeerAccess);
      if (e == cudaSuccess) {
        e = cudaIpcOpenEventHandle(&theirs, all[size_t(r)].event);
        if (e == cudaSuccess)
          cudaEventDestroy(theirs);
        cudaIpcCloseMemHandle(mapped);
      }
      if (e == cudaSuccess) {
        opened[size_t(r)] = 1;
      } else {
        cudaGetLastError(); // (not a sticky error)
        if (why.empty())
          why = std::string("opening rank ") + std::to_string(r) +
                "'s: " + cudaGetErrorString(e);
      }
    }
    std::vector<char> matrix(size_t(n) * size_t(n));
    inner_->allgather(opened.data(), n, matrix.data(),
                      "CUDA IPC: which pairs can use it");
    if (allocated)
      cudaFree(probe); // (every peer closed it before the allgather)
    if (eventMade)
      cudaEventDestroy(event);
    for (int r = 0; r < n; ++r) {
      if (!samePeer_[size_t(r)])
        continue;
      const bool both = matrix[size_t(rank()) * size_t(n) + size_t(r)] &&
                        matrix[size_t(r) * size_t(n) + size_t(rank())];
      if (!both) {
        samePeer_[size_t(r)] = false;
        std::fprintf(stderr,
                     "pipec-rt: note: rank %d and rank %d share a GPU but "
                     "cannot open each other's CUDA IPC memory (%s): their "
                     "tensors go through host memory\n",
                     rank(), r,
                     why.empty() ? "the failure was on the other rank's side"
                                 : why.c_str());
      }
    }
  }

  /// finalize's part for the IPC path.
  void closeIpc() {
    if (control_ != MPI_COMM_NULL) {
      // (Collective, every rank.) First every acknowledgement: each rank
      // learns how many its peers sent it and takes the ones still on
      // their way, so that no message is left unmatched and every ack
      // send completes. A message never received (a receive of the wrong
      // size in a test) leaves its slot busy: counting, not waiting for
      // free slots, keeps that from hanging.
      const int n = size(), me = rank();
      std::vector<int64_t> mine(size_t(n), 0), all(size_t(n) * size_t(n), 0);
      for (int r = 0; r < n; ++r)
        mine[size_t(r)] = acksSentTo_[r];
      inner_->allgather(mine.data(), int(n * sizeof(int64_t)), all.data(),
                        "CUDA IPC: the acknowledgements sent");
      for (int r = 0; r < n; ++r)
        while (acksFrom_[r] < all[size_t(r) * size_t(n) + size_t(me)])
          takeAck(r);
      for (auto &pending : ackSends_)
        MPI_Wait(&pending.first, MPI_STATUS_IGNORE);
      ackSends_.clear();
      // Every copy out of a peer's slot is done; then what this rank
      // imported is closed everywhere before anything exported is freed
      // (freeing an exported allocation or event while another process
      // still has it open is undefined).
      device_->synchronize();
      MPI_Barrier(control_);
      for (auto &[key, o] : opened_) {
        if (o.data)
          cudaIpcCloseMemHandle(o.data);
        if (o.written)
          cudaEventDestroy(o.written);
      }
      for (auto &[peer, slots] : slots_)
        for (Slot &slot : slots)
          if (slot.read)
            cudaEventDestroy(slot.read);
      MPI_Barrier(control_);
      for (auto &[key, o] : opened_)
        if (o.read)
          cudaEventDestroy(o.read);
      opened_.clear();
      for (auto &[peer, slots] : slots_)
        for (Slot &slot : slots) {
          cudaFree(slot.data);
          cudaEventDestroy(slot.written);
        }
      slots_.clear();
      MPI_Comm_free(&control_);
      MPI_Comm_free(&acks_);
    }
  }
  void abort(int status) override { inner_->abort(status); }

  void allreduce(int64_t *values, int count, ReduceOp op,
                 const std::string &what) override {
    inner_->allreduce(values, count, op, what);
  }
  void allreduce(double *values, int count, ReduceOp op,
                 const std::string &what) override {
    inner_->allreduce(values, count, op, what);
  }
  void allgather(const void *mine, int bytes, void *all,
                 const std::string &what) override {
    inner_->allgather(mine, bytes, all, what);
  }
  std::vector<std::string> allgather(const std::string &mine,
                                     const std::string &what) override {
    return inner_->allgather(mine, what);
  }
  std::vector<std::string> gather(const std::string &mine, int root,
                                  const std::string &what) override {
    return inner_->gather(mine, root, what);
  }
  void barrier(const std::string &what) override { inner_->barrier(what); }
  std::unique_ptr<Transfer> sendHost(const void *data, int64_t bytes, int peer,
                                     int tag,
                                     const std::string &what) override {
    return inner_->sendHost(data, bytes, peer, tag, what);
  }
  void receiveHost(void *data, int64_t bytes, int peer, int tag,
                   const std::string &what) override {
    inner_->receiveHost(data, bytes, peer, tag, what);
  }
  std::unique_ptr<CommGroup> split(int color, int key,
                                   const std::string &what) override {
    std::unique_ptr<CommGroup> mpi = inner_->split(color, key, what);
    // Every rank's (color, key) too (collective, as the split is): the
    // members of this rank's group, in the group's order.
    const int32_t mine[2] = {color, key};
    std::vector<int32_t> all(size_t(size()) * 2);
    inner_->allgather(mine, int(sizeof mine), all.data(), what);
    if (!mpi)
      return nullptr;
    std::vector<std::pair<int32_t, int>> order;
    for (int r = 0; r < size(); ++r)
      if (all[size_t(r) * 2] == color)
        order.emplace_back(all[size_t(r) * 2 + 1], r);
    std::sort(order.begin(), order.end());
    std::vector<int> members;
    int index = -1;
    for (auto [k, r] : order) {
      if (r == rank())
        index = int(members.size());
      members.push_back(r);
    }
    return std::make_unique<CudaGroup>(std::move(mpi), std::move(members),
                                       index, nccl_);
  }

  void allreduceSum(CommGroup &group, void *data, int64_t count, bool f64,
                    double scale, const std::string &what) override {
    CudaGroup &g = static_cast<CudaGroup &>(group);
    if (!g.decided)
      startNccl(g, what);
    if (!g.comm) {
      inner_->allreduceSum(*g.mpi, data, count, f64, scale, what);
      return;
    }
    // On the stream the kernels run on: ordered after the gradients'
    // kernels and before whatever reads the sums.
    nccl_.check(nccl_.allReduce(data, data, size_t(count),
                                f64 ? ncclFloat64 : ncclFloat32, ncclSum,
                                g.comm, stream_),
                what + ": ncclAllReduce");
    if (scale != 1.0)
      scaleOnDevice(data, count, f64, scale, what);
  }
  void progress() override {
    inner_->progress();
    if (ipcPeers_)
      takeAcks();
  }

  std::unique_ptr<Transfer> send(const void *src, int64_t bytes, int peer,
                                 int tag, const std::string &what) override {
    if (p2p_ && peer != rank()) // (to itself: NCCL would need a group)
      return p2p_->send(src, bytes, peer, tag, what);
    if (!shares(peer))
      return inner_->send(src, bytes, peer, tag, what);
    auto transfer = std::make_unique<IpcTransfer>();
    transfer->what = what;
    Control &c = transfer->control;
    c.bytes = bytes;
    if (bytes > 0) {
      takeAcks();
      const int id = freeSlot(peer, bytes, what);
      Slot &s = slots_[peer][size_t(id)];
      if (s.readHandleCame && !s.read)
        check(cudaIpcOpenEventHandle(&s.read, s.readHandle),
              what + ": opening the receiver's CUDA IPC event");
      if (s.readSinceWait) // the peer's last read of it, on the device
        check(cudaStreamWaitEvent(stream_, s.read, 0), what);
      s.readSinceWait = false;
      check(cudaMemcpyAsync(s.data, src, size_t(bytes),
                            cudaMemcpyDeviceToDevice, stream_),
            what + ": the copy into the CUDA IPC slot");
      check(cudaEventRecord(s.written, stream_), what);
      s.busy = true;
      c.slot = id;
      if (!s.sent) {
        c.firstUse = 1;
        check(cudaIpcGetMemHandle(&c.memory, s.data), what);
        check(cudaIpcGetEventHandle(&c.written, s.written), what);
        s.sent = true;
      }
    }
    mpiCheck(MPI_Isend(&c, int(sizeof(Control)), MPI_BYTE, peer, tag, control_,
                       &transfer->request),
             "MPI_Isend", what);
    return transfer;
  }

  std::unique_ptr<PostedReceive> post(int64_t bytes, int peer, int tag,
                                      const std::string &what) override {
    if (p2p_ && peer != rank())
      return std::make_unique<NcclPostedReceive>(*p2p_, bytes, peer, tag, what);
    if (!shares(peer))
      return inner_->post(bytes, peer, tag, what);
    auto posted =
        std::make_unique<IpcPostedReceive>(*this, bytes, peer, tag, what);
    // A record left by a receive of the wrong size comes first (its
    // request stays null: finish has nothing to wait for).
    if (takeKept(peer, tag, posted->control))
      return posted;
    mpiCheck(MPI_Irecv(&posted->control, int(sizeof(Control)), MPI_BYTE, peer,
                       tag, control_, &posted->request),
             "MPI_Irecv", what);
    return posted;
  }

  void receive(void *dst, int64_t bytes, int peer, int tag,
               const std::string &what) override {
    if (p2p_ && peer != rank()) {
      p2p_->receive(dst, bytes, peer, tag, what);
      return;
    }
    if (!shares(peer)) {
      inner_->receive(dst, bytes, peer, tag, what);
      return;
    }
    // A record left by a receive of the wrong size comes first.
    Control c;
    if (!takeKept(peer, tag, c))
      mpiCheck(MPI_Recv(&c, int(sizeof(Control)), MPI_BYTE, peer, tag, control_,
                        MPI_STATUS_IGNORE),
               "MPI_Recv", what);
    checkRecord(c, bytes, peer, tag, what);
    land(c, dst, peer, what);
  }

  /// Throws unless `c` is a record of `bytes` bytes; a record of another
  /// size is kept, to be received with its own size (as MPI keeps it).
  void checkRecord(const Control &c, int64_t bytes, int peer, int tag,
                   const std::string &what) {
    if (c.magic != kMagic)
      throw RtError(what + ": not a CUDA IPC control record (is "
                           "PIPEC_CUDA_IPC the same on every rank?)");
    if (c.bytes != bytes) {
      mismatched_[{peer, tag}].push_front(c);
      throw RtError(sizeMismatch(what, c.bytes, bytes));
    }
  }

  /// Step 3 for a record of the right size: the copy out of the peer's
  /// slot, then the acknowledgement.
  void land(const Control &c, void *dst, int peer, const std::string &what) {
    if (c.bytes == 0)
      return;
    Opened &o = opened_[{peer, c.slot}];
    if (c.firstUse && !o.data) {
      void *mapped = nullptr;
      check(cudaIpcOpenMemHandle(&mapped, c.memory,
                                 cudaIpcMemLazyEnablePeerAccess),
            what + ": opening the sender's CUDA IPC slot (PIPEC_CUDA_IPC=0 "
                   "moves the tensors through host memory instead)");
      o.data = static_cast<char *>(mapped);
      check(cudaIpcOpenEventHandle(&o.written, c.written),
            what + ": opening the sender's CUDA IPC event");
      check(cudaEventCreateWithFlags(&o.read, cudaEventDisableTiming |
                                                  cudaEventInterprocess),
            what);
    }
    if (!o.data)
      throw RtError(what + ": a CUDA IPC slot used before its handles came");
    check(cudaStreamWaitEvent(stream_, o.written, 0), what);
    check(cudaMemcpyAsync(dst, o.data, size_t(c.bytes),
                          cudaMemcpyDeviceToDevice, stream_),
          what + ": the copy out of the CUDA IPC slot");
    check(cudaEventRecord(o.read, stream_), what);
    ackSends_.emplace_back(MPI_REQUEST_NULL, Ack());
    auto &[request, ack] = ackSends_.back();
    ack.slot = c.slot;
    if (!o.acked) {
      ack.firstUse = 1;
      check(cudaIpcGetEventHandle(&ack.read, o.read), what);
      o.acked = true;
    }
    mpiCheck(
        MPI_Isend(&ack, int(sizeof(Ack)), MPI_BYTE, peer, 0, acks_, &request),
        "MPI_Isend", what + ": its CUDA IPC acknowledgement");
    ++acksSentTo_[peer];
    // Completed acknowledgements leave the front of the queue (a deque:
    // the records of those still in flight do not move).
    while (!ackSends_.empty()) {
      int flag = 0;
      MPI_Test(&ackSends_.front().first, &flag, MPI_STATUS_IGNORE);
      if (!flag)
        break;
      ackSends_.pop_front();
    }
  }

private:
  /// At a group's first sum (every member is in it): a NCCL communicator
  /// over the members when NCCL is on and every member has a GPU of its
  /// own (NCCL refuses two ranks on one GPU). The first member's unique id
  /// reaches the others through the MPI group's own sum: its 128 bytes as
  /// small whole numbers, the others adding zeros.
  void startNccl(CudaGroup &g, const std::string &what) {
    g.decided = true;
    if (!ncclOn_)
      return;
    std::set<std::string> gpus;
    for (int r : g.members)
      gpus.insert(ncclGpuOf_[size_t(r)]);
    if (gpus.size() != g.members.size())
      return;
    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    if (g.index == 0)
      nccl_.check(nccl_.getUniqueId(&id), what + ": ncclGetUniqueId");
    std::vector<float> bytes(NCCL_UNIQUE_ID_BYTES, 0.0f);
    for (size_t i = 0; i < bytes.size(); ++i)
      bytes[i] = float(static_cast<unsigned char>(id.internal[i]));
    rt::DeviceBuffer buffer;
    buffer.allocate(*device_, int64_t(bytes.size() * sizeof(float)),
                    "NCCL's unique id");
    device_->toDevice(buffer.get(), bytes.data(),
                      int64_t(bytes.size() * sizeof(float)));
    inner_->allreduceSum(*g.mpi, buffer.get(), int64_t(bytes.size()), false,
                         1.0, what + ": NCCL's unique id");
    device_->toHost(bytes.data(), buffer.get(),
                    int64_t(bytes.size() * sizeof(float)));
    for (size_t i = 0; i < bytes.size(); ++i)
      id.internal[i] = char(static_cast<unsigned char>(int(bytes[i])));
    nccl_.check(nccl_.init(&g.comm, int(g.members.size()), id, g.index),
                what + ": ncclCommInitRank");
    ncclUsed_ = true;
  }

  /// data *= scale, on the kernels' stream (cuBLAS's scal, as the MPI
  /// path multiplies after the sum).
  void scaleOnDevice(void *data, int64_t count, bool f64, double scale,
                     const std::string &what) {
    Context &ctx = context(device_->kernelContext(), "the CUDA communicator");
    const int64_t chunk = int64_t(1) << 30;
    for (int64_t done = 0; done < count; done += chunk) {
      const int n = int(std::min(chunk, count - done));
      if (f64) {
        const double s = scale;
        checkBlas(
            cublasDscal(ctx.blas, n, &s, static_cast<double *>(data) + done, 1),
            (what + ": scaling the sum").c_str());
      } else {
        const float s = float(scale);
        checkBlas(
            cublasSscal(ctx.blas, n, &s, static_cast<float *>(data) + done, 1),
            (what + ": scaling the sum").c_str());
      }
    }
  }

  bool shares(int peer) const {
    return ipcPeers_ && peer >= 0 && peer < int(samePeer_.size()) &&
           samePeer_[size_t(peer)];
  }

  /// Takes every acknowledgement that has arrived: those slots may be
  /// written again once the device has passed the peer's read. (No CUDA
  /// call here: progress() may run inside a stream capture.)
  void takeAcks() {
    for (;;) {
      int flag = 0;
      MPI_Status status;
      mpiCheck(MPI_Iprobe(MPI_ANY_SOURCE, 0, acks_, &flag, &status),
               "MPI_Iprobe", "CUDA IPC: the peers' acknowledgements");
      if (!flag)
        return;
      takeAck(status.MPI_SOURCE);
    }
  }

  /// Receives one acknowledgement from `peer` (blocking).
  void takeAck(int peer) {
    Ack ack;
    mpiCheck(MPI_Recv(&ack, int(sizeof(Ack)), MPI_BYTE, peer, 0, acks_,
                      MPI_STATUS_IGNORE),
             "MPI_Recv", "CUDA IPC: a peer's acknowledgement");
    ++acksFrom_[peer];
    std::vector<Slot> &slots = slots_[peer];
    if (ack.slot < 0 || size_t(ack.slot) >= slots.size())
      throw RtError("CUDA IPC: rank " + std::to_string(peer) +
                    " acknowledged slot " + std::to_string(ack.slot) +
                    ", which this rank never sent it");
    Slot &s = slots[size_t(ack.slot)];
    if (ack.firstUse) {
      s.readHandle = ack.read;
      s.readHandleCame = true;
    }
    s.busy = false;
    s.readSinceWait = true;
  }

  /// Takes the record kept for (peer, tag) by a receive of the wrong
  /// size, if there is one.
  bool takeKept(int peer, int tag, Control &c) {
    auto kept = mismatched_.find({peer, tag});
    if (kept == mismatched_.end() || kept->second.empty())
      return false;
    c = kept->second.front();
    kept->second.pop_front();
    return true;
  }

  /// A slot for `bytes` to `peer` that the peer has finished with: the
  /// smallest free one that holds them, else a new one.
  int freeSlot(int peer, int64_t bytes, const std::string &what) {
    std::vector<Slot> &slots = slots_[peer];
    int best = -1;
    for (size_t i = 0; i < slots.size(); ++i)
      if (!slots[i].busy && slots[i].capacity >= bytes &&
          (best < 0 || slots[i].capacity < slots[size_t(best)].capacity))
        best = int(i);
    if (best >= 0)
      return best;
    Slot s;
    s.data = allocateSlot(bytes, s.capacity, what + ": a CUDA IPC slot");
    check(cudaEventCreateWithFlags(&s.written, cudaEventDisableTiming |
                                                   cudaEventInterprocess),
          what);
    slots.push_back(s);
    return int(slots.size()) - 1;
  }

  friend class IpcPostedReceive;
  std::unique_ptr<Communicator> inner_;
  Device *device_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::vector<bool> samePeer_;
  /// Every rank's GPU as NCCL tells them apart ("host|bus id"), and
  /// whether sums may go by NCCL (and some group's did).
  std::vector<std::string> ncclGpuOf_;
  Nccl nccl_;
  bool ncclOn_ = false, ncclUsed_ = false;
  /// PIPEC_NCCL_P2P=1 where every rank has a GPU of its own: every tensor
  /// message by NCCL (nccl_p2p.h).
  std::unique_ptr<NcclP2p> p2p_;
  int ipcPeers_ = 0;
  MPI_Comm control_ = MPI_COMM_NULL, acks_ = MPI_COMM_NULL;
  std::map<int, std::vector<Slot>> slots_;
  std::map<std::pair<int, int>, Opened> opened_;
  std::map<std::pair<int, int>, std::deque<Control>> mismatched_;
  std::deque<std::pair<MPI_Request, Ack>> ackSends_;
  /// Acknowledgements sent to and received from each rank (finalize).
  std::map<int, int64_t> acksSentTo_, acksFrom_;
};

void IpcPostedReceive::finish(void *dst) {
  mpiCheck(MPI_Wait(&request, MPI_STATUS_IGNORE), "MPI_Wait", what_);
  owner_.checkRecord(control, bytes_, peer_, tag_, what_);
  owner_.land(control, dst, peer_, what_);
}

} // namespace

std::unique_ptr<rt::Communicator> makeCudaCommunicator(int &argc,
                                                       char **&argv) {
  return std::make_unique<CudaCommunicator>(
      rt::makeMpiCommunicator(argc, argv));
}

} // namespace cuda
} // namespace pipec
