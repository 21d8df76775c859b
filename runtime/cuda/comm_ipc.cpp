//===- comm_ipc.cpp - Tensors between ranks that share a GPU -------------===//
//
// Part of pipec's CUDA runtime.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The communicator of CUDA stage executables (`makeCudaCommunicator`): the
/// MPI communicator (core/comm_mpi.cpp) for the job, host values and every
/// tensor, except that with `PIPEC_CUDA_IPC=1` the tensors between two
/// ranks on the same GPU move through CUDA IPC instead of host memory.
/// Off by default until it has run on a GPU (issue 12): the host-staged
/// path costs a copy to the host, MPI's copy and a copy back (3.3 GB/s
/// between two ranks sharing an H200, 2026-11-27), this one copy on the
/// GPU.
///
/// Which peers: every rank publishes its host name and its GPU's PCI bus
/// id when the device is set (`useDevice`, an allgather over MPI); a peer
/// with both equal shares the GPU. NCCL refuses such ranks (runtime
/// README), which is why they need a transport of their own.
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
#include "cuda_rt.h"
#include "device_factory.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
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

void cudaCheck(cudaError_t e, const std::string &what) {
  if (e != cudaSuccess)
    throw RtError(what + ": " + cudaGetErrorString(e));
}

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

class IpcCommunicator;

class IpcPostedReceive : public PostedReceive {
public:
  IpcPostedReceive(IpcCommunicator &owner, int64_t bytes, int peer, int tag,
                   std::string what)
      : owner_(owner), bytes_(bytes), peer_(peer), tag_(tag),
        what_(std::move(what)) {}
  Control control;
  MPI_Request request = MPI_REQUEST_NULL;
  void finish(void *dst) override;
  int64_t stagingBytes() const override { return 0; }

private:
  IpcCommunicator &owner_;
  int64_t bytes_;
  int peer_, tag_;
  std::string what_;
};

class IpcCommunicator final : public Communicator {
public:
  explicit IpcCommunicator(std::unique_ptr<Communicator> inner)
      : inner_(std::move(inner)) {}

  std::string name() const override {
    return ipcPeers_ ? inner_->name() + " + CUDA IPC between ranks sharing "
                                        "a GPU"
                     : inner_->name();
  }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  int localRank() const override { return inner_->localRank(); }
  int localSize() const override { return inner_->localSize(); }
  int tagUpperBound() const override { return inner_->tagUpperBound(); }

