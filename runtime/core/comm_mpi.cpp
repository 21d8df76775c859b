//===- comm_mpi.cpp - The MPI communicator
//---------------------------------===//
//
// Part of pipec's runtime core. The only source of the runtime that calls
// MPI (communicator.h says what it does for the core).
//
//===----------------------------------------------------------------------===//
///
/// Every rank of the job is a rank of MPI_COMM_WORLD, which returns errors
/// instead of aborting (each becomes an RtError naming what failed).
///
/// Tensors: a message of `bytes` bytes travels as one MPI message per chunk
/// of at most kChunkBytes (MPI counts are int), all with the caller's tag;
/// MPI's non-overtaking rule keeps the chunks in order. A blocking receive
/// probes each chunk first, so that a size mismatch is reported as such and
/// not as an MPI truncation error. Sends leave from a host copy (made
/// before `send` returns, so the caller may overwrite the source); a device
/// the host cannot read is copied out with its ordered copies, and a
/// receive lands in host memory first. Those host buffers are reused
/// (StagingPool); an all-reduce goes through a HostView.
///
//===----------------------------------------------------------------------===//

#include "core/communicator.h"
#include "core/device.h"
#include "core/error.h"
#include "core/mpi_c.h"
#include "core/mpi_errors.h"

#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <mutex>

namespace pipec {
namespace rt {
namespace {

constexpr int64_t kChunkBytes = int64_t(1) << 30;

MPI_Op mpiOp(ReduceOp op) {
  switch (op) {
  case ReduceOp::Sum:
    return MPI_SUM;
  case ReduceOp::Min:
    return MPI_MIN;
  case ReduceOp::Max:
    return MPI_MAX;
  }
  return MPI_SUM;
}

/// Calls `fn(offset, count)` for each chunk of a `bytes`-byte message (at
/// least one, for an empty message too: the peer still expects it).
template <typename Fn> void forEachChunk(int64_t bytes, Fn &&fn) {
  int64_t offset = 0;
  do {
    int count = int(std::min(bytes - offset, kChunkBytes));
    fn(offset, count);
    offset += count;
  } while (offset < bytes);
}

/// Posts a message's chunks as nonblocking sends of `data` (or receives
/// into it), appending their requests.
void postChunks(bool sending, char *data, int64_t bytes, int peer, int tag,
                const std::string &what, std::vector<MPI_Request> &requests) {
  forEachChunk(bytes, [&](int64_t offset, int count) {
    MPI_Request request;
    if (sending)
      mpiCheck(MPI_Isend(data + offset, count, MPI_BYTE, peer, tag,
                         MPI_COMM_WORLD, &request),
               "MPI_Isend", what);
    else
      mpiCheck(MPI_Irecv(data + offset, count, MPI_BYTE, peer, tag,
                         MPI_COMM_WORLD, &request),
               "MPI_Irecv", what);
    requests.push_back(request);
  });
}

class MpiGroup : public CommGroup {
public:
  explicit MpiGroup(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_size(comm, &size_);
  }
  ~MpiGroup() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized)
      MPI_Comm_free(&comm_);
  }
  int size() const override { return size_; }
  MPI_Comm comm() const { return comm_; }

private:
  MPI_Comm comm_;
  int size_ = 1;
};

/// Host buffers for messages, kept for the next message: a send's copy, a
/// posted receive's landing place, a host-staged receive. The device
/// allocates them (Device::allocateStaging: page-locked on a GPU, so that
/// its copies run at the bus's speed), and a step sends the same sizes over
/// and over: a fresh buffer per message of tens of MiB costs its page
/// faults (and on a GPU a copy at pageable speed) every time. A buffer is
/// reused for a message of at least half its size; at most kKeepBytes are
/// kept idle. The buffers go back to the device in `clear` (the
/// communicator's finalize, while the device lives); a pool dropped without
/// it leaves them to the process's end.
class StagingPool {
public:
  static constexpr int64_t kKeepBytes = int64_t(4) << 30;

  /// A buffer taken from the pool; goes back when destroyed.
  class Buffer {
  public:
    Buffer() = default;
    Buffer(std::shared_ptr<StagingPool> pool, char *data, int64_t capacity)
        : pool_(std::move(pool)), data_(data), capacity_(capacity) {}
    Buffer(Buffer &&o) noexcept
        : pool_(std::move(o.pool_)), data_(o.data_), capacity_(o.capacity_) {
      o.data_ = nullptr;
    }
    Buffer &operator=(Buffer &&o) noexcept {
      std::swap(pool_, o.pool_);
      std::swap(data_, o.data_);
      std::swap(capacity_, o.capacity_);
      return *this;
    }
    ~Buffer() {
      if (pool_ && data_)
        pool_->give(data_, capacity_);
    }
    char *data() const { return data_; }

