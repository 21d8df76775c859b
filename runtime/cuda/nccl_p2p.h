//===- nccl_p2p.h - Tensors between ranks by ncclSend / ncclRecv -*- C++
//-*-===//
//
// Part of pipec's CUDA runtime.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The CUDA communicator's point-to-point path by NCCL (PIPEC_NCCL_P2P=1,
/// opt-in: written without a GPU that could run it, see runtime/README.md).
/// It keeps the runtime's contract (core/communicator.h): a message has a
/// tag, messages of one tag arrive in order, and the receiver may ask for
/// tags in another order than they were sent. NCCL pairs a pair's sends
/// and receives by their order only, so:
///
///  1. `send` copies the tensor into a device slot of the sender's on the
///     kernels' stream (the source may be overwritten once send returns),
///     queues `ncclSend` from the slot on a stream of the communicator
///     (after the copy, by an event) and sends the receiver an MPI control
///     record with the message's tag: its size and its sequence number
///     among this sender's messages to that receiver;
///  2. `receive` for tag T takes that peer's control records in sequence
///     (MPI_ANY_TAG from that peer matches them in the order sent) and
///     queues one `ncclRecv` per record in that order: into the
///     destination for T's record (after the kernels queued so far, by an
///     event), into a slot of the receiver's for the others, which later
///     receives of their tags copy out. NCCL's order is the sender's.
///
/// Neither host waits for the other's GPU; no host has to answer a request
/// while it waits elsewhere. Every ordered pair of ranks has a NCCL
/// communicator of its own (two ranks: the sender and the receiver) with a
/// stream of its own at each end, so a rank never sends and receives on
/// one communicator, and its messages to one peer never queue behind those
/// to, or from, another. (A communicator per direction, the first design,
/// could hang: on one communicator and stream a rank's send to its
/// successor queued before its receive from its predecessor, the kernels
/// waiting for that receive, and the successor doing the same the other
/// way round wait for each other in a DualPipeV step, and across peers in
/// the interleaved loop.) NCCL makes a pair's connection at its first
/// message, and that needs both ranks: start() makes every pair's
/// communicator and connection in one order that all ranks follow, so a
/// first ncclSend never blocks its host on the peer. A rank joins 2(n - 1)
/// communicators: fine for pipelines of tens of ranks.
///
/// Slots are reused once the device has passed their last use (an event,
/// queried by the host), else a new one is allocated: a rank holds at most
/// the bytes it had in flight to, or ahead from, each peer.
///
//===----------------------------------------------------------------------===//

#ifndef PIPEC_RUNTIME_CUDA_NCCL_P2P_H
#define PIPEC_RUNTIME_CUDA_NCCL_P2P_H

#include "core/communicator.h"
#include "core/mpi_c.h"
#include "nccl_api.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace pipec {
namespace cuda {

class NcclP2p {
public:
  /// `compute`: the stream the kernels run on.
  NcclP2p(const Nccl &nccl, cudaStream_t compute, int rank, int size);
  ~NcclP2p();
  NcclP2p(const NcclP2p &) = delete;
  NcclP2p &operator=(const NcclP2p &) = delete;

  /// Collective over every rank: every ordered pair's two-rank NCCL
  /// communicator (the sender makes the pair's unique id; the ids are
  /// gathered over `mpi`), connected, and the control records' MPI
  /// communicator. A rank that cannot make its ids refuses with the others
  /// (RtError on every rank); a failure after that ends the job (its pair
  /// partners wait in NCCL).
  void start(rt::Communicator &mpi);
  /// Collective: waits (a bounded time) for the queued sends, then frees
  /// everything; a send never received is aborted with a note.
  void finish(rt::Communicator &mpi);

  std::unique_ptr<rt::Transfer> send(const void *src, int64_t bytes, int peer,
                                     int tag, const std::string &what);
  void receive(void *dst, int64_t bytes, int peer, int tag,
               const std::string &what);

private:
  /// What the sender tells the receiver per message.
  struct Record {
    uint32_t magic = 0;
    uint32_t pad = 0;
    int64_t bytes = 0;
    int64_t sequence = 0;
  };
  /// Device memory of the sender's or the receiver's, reused once `free`
  /// (recorded after its last use) has been passed.
  struct Slot {
    char *data = nullptr;
    int64_t capacity = 0;
    cudaEvent_t free = nullptr;
    /// A receiver's slot: its message is in it once this is passed.
    cudaEvent_t landed = nullptr;
    bool used = false;
    /// A receiver's slot holding a message not yet copied out.
    bool busy = false;
  };
  /// A message received ahead of its tag's receive (or of the wrong
  /// size), in a slot of recvSlots_[peer].
  struct Early {
    Record record;
    int slot = -1;
  };
  /// The communicator and stream of one ordered pair at this end; in the
  /// two-rank communicator the sender is rank 0, the receiver rank 1.
  struct Pair {
    ncclComm_t comm = nullptr;
    cudaStream_t stream = nullptr;
  };
  static constexpr int kSenderRank = 0, kReceiverRank = 1;
  /// start(): every pair's connection made (one byte each, in one order
  /// that every rank follows), so that no first ncclSend waits on the host
  /// for its peer's first ncclRecv.
  void connectAll();
  /// Calls f(a, b, this rank's end of the pair a -> b) for every ordered
  /// pair this rank is in, in the one order every rank follows (pairs are
  /// made, connected, destroyed and aborted in it: each may wait for the
  /// pair's other rank).
  void forEachPair(const std::function<void(int, int, Pair &)> &f);
  /// finish(): the control records this rank never took (messages its
  /// program never asked for), received into slots so that every send
  /// completes.
  void takeTheRest(rt::Communicator &mpi);
  int freeSlot(std::vector<Slot> &slots, int64_t bytes,
               const std::string &what);
  /// Receives `peer`'s next control record (in the order sent), sets `tag`
  /// to its tag, and checks it.
  Record takeRecord(int peer, int &tag, const std::string &what);
  /// Queues the ncclRecv of a message received ahead of its receive (or
  /// of another size than asked) into a slot.
  void queueEarly(int peer, int tag, const Record &r, const std::string &what);
  /// Copies an early message out of its slot into `dst` on the kernels'
  /// stream.
  void landEarly(const Early &e, int peer, void *dst, const std::string &what);

  const Nccl &nccl_;
  cudaStream_t compute_;
  int rank_, size_;
  /// Per peer: the pair this rank sends it on, and the one it receives
  /// from it on (none for this rank itself).
  std::vector<Pair> to_, from_;
  bool started_ = false;
  MPI_Comm control_ = MPI_COMM_NULL;
  /// Per peer: the sequence numbers of the next message sent and of the
  /// next control record to take; the slots; the early messages by tag.
  std::map<int, int64_t> sent_, taken_;
  std::map<int, std::vector<Slot>> sendSlots_, recvSlots_;
  std::map<std::pair<int, int>, std::deque<Early>> early_;
  /// Recorded on one stream and waited for by another at once (a wait
  /// takes the event's state when it is queued, so one event serves all).
  cudaEvent_t order_ = nullptr;
  /// `waiter` waits for what `first` has queued so far.
  void after(cudaStream_t waiter, cudaStream_t first, const std::string &what);
};

} // namespace cuda
} // namespace pipec

#endif // PIPEC_RUNTIME_CUDA_NCCL_P2P_H
