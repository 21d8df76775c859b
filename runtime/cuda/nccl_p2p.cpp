//===- nccl_p2p.cpp - Tensors between ranks by ncclSend / ncclRecv --------===//
//
// Part of pipec's CUDA runtime. See nccl_p2p.h.
//
//===----------------------------------------------------------------------===//

#include "nccl_p2p.h"

#include "core/error.h"
#include "core/mpi_errors.h"
#include "cuda_rt.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

namespace pipec {
namespace cuda {

namespace {

constexpr uint32_t kRecordMagic = 0x70327070; // "pp2p"

/// The control record in flight (a send's transfer): complete once MPI
/// has it; the tensor itself is queued on the device.
class RecordTransfer final : public rt::Transfer {
public:
  MPI_Request request = MPI_REQUEST_NULL;
  std::string what;
  bool test() override {
    int flag = 0;
    rt::mpiCheck(MPI_Test(&request, &flag, MPI_STATUS_IGNORE), "MPI_Test",
                 what);
    return flag != 0;
  }
  void wait() override {
    rt::mpiCheck(MPI_Wait(&request, MPI_STATUS_IGNORE), "MPI_Wait", what);
  }
  // (Declared last: MPI reads it until the request completes, and the
  // transfer outlives the request.)
  char record[24] = {0};
};

} // namespace

NcclP2p::NcclP2p(const Nccl &nccl, cudaStream_t compute, int rank, int size)
    : nccl_(nccl), compute_(compute), rank_(rank), size_(size) {
  check(cudaEventCreateWithFlags(&order_, cudaEventDisableTiming),
        "NCCL point-to-point: an event");
  check(cudaStreamCreateWithFlags(&upStream_, cudaStreamNonBlocking),
        "NCCL point-to-point: a stream");
  check(cudaStreamCreateWithFlags(&downStream_, cudaStreamNonBlocking),
        "NCCL point-to-point: a stream");
}

NcclP2p::~NcclP2p() {
  // (finish() frees everything on a clean end; after an error the process
  // is ending and the device may be in a bad state: leave it.)
}

void NcclP2p::start(rt::Communicator &mpi) {
  ncclUniqueId ids[2];
  std::memset(ids, 0, sizeof ids);
  if (rank_ == 0)
    for (ncclUniqueId &id : ids)
      nccl_.check(nccl_.getUniqueId(&id),
                  "NCCL point-to-point: ncclGetUniqueId");
  std::vector<char> all(size_t(size_) * sizeof ids);
  mpi.allgather(ids, int(sizeof ids), all.data(),
                "NCCL point-to-point: the unique ids");
  std::memcpy(ids, all.data(), sizeof ids); // rank 0's
  nccl_.check(nccl_.init(&up_, size_, ids[0], rank_),
              "NCCL point-to-point: ncclCommInitRank (messages to higher "
              "ranks)");
  nccl_.check(nccl_.init(&down_, size_, ids[1], rank_),
              "NCCL point-to-point: ncclCommInitRank (messages to lower "
              "ranks)");
  rt::mpiCheck(MPI_Comm_dup(MPI_COMM_WORLD, &control_), "MPI_Comm_dup",
               "NCCL point-to-point: its control records");
  MPI_Comm_set_errhandler(control_, MPI_ERRORS_RETURN);
  connectAll();
}

void NcclP2p::connectAll() {
  const std::string what = "NCCL point-to-point: connecting every pair";
  void *bytes = nullptr;
  check(cudaMalloc(&bytes, size_t(2 * size_)), what);
  char *in = static_cast<char *>(bytes), *out = in + size_;
  check(cudaMemsetAsync(bytes, 0, size_t(2 * size_), compute_), what);
  check(cudaStreamSynchronize(compute_), what);
  // One group per communicator, each on its stream: a byte to every rank
  // of that direction, a byte from every rank of the other.
  for (const bool up : {true, false}) {
    ncclComm_t comm = up ? up_ : down_;
    cudaStream_t stream = up ? upStream_ : downStream_;
    nccl_.check(nccl_.groupStart(), what + ": ncclGroupStart");
    for (int q = 0; q < size_; ++q) {
      if (q == rank_)
        continue;
      if ((q > rank_) == up)
        nccl_.check(nccl_.send(out, 1, ncclUint8, q, comm, stream),
                    what + ": ncclSend");
      else
        nccl_.check(nccl_.recv(in + q, 1, ncclUint8, q, comm, stream),
                    what + ": ncclRecv");
    }
    nccl_.check(nccl_.groupEnd(), what + ": ncclGroupEnd");
  }
  check(cudaStreamSynchronize(upStream_), what);
  check(cudaStreamSynchronize(downStream_), what);
  check(cudaFree(bytes), what);
}

void NcclP2p::after(cudaStream_t waiter, cudaStream_t first,
                    const std::string &what) {
  check(cudaEventRecord(order_, first), what);
  check(cudaStreamWaitEvent(waiter, order_, 0), what);
}

int NcclP2p::freeSlot(std::vector<Slot> &slots, int64_t bytes,
                      const std::string &what) {
  for (size_t i = 0; i < slots.size(); ++i) {
    Slot &s = slots[i];
    if (s.busy || s.capacity < bytes)
      continue;
    if (!s.used)
      return int(i);
    cudaError_t e = cudaEventQuery(s.free);
    if (e == cudaSuccess)
      return int(i);
    if (e != cudaErrorNotReady)
      check(e, what);
  }
  Slot s;
  s.capacity = std::max<int64_t>(bytes, int64_t(1) << 16);
  void *p = nullptr;
  check(cudaMalloc(&p, size_t(s.capacity)), what + ": a NCCL message slot of " +
                                                std::to_string(s.capacity) +
                                                " bytes");
  s.data = static_cast<char *>(p);
  check(cudaEventCreateWithFlags(&s.free, cudaEventDisableTiming), what);
  check(cudaEventCreateWithFlags(&s.landed, cudaEventDisableTiming), what);
  slots.push_back(s);
  return int(slots.size()) - 1;
}

std::unique_ptr<rt::Transfer> NcclP2p::send(const void *src, int64_t bytes,
                                            int peer, int tag,
                                            const std::string &what) {
  auto transfer = std::make_unique<RecordTransfer>();
  transfer->what = what;
  Record r;
  r.magic = kRecordMagic;
  r.bytes = bytes;
  r.sequence = sent_[peer]++;
  static_assert(sizeof(Record) == sizeof transfer->record, "record size");
  std::memcpy(transfer->record, &r, sizeof r);
  // The record first: the receiver may be waiting for it to queue its
  // receive.
  rt::mpiCheck(MPI_Isend(transfer->record, int(sizeof r), MPI_BYTE, peer, tag,
                         control_, &transfer->request),
               "MPI_Isend", what + ": its control record");
  if (bytes > 0) {
    std::vector<Slot> &slots = sendSlots_[peer];
    Slot &s = slots[size_t(freeSlot(slots, bytes, what))];
    check(cudaMemcpyAsync(s.data, src, size_t(bytes), cudaMemcpyDeviceToDevice,
                          compute_),
          what + ": the copy into the NCCL send slot");
    cudaStream_t stream = sendStream(peer);
    after(stream, compute_, what);
    nccl_.check(nccl_.send(s.data, size_t(bytes), ncclUint8, peer,
                           sendComm(peer), stream),
                what + ": ncclSend");
    check(cudaEventRecord(s.free, stream), what);
    s.used = true;
  }
  return transfer;
}

NcclP2p::Record NcclP2p::takeRecord(int peer, int tag,
                                    const std::string &what) {
  Record r;
  rt::mpiCheck(MPI_Recv(&r, int(sizeof r), MPI_BYTE, peer, tag, control_,
                        MPI_STATUS_IGNORE),
               "MPI_Recv", what + ": a control record");
  if (r.magic != kRecordMagic)
    throw rt::RtError(what + ": not a NCCL control record (is "
                             "PIPEC_NCCL_P2P the same on every rank?)");
  if (r.sequence != taken_[peer])
    throw rt::RtError(what + ": control record " + std::to_string(r.sequence) +
                      " from rank " + std::to_string(peer) + " came where " +
                      std::to_string(taken_[peer]) + " was due");
  ++taken_[peer];
  return r;
}

void NcclP2p::queueEarly(int peer, int tag, const Record &r,
                         const std::string &what) {
  Early e;
  e.record = r;
  if (r.bytes > 0) {
    std::vector<Slot> &slots = recvSlots_[peer];
    e.slot = freeSlot(slots, r.bytes, what);
    Slot &s = slots[size_t(e.slot)];
    cudaStream_t stream = recvStream(peer);
    nccl_.check(nccl_.recv(s.data, size_t(r.bytes), ncclUint8, peer,
                           recvComm(peer), stream),
                what + ": ncclRecv");
    check(cudaEventRecord(s.landed, stream), what);
    s.used = true;
    s.busy = true;
  }
  early_[{peer, tag}].push_back(e);
}

void NcclP2p::landEarly(const Early &e, int peer, void *dst,
                        const std::string &what) {
  if (e.record.bytes == 0)
    return;
  Slot &s = recvSlots_[peer][size_t(e.slot)];
  check(cudaStreamWaitEvent(compute_, s.landed, 0), what);
  check(cudaMemcpyAsync(dst, s.data, size_t(e.record.bytes),
                        cudaMemcpyDeviceToDevice, compute_),
        what + ": the copy out of the NCCL receive slot");
  check(cudaEventRecord(s.free, compute_), what);
  s.busy = false;
}

void NcclP2p::receive(void *dst, int64_t bytes, int peer, int tag,
                      const std::string &what) {
  std::deque<Early> &queue = early_[{peer, tag}];
  if (!queue.empty()) {
    const Early e = queue.front();
    if (e.record.bytes != bytes)
      throw rt::RtError(rt::sizeMismatch(what, e.record.bytes, bytes));
    queue.pop_front();
    landEarly(e, peer, dst, what);
    return;
  }
  // The peer's records before this tag's, in the order sent (a probe for
  // any tag from one sender finds its earliest message), each received
  // into a slot; then this tag's, straight into `dst` when its size is
  // right. A record of another size stays queued for a receive of its own
  // size, as MPI keeps such a message.
  for (;;) {
    MPI_Status status;
    rt::mpiCheck(MPI_Probe(peer, MPI_ANY_TAG, control_, &status), "MPI_Probe",
                 what);
    const int got = status.MPI_TAG;
    const Record r = takeRecord(peer, got, what);
    if (got == tag && r.bytes == bytes) {
      if (bytes > 0) {
        cudaStream_t stream = recvStream(peer);
        after(stream, compute_, what); // the kernels done with `dst`
        nccl_.check(nccl_.recv(dst, size_t(bytes), ncclUint8, peer,
                               recvComm(peer), stream),
                    what + ": ncclRecv");
        after(compute_, stream, what);
      }
      return;
    }
    queueEarly(peer, got, r, what);
    if (got == tag)
      throw rt::RtError(rt::sizeMismatch(what, r.bytes, bytes));
  }
}

void NcclP2p::takeTheRest(rt::Communicator &mpi) {
  // How many messages each rank sent each other rank; the ones sent to this
  // rank and not taken yet are received into slots.
  std::vector<int64_t> mine(size_t(size_), 0),
      all(size_t(size_) * size_t(size_));
  for (const auto &[peer, n] : sent_)
    mine[size_t(peer)] = n;
  mpi.allgather(mine.data(), int(size_ * sizeof(int64_t)), all.data(),
                "NCCL point-to-point: the messages sent");
  const std::string what = "NCCL point-to-point: a message never asked for";
  for (int q = 0; q < size_; ++q)
    while (taken_[q] < all[size_t(q) * size_t(size_) + size_t(rank_)]) {
      MPI_Status status;
      rt::mpiCheck(MPI_Probe(q, MPI_ANY_TAG, control_, &status), "MPI_Probe",
                   what);
      const Record r = takeRecord(q, status.MPI_TAG, what);
      queueEarly(q, status.MPI_TAG, r, what);
    }
}

void NcclP2p::finish(rt::Communicator &mpi) {
  if (!up_)
    return;
  takeTheRest(mpi);
  // Every send now has its receive queued: the streams end. A bounded
  // wait all the same (a device in a bad state), and one decision for
  // every rank: destroy the communicators, or abort them all.
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(60);
  bool done = false;
  for (;;) {
    const cudaError_t states[3] = {cudaStreamQuery(upStream_),
                                   cudaStreamQuery(downStream_),
                                   cudaStreamQuery(compute_)};
    done = true;
    bool failed = false;
    for (cudaError_t e : states) {
      done = done && e == cudaSuccess;
      failed = failed || (e != cudaSuccess && e != cudaErrorNotReady);
    }
    if (done || failed || std::chrono::steady_clock::now() > deadline)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  int64_t allDone = done ? 1 : 0;
  mpi.allreduce(&allDone, 1, rt::ReduceOp::Min,
                "NCCL point-to-point: whether every rank's messages ended");
  if (allDone == 0) {
    if (rank_ == 0)
      std::fprintf(stderr,
                   "pipec-rt: note: NCCL point-to-point: messages still "
                   "queued at the end after a minute; its communicators are "
                   "aborted\n");
    if (nccl_.commAbort) {
      nccl_.commAbort(up_);
      nccl_.commAbort(down_);
    }
    up_ = down_ = nullptr;
    return; // (the slots stay: the device may still use them)
  }
  nccl_.commDestroy(up_);
  nccl_.commDestroy(down_);
  up_ = down_ = nullptr;
  for (auto *all : {&sendSlots_, &recvSlots_})
    for (auto &[peer, slots] : *all)
      for (Slot &s : slots) {
        cudaFree(s.data);
        cudaEventDestroy(s.free);
        cudaEventDestroy(s.landed);
      }
  sendSlots_.clear();
  recvSlots_.clear();
  early_.clear();
  cudaStreamDestroy(upStream_);
  cudaStreamDestroy(downStream_);
  cudaEventDestroy(order_);
  upStream_ = downStream_ = nullptr;
  order_ = nullptr;
  MPI_Comm_free(&control_);
}

} // namespace cuda
} // namespace pipec