  private:
    std::shared_ptr<StagingPool> pool_;
    char *data_ = nullptr;
    int64_t capacity_ = 0;
  };

  static Buffer take(const std::shared_ptr<StagingPool> &pool, Device &device,
                     int64_t bytes) {
    bytes = std::max<int64_t>(bytes, 1);
    {
      std::lock_guard<std::mutex> lock(pool->mutex_);
      pool->device_ = &device;
      auto it = pool->idle_.lower_bound(bytes);
      if (it != pool->idle_.end() && it->first <= 2 * bytes) {
        Buffer b(pool, it->second, it->first);
        pool->idleBytes_ -= it->first;
        pool->idle_.erase(it);
        return b;
      }
    }
    return Buffer(pool, device.allocateStaging(bytes), bytes);
  }

  /// Returns every idle buffer to the device; buffers given back later are
  /// left to the process's end (the device may be gone by then).
  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto &[capacity, data] : idle_)
      device_->releaseStaging(data);
    idle_.clear();
    idleBytes_ = 0;
    closed_ = true;
  }

private:
  void give(char *data, int64_t capacity) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_)
      return;
    if (idleBytes_ + capacity > kKeepBytes) {
      device_->releaseStaging(data);
      return;
    }
    idle_.emplace(capacity, data);
    idleBytes_ += capacity;
  }

  std::mutex mutex_;
  Device *device_ = nullptr;
  std::multimap<int64_t, char *> idle_;
  int64_t idleBytes_ = 0;
  bool closed_ = false;
};

class MpiTransfer : public Transfer {
public:
  MpiTransfer(StagingPool::Buffer data, std::string what)
      : data_(std::move(data)), what_(std::move(what)) {}
  std::vector<MPI_Request> requests;
  char *data() { return data_.data(); }
  bool test() override {
    int flag = 0;
    mpiCheck(MPI_Testall(int(requests.size()), requests.data(), &flag,
                         MPI_STATUSES_IGNORE),
             "MPI_Testall", what_);
    return flag != 0;
  }
  void wait() override {
    mpiCheck(
        MPI_Waitall(int(requests.size()), requests.data(), MPI_STATUSES_IGNORE),
        "MPI_Waitall", what_);
  }

private:
  StagingPool::Buffer data_;
  std::string what_;
};

class MpiPostedReceive : public PostedReceive {
public:
  MpiPostedReceive(Device &device, int64_t bytes, std::string what,
                   StagingPool::Buffer data)
      : device_(device), bytes_(bytes), what_(std::move(what)),
        data_(std::move(data)) {}
  std::vector<MPI_Request> requests;
  char *data() { return data_.data(); }
  int64_t stagingBytes() const override { return bytes_; }
  void finish(void *dst) override {
    std::vector<MPI_Status> statuses(requests.size());
    if (MPI_Waitall(int(requests.size()), requests.data(), statuses.data()) !=
        MPI_SUCCESS)
      throw RtError(what_ + ": the receive failed (a message larger than the " +
                    std::to_string(bytes_) +
                    " bytes expected? sender and receiver disagree on the "
                    "tensor size)");
    int64_t got = 0;
    for (MPI_Status &st : statuses) {
      int count = 0;
      MPI_Get_count(&st, MPI_BYTE, &count);
      got += count;
    }
    if (got != bytes_)
      throw RtError(sizeMismatch(what_, got, bytes_));
    device_.toDevice(dst, data_.data(), bytes_);
  }

private:
  Device &device_;
  int64_t bytes_;
  std::string what_;
  StagingPool::Buffer data_;
};

