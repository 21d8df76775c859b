//===- communicator.h - How stage ranks talk to each other ------*- C++ -*-===//
//
// Part of pipec's runtime core.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The runtime core (start-up agreement, the step loss, checkpoints, the
/// program services' sends, receives and all-reduces) never calls MPI (or
/// NCCL) itself: it asks the process's `Communicator`. What a communicator
/// does falls in three parts:
///
/// - the job: this rank, the job's size, the ranks sharing this host, and
///   ending the job (finalize after a clean end, abort on a fatal error);
/// - host values: small collectives over every rank on host memory (the
///   start-up checks, the step loss, the checkpoint's file records, the
///   output files gathered on rank 0, host names, barriers);
/// - tensors: point-to-point messages of device memory between two ranks,
///   and sums of device memory over a `CommGroup` (a stage's replicas, a
///   group of stages sharing tied weights).
///
/// Which communicator a stage executable has is decided when it is linked,
/// like its `Device` (device.h): `runStage` takes both factories. The MPI
/// communicator (comm_mpi.cpp) serves both runtimes today: on a device
/// whose memory the host cannot read it stages every tensor through host
/// memory with the device's copies. CUDA stage executables wrap it
/// (runtime/cuda/comm_cuda.cpp): ranks sharing a GPU move their tensors by
/// CUDA IPC (the default; PIPEC_CUDA_IPC=0 for host memory), and with
/// PIPEC_NCCL=1 / PIPEC_NCCL_P2P=1 sums and messages between GPUs go by NCCL
/// with the same contract (bootstrapped, and host values exchanged, over
/// MPI).
///
/// Contracts shared by every implementation:
/// - A call that fails throws RtError naming `what` (the caller's words:
///   "the send to stage 2, channel 1, microbatch 3").
/// - `send` returns once `src` may be overwritten; the returned transfer
///   completes when the peer may have it (test / wait).
/// - Messages between two ranks with one tag arrive in the order sent.
/// - A receive of a size other than the size sent is an error naming both
///   sizes where the transport can tell (MPI can; NCCL cannot and relies on
///   the compiler's sizes, which both stages share).
/// - Collectives are called by every member in the same order.
///
//===----------------------------------------------------------------------===//

#ifndef PIPEC_RUNTIME_CORE_COMMUNICATOR_H
#define PIPEC_RUNTIME_CORE_COMMUNICATOR_H

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace pipec {
namespace rt {

class Device;

enum class ReduceOp { Sum, Min, Max };

/// A send or receive in flight.
class Transfer {
public:
  virtual ~Transfer() = default;
  /// True once complete; never blocks.
  virtual bool test() = 0;
  virtual void wait() = 0;
};

/// A receive posted ahead of the program's receive (prefetch): the message
/// lands in a staging buffer until `finish` moves it to the destination.
class PostedReceive {
public:
  virtual ~PostedReceive() = default;
  /// Waits for the message, checks its size, copies it to `dst` (device
  /// memory of `bytes` bytes, the size posted).
  virtual void finish(void *dst) = 0;
  /// Bytes of staging memory this receive holds.
  virtual int64_t stagingBytes() const = 0;
};

/// Ranks that sum tensors together.
class CommGroup {
public:
  virtual ~CommGroup() = default;
  virtual int size() const = 0;
};

class Communicator {
public:
  virtual ~Communicator() = default;

  // The job.
  /// For messages: "MPI (host-staged)".
  virtual std::string name() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// This rank's index among the ranks on its host, and their number.
  virtual int localRank() const = 0;
  virtual int localSize() const = 0;
  /// The largest message tag the transport carries.
  virtual int tagUpperBound() const = 0;
  /// The device whose memory `send`, `receive` and `allreduceSum` take
  /// (set once the device exists; the device is chosen by local rank).
  virtual void useDevice(Device &device) = 0;
  /// Ends this process's part in the job after a clean end (or an agreed
  /// refusal: every rank calls it).
  virtual void finalize() = 0;
  /// Ends the whole job at once (a fatal error on one rank while the
  /// others may wait on it). Must be safe from any thread.
  virtual void abort(int status) = 0;

  // Host values, over every rank.
  virtual void allreduce(int64_t *values, int count, ReduceOp op,
                         const std::string &what) = 0;
  virtual void allreduce(double *values, int count, ReduceOp op,
                         const std::string &what) = 0;
  /// `all` receives size() records of `bytes` bytes, rank order.
  virtual void allgather(const void *mine, int bytes, void *all,
                         const std::string &what) = 0;
  /// Every rank gets every rank's bytes (any length; rank order).
  virtual std::vector<std::string> allgather(const std::string &mine,
                                             const std::string &what) = 0;
  /// Rank `root` gets every rank's bytes (rank order); others get nothing.
  virtual std::vector<std::string> gather(const std::string &mine, int root,
                                          const std::string &what) = 0;
  virtual void barrier(const std::string &what) = 0;
  /// Host bytes to one rank (start-up data such as another host's
  /// checkpoint tensors): `data` must stay valid until the transfer
  /// completes. Received, in the order sent, by `receiveHost`.
  virtual std::unique_ptr<Transfer> sendHost(const void *data, int64_t bytes,
                                             int peer, int tag,
                                             const std::string &what) = 0;
  virtual void receiveHost(void *data, int64_t bytes, int peer, int tag,
                           const std::string &what) = 0;

  // Tensors in the device's memory.
  /// The ranks that pass the same `color` (>= 0) form a group ordered by
  /// `key`; a rank passing a negative color gets nullptr. Collective over
  /// every rank.
  virtual std::unique_ptr<CommGroup> split(int color, int key,
                                           const std::string &what) = 0;
  virtual std::unique_ptr<Transfer> send(const void *src, int64_t bytes,
                                         int peer, int tag,
                                         const std::string &what) = 0;
  virtual std::unique_ptr<PostedReceive> post(int64_t bytes, int peer, int tag,
                                              const std::string &what) = 0;
  /// Receives `bytes` bytes from `peer` into `dst`; returns when they are
  /// there (ordered before the kernels queued after it).
  virtual void receive(void *dst, int64_t bytes, int peer, int tag,
                       const std::string &what) = 0;
  /// Lets pending nonblocking transfers move without waiting for any. An
  /// MPI library progresses messages only inside MPI calls: a large message
  /// sent by copy-in/copy-out (shared memory without a single-copy
  /// mechanism) needs its sender to call in again while it computes.
  virtual void progress() {}
  /// Sums `count` floats (float64 with `f64`) at `data` over `group` in
  /// place, then multiplies them by `scale` unless it is 1.
  virtual void allreduceSum(CommGroup &group, void *data, int64_t count,
                            bool f64, double scale,
                            const std::string &what) = 0;
};

/// What `runStage` calls first: starts the transport (MPI_Init) from the
/// command line and returns this rank's communicator.
using CommunicatorFactory = std::unique_ptr<Communicator> (*)(int &argc,
                                                              char **&argv);

/// OpenMPI (or any MPI) over MPI_COMM_WORLD; tensors of a device the host
/// cannot read travel through host memory.
std::unique_ptr<Communicator> makeMpiCommunicator(int &argc, char **&argv);

} // namespace rt
} // namespace pipec

#endif // PIPEC_RUNTIME_CORE_COMMUNICATOR_H
