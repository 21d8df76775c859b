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
#include <functional>
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
}

NcclP2p::~NcclP2p() {
  // (finish() frees everything on a clean end; after an error the process
  // is ending and the device may be in a bad state: leave it.)
}

void NcclP2p::start(rt::Communicator &mpi) {
  const std::string what = "NCCL point-to-point";
  // Each rank makes the unique ids of the pairs it sends on, one per
  // receiver, behind a flag saying whether it could; the receivers read
  // theirs from the gathered table. A rank that could not still takes
  // part in the allgather, and then every rank refuses alike.
  const size_t idBytes = sizeof(ncclUniqueId), head = 8,
               row = head + size_t(size_) * idBytes;
  std::vector<char> mine(row, 0), all(row * size_t(size_));
  std::string failure;
  try {
    for (int q = 0; q < size_; ++q)
      if (q != rank_)
        nccl_.check(nccl_.getUniqueId(reinterpret_cast<ncclUniqueId *>(
                        mine.data() + head + size_t(q) * idBytes)),
                    what + ": ncclGetUniqueId");
    mine[0] = 1;
  } catch (const std::exception &e) {
    failure = e.what();
  }
  mpi.allgather(mine.data(), int(row), all.data(),
                what + ": the pairs' unique ids");
  for (int q = 0; q < size_; ++q)
    if (all[size_t(q) * row] != 1)
      throw rt::RtError(failure.empty() ? what + ": rank " + std::to_string(q) +
                                              " could not make its unique ids"
                                        : failure);
  // From here on a rank that fails leaves its pair partners waiting in
  // NCCL: it ends the job instead.
  try {
    to_.assign(size_t(size_), Pair());
    from_.assign(size_t(size_), Pair());
    // Every ordered pair (a, b) in one order on every rank: a pair's two
    // ranks each block in its ncclCommInitRank until the other comes, and
    // the earliest pair not yet made always has both ranks at it.
    forEachPair([&](int a, int b, Pair &pair) {
      ncclUniqueId id;
      std::memcpy(&id,
                  all.data() + size_t(a) * row + head + size_t(b) * idBytes,
                  idBytes);
      nccl_.check(nccl_.init(&pair.comm, 2, id,
                             rank_ == a ? kSenderRank : kReceiverRank),
                  what + ": ncclCommInitRank (rank " + std::to_string(a) +
                      " to rank " + std::to_string(b) + ")");
      check(cudaStreamCreateWithFlags(&pair.stream, cudaStreamNonBlocking),
            what + ": a stream");
    });
    started_ = true;
    rt::mpiCheck(MPI_Comm_dup(MPI_COMM_WORLD, &control_), "MPI_Comm_dup",
                 what + ": its control records");
    MPI_Comm_set_errhandler(control_, MPI_ERRORS_RETURN);
    connectAll();
  } catch (const std::exception &e) {
    std::fprintf(stderr,
                 "pipec-rt: error: %s (rank %d); ending the job, whose other "
                 "ranks wait for this one in NCCL\n",
                 e.what(), rank_);
    mpi.abort(1);
  }
}

void NcclP2p::forEachPair(const std::function<void(int, int, Pair &)> &f) {
  for (int a = 0; a < size_; ++a)
    for (int b = 0; b < size_; ++b)
      if (a != b && (rank_ == a || rank_ == b))
        f(a, b, rank_ == a ? to_[size_t(b)] : from_[size_t(a)]);
}

void NcclP2p::connectAll() {
  const std::string what = "NCCL point-to-point: connecting every pair";
  void *bytes = nullptr;
  check(cudaMalloc(&bytes, 2), what);
  check(cudaMemsetAsync(bytes, 0, 2, compute_), what);
  check(cudaStreamSynchronize(compute_), what);
  char *out = static_cast<char *>(bytes), *in = out + 1;
  // A byte over every pair, in the order the pairs were made (a first
  // message may block its host until the peer's first one comes), then
  // every pair's stream waited for.
  forEachPair([&](int a, int, Pair &pair) {
    if (rank_ == a)
      nccl_.check(
          nccl_.send(out, 1, ncclUint8, kReceiverRank, pair.comm, pair.stream),
          what + ": ncclSend");
    else
      nccl_.check(
          nccl_.recv(in, 1, ncclUint8, kSenderRank, pair.comm, pair.stream),
          what + ": ncclRecv");
  });
  forEachPair([&](int, int, Pair &pair) {
    check(cudaStreamSynchronize(pair.stream), what);
  });
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
  s.data = allocateSlot(bytes, s.capacity, what + ": a NCCL message slot");
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
  r.sequence = sent_[peer]; // (counted once the record is out, below)
  static_assert(sizeof(Record) == sizeof transfer->record, "record size");
  std::memcpy(transfer->record, &r, sizeof r);
  if (bytes > 0) {
    std::vector<Slot> &slots = sendSlots_[peer];
    Slot &s = slots[size_t(freeSlot(slots, bytes, what))];
    check(cudaMemcpyAsync(s.data, src, size_t(bytes), cudaMemcpyDeviceToDevice,
                          compute_),
          what + ": the copy into the NCCL send slot");
    const Pair &pair = to_[size_t(peer)];
    after(pair.stream, compute_, what);
    nccl_.check(nccl_.send(s.data, size_t(bytes), ncclUint8, kReceiverRank,
                           pair.comm, pair.stream),
                what + ": ncclSend");
    check(cudaEventRecord(s.free, pair.stream), what);
    s.used = true;
  }
  // The record last: a receiver queues one ncclRecv per record, so a
  // record goes out only for a send that is queued (none when the copy or
  // a slot failed above).
  rt::mpiCheck(MPI_Isend(transfer->record, int(sizeof r), MPI_BYTE, peer, tag,
                         control_, &transfer->request),
               "MPI_Isend", what + ": its control record");
  ++sent_[peer];
  return transfer;
}