class MpiCommunicator : public Communicator {
public:
  MpiCommunicator(int &argc, char **&argv) {
    int already = 0;
    MPI_Initialized(&already);
    if (!already && MPI_Init(&argc, &argv) != MPI_SUCCESS)
      throw RtError("MPI_Init failed");
    initialised_ = !already;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    MPI_Comm local = MPI_COMM_NULL;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0,
                            MPI_INFO_NULL, &local) == MPI_SUCCESS &&
        local != MPI_COMM_NULL) {
      MPI_Comm_rank(local, &localRank_);
      MPI_Comm_size(local, &localSize_);
      MPI_Comm_free(&local);
    }
    int *tagUb = nullptr, hasTagUb = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tagUb, &hasTagUb);
    if (hasTagUb && tagUb)
      tagUpperBound_ = *tagUb;
  }

  std::string name() const override {
    return hostStaged_ ? "MPI (host-staged)" : "MPI";
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int localRank() const override { return localRank_; }
  int localSize() const override { return localSize_; }
  int tagUpperBound() const override { return tagUpperBound_; }
  void useDevice(Device &device) override {
    device_ = &device;
    hostStaged_ = !device.hostAccessible();
  }

  void finalize() override {
    staging_->clear();
    if (initialised_) {
      initialised_ = false;
      MPI_Finalize();
    }
  }
  void abort(int status) override { MPI_Abort(MPI_COMM_WORLD, status); }

  void allreduce(int64_t *values, int count, ReduceOp op,
                 const std::string &what) override {
    mpiCheck(MPI_Allreduce(MPI_IN_PLACE, values, count, MPI_INT64_T, mpiOp(op),
                           MPI_COMM_WORLD),
             "MPI_Allreduce", what);
  }
  void allreduce(double *values, int count, ReduceOp op,
                 const std::string &what) override {
    mpiCheck(MPI_Allreduce(MPI_IN_PLACE, values, count, MPI_DOUBLE, mpiOp(op),
                           MPI_COMM_WORLD),
             "MPI_Allreduce", what);
  }
  void allgather(const void *mine, int bytes, void *all,
                 const std::string &what) override {
    mpiCheck(MPI_Allgather(mine, bytes, MPI_BYTE, all, bytes, MPI_BYTE,
                           MPI_COMM_WORLD),
             "MPI_Allgather", what);
  }
  std::vector<std::string> gather(const std::string &mine, int root,
                                  const std::string &what) override {
    return gatherStrings(mine, root, what);
  }
  std::vector<std::string> allgather(const std::string &mine,
                                     const std::string &what) override {
    return gatherStrings(mine, -1, what);
  }
  void barrier(const std::string &what) override {
    mpiCheck(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier", what);
  }

  std::unique_ptr<Transfer> sendHost(const void *data, int64_t bytes, int peer,
                                     int tag,
                                     const std::string &what) override {
    auto transfer = std::make_unique<MpiTransfer>(StagingPool::Buffer(), what);
    // (MPI_Isend reads the buffer only; its C binding takes const void *.)
    postChunks(true, static_cast<char *>(const_cast<void *>(data)), bytes, peer,
               tag, what, transfer->requests);
    return transfer;
  }
  void receiveHost(void *data, int64_t bytes, int peer, int tag,
                   const std::string &what) override {
    receiveChunks(static_cast<char *>(data), bytes, peer, tag, what);
  }

  std::unique_ptr<CommGroup> split(int color, int key,
                                   const std::string &what) override {
    MPI_Comm comm = MPI_COMM_NULL;
    mpiCheck(MPI_Comm_split(MPI_COMM_WORLD, color >= 0 ? color : MPI_UNDEFINED,
                            key, &comm),
             "MPI_Comm_split", what);
    if (comm == MPI_COMM_NULL)
      return nullptr;
    return std::make_unique<MpiGroup>(comm);
  }

  std::unique_ptr<Transfer> send(const void *src, int64_t bytes, int peer,
                                 int tag, const std::string &what) override {
    auto transfer = std::make_unique<MpiTransfer>(
        StagingPool::take(staging_, device(), bytes), what);
    device().toHost(transfer->data(), src, bytes);
    postChunks(true, transfer->data(), bytes, peer, tag, what,
               transfer->requests);
    return transfer;
  }

  std::unique_ptr<PostedReceive> post(int64_t bytes, int peer, int tag,
                                      const std::string &what) override {
    auto posted = std::make_unique<MpiPostedReceive>(
        device(), bytes, what, StagingPool::take(staging_, device(), bytes));
    postChunks(false, posted->data(), bytes, peer, tag, what, posted->requests);
    return posted;
  }

  void receive(void *dst, int64_t bytes, int peer, int tag,
               const std::string &what) override {
    if (!hostStaged_) {
      receiveChunks(static_cast<char *>(dst), bytes, peer, tag, what);
      return;
    }
    StagingPool::Buffer into = StagingPool::take(staging_, device(), bytes);
    receiveChunks(into.data(), bytes, peer, tag, what);
    device().toDevice(dst, into.data(), bytes);
  }

  void progress() override {
    // A probe that matches nothing still runs the progress engine.
    int flag = 0;
    mpiCheck(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag,
                        MPI_STATUS_IGNORE),
             "MPI_Iprobe", "progress of pending messages");
  }

  void allreduceSum(CommGroup &group, void *data, int64_t count, bool f64,
                    double scale, const std::string &what) override {
    const int64_t elem = f64 ? 8 : 4;
    HostView view(device(), data, count * elem);
    char *p = view.pull();
    MPI_Comm comm = static_cast<MpiGroup &>(group).comm();
    for (int64_t done = 0; done < count;) {
      int n = int(std::min<int64_t>(count - done, int64_t(1) << 30));
      mpiCheck(MPI_Allreduce(MPI_IN_PLACE, p + done * elem, n,
                             f64 ? MPI_DOUBLE : MPI_FLOAT, MPI_SUM, comm),
               "MPI_Allreduce", what);
      done += n;
    }
    if (scale != 1.0) {
      if (f64) {
        double *d = reinterpret_cast<double *>(p);
        for (int64_t i = 0; i < count; ++i)
          d[i] *= scale;
      } else {
        float *f = reinterpret_cast<float *>(p);
        const float s = float(scale);
        for (int64_t i = 0; i < count; ++i)
          f[i] *= s;
      }
    }
    view.push();
  }

private:
  /// Every rank's bytes on `root`, or on every rank when root < 0.
  std::vector<std::string> gatherStrings(const std::string &mine, int root,
                                         const std::string &what) {
    const bool everyone = root < 0, receives = everyone || rank_ == root;
    if (mine.size() > size_t(std::numeric_limits<int>::max() / 2))
      throw RtError(what + ": this rank's " + std::to_string(mine.size()) +
                    " bytes are too many to gather");
    int length = int(mine.size());
    std::vector<int> lengths(size_t(size_), 0), offsets(size_t(size_), 0);
    mpiCheck(everyone ? MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1,
                                      MPI_INT, MPI_COMM_WORLD)
                      : MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1,
                                   MPI_INT, root, MPI_COMM_WORLD),
             everyone ? "MPI_Allgather" : "MPI_Gather", what);
    std::string all;
    if (receives) {
      int64_t total = 0;
      for (int r = 0; r < size_; ++r) {
        offsets[size_t(r)] = int(total);
        total += lengths[size_t(r)];
      }
      if (total > std::numeric_limits<int>::max())
        throw RtError(what + ": the ranks' " + std::to_string(total) +
                      " bytes are too many to gather");
      all.resize(size_t(total));
    }
    mpiCheck(everyone ? MPI_Allgatherv(mine.data(), length, MPI_CHAR,
                                       all.data(), lengths.data(),
                                       offsets.data(), MPI_CHAR, MPI_COMM_WORLD)
                      : MPI_Gatherv(mine.data(), length, MPI_CHAR, all.data(),
                                    lengths.data(), offsets.data(), MPI_CHAR,
                                    root, MPI_COMM_WORLD),
             everyone ? "MPI_Allgatherv" : "MPI_Gatherv", what);
    std::vector<std::string> out;
    if (receives)
      for (int r = 0; r < size_; ++r)
        out.push_back(
            all.substr(size_t(offsets[size_t(r)]), size_t(lengths[size_t(r)])));
    return out;
  }

  /// Receives a message of `bytes` bytes into host memory, each chunk
  /// probed first so that another size is reported as such.
  void receiveChunks(char *into, int64_t bytes, int peer, int tag,
                     const std::string &what) {
    forEachChunk(bytes, [&](int64_t offset, int expected) {
      MPI_Status status;
      mpiCheck(MPI_Probe(peer, tag, MPI_COMM_WORLD, &status), "MPI_Probe",
               what);
      int count = 0;
      MPI_Get_count(&status, MPI_BYTE, &count);
      if (count != expected)
        throw RtError(sizeMismatch(what, offset + count, bytes));
      mpiCheck(MPI_Recv(into + offset, count, MPI_BYTE, peer, tag,
                        MPI_COMM_WORLD, MPI_STATUS_IGNORE),
               "MPI_Recv", what);
    });
  }

  Device &device() {
    if (!device_)
      throw RtError("internal error: a tensor sent before the device exists");
    return *device_;
  }

  bool initialised_ = false;
  int rank_ = 0, size_ = 1, localRank_ = 0, localSize_ = 1;
  int tagUpperBound_ = 32767;
  Device *device_ = nullptr;
  bool hostStaged_ = false;
  std::shared_ptr<StagingPool> staging_ = std::make_shared<StagingPool>();
};

} // namespace

std::unique_ptr<Communicator> makeMpiCommunicator(int &argc, char **&argv) {
  return std::make_unique<MpiCommunicator>(argc, argv);
}

} // namespace rt
} // namespace pipec