  void useDevice(Device &device) override {
    inner_->useDevice(device);
    device_ = &device;
    const char *choice = std::getenv("PIPEC_CUDA_IPC");
    const std::string mode = choice ? choice : "0";
    if (mode != "0" && mode != "1")
      throw RtError("PIPEC_CUDA_IPC=" + mode +
                    ": expected 1 (CUDA IPC between ranks sharing a GPU) or "
                    "0 (every tensor through host memory)");
    // Every rank takes part in the allgather, so that the choice is the
    // same on both sides of every pair (each rank reads the variable the
    // launcher exported to all). The GPU is named by its UUID (one per MIG
    // instance, whose instances share a bus id and cannot open each
    // other's memory) and the host's name.
    int ordinal = -1;
    cudaCheck(cudaGetDevice(&ordinal), "CUDA IPC: the current GPU");
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, ordinal),
              "CUDA IPC: the GPU's UUID");
    std::string uuid;
    for (unsigned char byte : prop.uuid.bytes) {
      static const char hex[] = "0123456789abcdef";
      uuid += hex[byte >> 4];
      uuid += hex[byte & 15];
    }
    char host[256] = {0};
    gethostname(host, sizeof host - 1);
    const std::string mine = std::string(mode) + "|" + host + "|" + uuid;
    const std::vector<std::string> all =
        inner_->allgather(mine, "CUDA IPC: which ranks share a GPU");
    samePeer_.assign(all.size(), false);
    for (size_t r = 0; r < all.size(); ++r) {
      if (int(r) == rank())
        continue;
      if (all[r].substr(0, 1) != mode)
        throw RtError("PIPEC_CUDA_IPC differs between rank " +
                      std::to_string(rank()) + " (" + mode + ") and rank " +
                      std::to_string(r) + " (" + all[r].substr(0, 1) + ")");
      samePeer_[r] = mode == "1" && all[r] == mine;
      ipcPeers_ += samePeer_[r];
    }
    // (Collective over every rank: with the variable on, each makes the
    // two communicators, whether it has a peer on its GPU or not.)
    if (mode != "1")
      return;
    mpiCheck(MPI_Comm_dup(MPI_COMM_WORLD, &control_), "MPI_Comm_dup",
             "CUDA IPC: its control records");
    mpiCheck(MPI_Comm_dup(MPI_COMM_WORLD, &acks_), "MPI_Comm_dup",
             "CUDA IPC: its acknowledgements");
    MPI_Comm_set_errhandler(control_, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(acks_, MPI_ERRORS_RETURN);
    stream_ = context(device.kernelContext(), "CUDA IPC").stream;
  }

  void finalize() override {
    // (A failure while tearing down, on a device in a bad state, must not
    // keep the transport from closing: the job's result is already out.)
    try {
      closeIpc();
    } catch (const std::exception &e) {
      std::fprintf(stderr, "pipec-rt: note: closing CUDA IPC: %s\n", e.what());
    }
    inner_->finalize();
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
    return inner_->split(color, key, what);
  }
  void allreduceSum(CommGroup &group, void *data, int64_t count, bool f64,
                    double scale, const std::string &what) override {
    inner_->allreduceSum(group, data, count, f64, scale, what);
  }
  void progress() override {
    inner_->progress();
    if (ipcPeers_)
      takeAcks();
  }

  std::unique_ptr<Transfer> send(const void *src, int64_t bytes, int peer,
                                 int tag, const std::string &what) override {
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
        cudaCheck(cudaIpcOpenEventHandle(&s.read, s.readHandle),
                  what + ": opening the receiver's CUDA IPC event");
      if (s.readSinceWait) // the peer's last read of it, on the device
        cudaCheck(cudaStreamWaitEvent(stream_, s.read, 0), what);
      s.readSinceWait = false;
      cudaCheck(cudaMemcpyAsync(s.data, src, size_t(bytes),
                                cudaMemcpyDeviceToDevice, stream_),
                what + ": the copy into the CUDA IPC slot");
      cudaCheck(cudaEventRecord(s.written, stream_), what);
      s.busy = true;
      c.slot = id;
      if (!s.sent) {
        c.firstUse = 1;
        cudaCheck(cudaIpcGetMemHandle(&c.memory, s.data), what);
        cudaCheck(cudaIpcGetEventHandle(&c.written, s.written), what);
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
      cudaCheck(cudaIpcOpenMemHandle(&mapped, c.memory,
                                     cudaIpcMemLazyEnablePeerAccess),
                what + ": opening the sender's CUDA IPC slot");
      o.data = static_cast<char *>(mapped);
      cudaCheck(cudaIpcOpenEventHandle(&o.written, c.written),
                what + ": opening the sender's CUDA IPC event");
      cudaCheck(cudaEventCreateWithFlags(&o.read, cudaEventDisableTiming |
                                                      cudaEventInterprocess),
                what);
    }
    if (!o.data)
      throw RtError(what + ": a CUDA IPC slot used before its handles came");
    cudaCheck(cudaStreamWaitEvent(stream_, o.written, 0), what);
    cudaCheck(cudaMemcpyAsync(dst, o.data, size_t(c.bytes),
                              cudaMemcpyDeviceToDevice, stream_),
              what + ": the copy out of the CUDA IPC slot");
    cudaCheck(cudaEventRecord(o.read, stream_), what);
    ackSends_.emplace_back(MPI_REQUEST_NULL, Ack());
    auto &[request, ack] = ackSends_.back();
    ack.slot = c.slot;
    if (!o.acked) {
      ack.firstUse = 1;
      cudaCheck(cudaIpcGetEventHandle(&ack.read, o.read), what);
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
    s.capacity = std::max<int64_t>(bytes, int64_t(1) << 16);
    void *p = nullptr;
    cudaCheck(cudaMalloc(&p, size_t(s.capacity)),
              what + ": a CUDA IPC slot of " + std::to_string(s.capacity) +
                  " bytes");
    s.data = static_cast<char *>(p);
    cudaCheck(cudaEventCreateWithFlags(&s.written, cudaEventDisableTiming |
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
  return std::make_unique<IpcCommunicator>(rt::makeMpiCommunicator(argc, argv));
}

} // namespace cuda
} // namespace pipec