NcclP2p::Record NcclP2p::takeRecord(int peer, int &tag,
                                    const std::string &what) {
  // A probe for any tag from one sender finds its earliest record.
  MPI_Status status;
  rt::mpiCheck(MPI_Probe(peer, MPI_ANY_TAG, control_, &status), "MPI_Probe",
               what);
  tag = status.MPI_TAG;
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
    const Pair &pair = from_[size_t(peer)];
    nccl_.check(nccl_.recv(s.data, size_t(r.bytes), ncclUint8, kSenderRank,
                           pair.comm, pair.stream),
                what + ": ncclRecv");
    check(cudaEventRecord(s.landed, pair.stream), what);
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
  // The peer's records before this tag's, in the order sent, each
  // received into a slot; then this tag's, straight into `dst` when its
  // size is right. A record of another size stays queued for a receive of
  // its own size, as MPI keeps such a message.
  for (;;) {
    int got = 0;
    const Record r = takeRecord(peer, got, what);
    if (got == tag && r.bytes == bytes) {
      if (bytes > 0) {
        const Pair &pair = from_[size_t(peer)];
        after(pair.stream, compute_, what); // the kernels done with `dst`
        nccl_.check(nccl_.recv(dst, size_t(bytes), ncclUint8, kSenderRank,
                               pair.comm, pair.stream),
                    what + ": ncclRecv");
        after(compute_, pair.stream, what);
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
      int tag = 0;
      const Record r = takeRecord(q, tag, what);
      queueEarly(q, tag, r, what);
    }
}

void NcclP2p::finish(rt::Communicator &mpi) {
  if (!started_)
    return;
  takeTheRest(mpi);
  // Every send now has its receive queued: the streams end. A bounded
  // wait all the same (a device in a bad state), and one decision for
  // every rank: destroy the communicators, or abort them all.
  std::vector<cudaStream_t> streams = {compute_};
  forEachPair([&](int, int, Pair &pair) { streams.push_back(pair.stream); });
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(60);
  bool done = false;
  for (;;) {
    done = true;
    bool failed = false;
    for (cudaStream_t stream : streams) {
      const cudaError_t e = cudaStreamQuery(stream);
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
  started_ = false;
  if (allDone == 0) {
    if (rank_ == 0)
      std::fprintf(stderr,
                   "pipec-rt: note: NCCL point-to-point: messages still "
                   "queued at the end after a minute; its communicators are "
                   "aborted\n");
    // (In the order the pairs were made: an abort, like a destroy, may
    // wait for the pair's other rank.)
    forEachPair([&](int, int, Pair &pair) {
      if (nccl_.commAbort)
        nccl_.commAbort(pair.comm);
      pair.comm = nullptr;
    });
    MPI_Comm_free(&control_);
    return; // (the slots and streams stay: the device may still use them)
  }
  // Destroyed in the order they were made (each destroy may wait for the
  // pair's other rank).
  forEachPair([&](int a, int b, Pair &pair) {
    const ncclResult_t r = nccl_.commDestroy(pair.comm);
    if (r != ncclSuccess)
      std::fprintf(stderr,
                   "pipec-rt: note: NCCL point-to-point: destroying the "
                   "communicator of rank %d to rank %d: %s\n",
                   a, b, nccl_.errorString(r));
    cudaStreamDestroy(pair.stream);
    pair = Pair();
  });
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
  cudaEventDestroy(order_);
  order_ = nullptr;
  MPI_Comm_free(&control_);
}

} // namespace cuda
} // namespace pipec
