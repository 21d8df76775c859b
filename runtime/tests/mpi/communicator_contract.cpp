//===- communicator_contract.cpp - What every Communicator must do
//---------===//
//
// Part of pipec's runtime tests.
//
//===----------------------------------------------------------------------===//
///
/// Run with 3 or more ranks (mpirun -n 3). Checks the contract of
/// core/communicator.h on the communicator and device this executable is
/// built for: the MPI communicator on the CPU device, or (built with
/// PIPEC_CONTRACT_CUDA, ctest label gpu) on the CUDA device, where every
/// tensor is staged through host memory: the job's ranks, host-value
/// collectives, groups, point-to-point messages (order, overwriting the
/// source after `send`, empty and odd sizes, prefetched receives), size
/// mismatches reported as such, and sums over a group with a scale.
/// Each rank prints its failures; rank 0 ends with "N passed, M failed"
/// over all ranks, and the exit status is 1 if any check failed anywhere.
///
//===----------------------------------------------------------------------===//

#include "core/communicator.h"
#include "core/device.h"
#include "core/error.h"
#ifdef PIPEC_CONTRACT_CUDA
#include "cuda/device_factory.h"
#endif

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <unistd.h>
#include <vector>

using namespace pipec::rt;

namespace {

int passed = 0, failed = 0;
int me = -1;

void check(bool ok, const std::string &what) {
  if (ok) {
    ++passed;
    return;
  }
  ++failed;
  std::fprintf(stderr, "rank %d: FAILED: %s\n", me, what.c_str());
}

/// Runs `fn`, which must throw an RtError whose text holds `needle`.
void expectError(const std::function<void()> &fn, const std::string &needle,
                 const std::string &what) {
  try {
    fn();
  } catch (const std::exception &e) {
    check(std::string(e.what()).find(needle) != std::string::npos,
          what + ": error '" + e.what() + "' lacks '" + needle + "'");
    return;
  }
  check(false, what + ": no error");
}

std::vector<char> pattern(int64_t bytes, int seed) {
  std::vector<char> v(size_t(std::max<int64_t>(bytes, 1)));
  for (int64_t i = 0; i < bytes; ++i)
    v[size_t(i)] = char((i * 31 + seed * 7) & 0x7f);
  return v;
}

/// `bytes` bytes of device memory holding `host` (zeros when it is empty).
struct DeviceBytes {
  DeviceBuffer buffer;
  DeviceBytes(Device &d, const std::vector<char> &host, int64_t bytes) {
    buffer.allocate(d, std::max<int64_t>(bytes, 64), "test bytes");
    if (bytes > 0 && int64_t(host.size()) >= bytes)
      d.toDevice(buffer.get(), host.data(), bytes);
  }
  std::vector<char> read(Device &d, int64_t bytes) {
    std::vector<char> out(size_t(std::max<int64_t>(bytes, 1)), 0);
    if (bytes > 0)
      d.toHost(out.data(), buffer.get(), bytes);
    return out;
  }
};

bool sameBytes(const std::vector<char> &a, const std::vector<char> &b,
               int64_t bytes) {
  return bytes == 0 || std::memcmp(a.data(), b.data(), size_t(bytes)) == 0;
}

void checkJob(Communicator &comm) {
  const int n = comm.size();
  check(n >= 3,
        "the contract test needs 3 or more ranks, got " + std::to_string(n));
  check(comm.rank() >= 0 && comm.rank() < n, "rank inside the job");
  check(comm.localRank() >= 0 && comm.localRank() < comm.localSize() &&
            comm.localSize() <= n,
        "local rank inside the host's ranks");
  check(comm.tagUpperBound() >= 32767, "tags up to 32767 at least");
  check(!comm.name().empty(), "a name for messages");
}

bool sameBytes(const std::vector<char> &a, const std::vector<char> &b,
               int64_t bytes);

void checkHostValues(Communicator &comm) {
  const int n = comm.size(), r = comm.rank();
  int64_t v[3] = {r, r, r};
  comm.allreduce(v, 1, ReduceOp::Sum, "sum");
  comm.allreduce(v + 1, 1, ReduceOp::Min, "min");
  comm.allreduce(v + 2, 1, ReduceOp::Max, "max");
  check(v[0] == int64_t(n) * (n - 1) / 2 && v[1] == 0 && v[2] == n - 1,
        "int64 sum/min/max");
  double d[2] = {0.5 * r, -double(r)};
  comm.allreduce(d, 2, ReduceOp::Sum, "double sum");
  check(d[0] == 0.25 * n * (n - 1) && d[1] == -0.5 * n * (n - 1),
        "double sum of two values");

  struct Record {
    int64_t rank, square;
  } mine = {r, int64_t(r) * r};
  std::vector<Record> all(static_cast<size_t>(n));
  comm.allgather(&mine, int(sizeof(Record)), all.data(), "allgather");
  bool ordered = true;
  for (int i = 0; i < n; ++i)
    ordered &= all[size_t(i)].rank == i && all[size_t(i)].square == i * i;
  check(ordered, "allgather in rank order");

  // Rank r contributes r copies of 'a' + r (rank 0: nothing) to root 1.
  std::vector<std::string> got =
      comm.gather(std::string(size_t(r), char('a' + r)), 1, "gather");
  if (r == 1) {
    bool ok = int(got.size()) == n;
    for (int i = 0; ok && i < n; ++i)
      ok = got[size_t(i)] == std::string(size_t(i), char('a' + i));
    check(ok, "gather on root 1, every rank's bytes in rank order");
  } else {
    check(got.empty(), "gather gives nothing off the root");
  }
  // Every rank gets every rank's bytes, any length.
  std::vector<std::string> every =
      comm.allgather(std::string(size_t(2 * r), char('k' + r)), "allgather");
  bool ok = int(every.size()) == n;
  for (int i = 0; ok && i < n; ++i)
    ok = every[size_t(i)] == std::string(size_t(2 * i), char('k' + i));
  check(ok, "allgather of strings, every rank's in rank order");
  // Host bytes: rank r sends two messages to every other rank, received in
  // the order sent.
  std::vector<std::vector<char>> out;
  std::vector<std::unique_ptr<Transfer>> sends;
  out.reserve(size_t(2 * n));
  for (int to = 0; to < n; ++to)
    for (int k = 0; k < 2 && to != r; ++k) {
      out.push_back(pattern(100 + k, 10 * r + to + k));
      sends.push_back(
          comm.sendHost(out.back().data(), 100 + k, to, 3, "host bytes"));
    }
  ok = true;
  for (int from = 0; from < n; ++from)
    for (int k = 0; k < 2 && from != r; ++k) {
      std::vector<char> in(size_t(100 + k));
      comm.receiveHost(in.data(), 100 + k, from, 3, "host bytes");
      ok &= sameBytes(in, pattern(100 + k, 10 * from + r + k), 100 + k);
    }
  for (auto &t : sends)
    t->wait();
  check(ok, "host bytes between every pair, in order");
  comm.barrier("barrier");
}

void checkGroups(Communicator &comm) {
  const int n = comm.size(), r = comm.rank();
  // Rank 0 stays out; the others form odd and even groups.
  std::unique_ptr<CommGroup> g =
      comm.split(r == 0 ? -1 : r % 2, -r, "odd/even groups");
  if (r == 0) {
    check(!g, "a negative color gives no group");
  } else {
    int members = 0;
    for (int i = 1; i < n; ++i)
      members += i % 2 == r % 2;
    check(g && g->size() == members, "group size");
  }
}

void checkMessages(Communicator &comm, Device &device) {
  const int n = comm.size(), r = comm.rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  // Sizes: empty, odd, a few pages.
  for (int64_t bytes : {int64_t(0), int64_t(13), int64_t(3 << 12)}) {
    std::vector<char> out = pattern(bytes, r);
    DeviceBytes src(device, out, bytes);
    std::unique_ptr<Transfer> t =
        comm.send(src.buffer.get(), bytes, next, 5, "ring send");
    // The source may be overwritten as soon as send returns.
    std::vector<char> junk(size_t(std::max<int64_t>(bytes, 1)), 'x');
    if (bytes > 0)
      device.toDevice(src.buffer.get(), junk.data(), bytes);
    DeviceBytes dst(device, {}, bytes);
    comm.receive(dst.buffer.get(), bytes, prev, 5, "ring receive");
    t->wait();
    check(sameBytes(dst.read(device, bytes), pattern(bytes, prev), bytes),
          "ring message of " + std::to_string(bytes) + " bytes");
  }
  // Two messages with one tag arrive in the order sent; a prefetched
  // receive (posted before the send) gets the first.
  {
    std::unique_ptr<PostedReceive> early =
        comm.post(64, prev, 9, "posted receive");
    check(early->stagingBytes() >= 0, "posted receive reports its staging");
    comm.barrier("posted before sent");
    std::vector<char> a = pattern(64, 100 + r), b = pattern(64, 200 + r);
    DeviceBytes sa(device, a, 64), sb(device, b, 64);
    std::vector<std::unique_ptr<Transfer>> sends;
    sends.push_back(comm.send(sa.buffer.get(), 64, next, 9, "first"));
    sends.push_back(comm.send(sb.buffer.get(), 64, next, 9, "second"));
    DeviceBytes first(device, {}, 0), second(device, {}, 0);
    early->finish(first.buffer.get());
    comm.receive(second.buffer.get(), 64, prev, 9, "second receive");
    for (auto &s : sends)
      s->wait();
    check(sameBytes(first.read(device, 64), pattern(64, 100 + prev), 64) &&
              sameBytes(second.read(device, 64), pattern(64, 200 + prev), 64),
          "messages of one tag in order, the posted receive first");
    // test() never blocks and ends true once waited for.
    check(sends[0]->test(), "a completed transfer tests true");
  }
  comm.barrier("before size mismatches");
  // A receive of another size than sent is reported as such, blocking or
  // posted.
  {
    std::vector<char> out = pattern(24, r);
    DeviceBytes src(device, out, 24);
    std::unique_ptr<Transfer> t =
        comm.send(src.buffer.get(), 24, next, 11, "24 bytes");
    DeviceBytes dst(device, {}, 0);
    expectError(
        [&] { comm.receive(dst.buffer.get(), 32, prev, 11, "expects 32"); },
        "disagree on the tensor size", "blocking receive of the wrong size");
    // The message is still there: receive it with its size.
    comm.receive(dst.buffer.get(), 24, prev, 11, "the 24 bytes");
    t->wait();
    check(sameBytes(dst.read(device, 24), pattern(24, prev), 24),
          "the mismatched message, received with its own size");
  }
  {
    std::unique_ptr<PostedReceive> posted =
        comm.post(16, prev, 12, "posted 16");
    std::vector<char> out = pattern(8, r);
    DeviceBytes src(device, out, 8);
    std::unique_ptr<Transfer> t =
        comm.send(src.buffer.get(), 8, next, 12, "8 bytes");
    DeviceBytes dst(device, {}, 0);
    expectError([&] { posted->finish(dst.buffer.get()); },
                "disagree on the tensor size",
                "posted receive of the wrong size");
    t->wait();
  }
  comm.barrier("after size mismatches");
}

void checkSums(Communicator &comm, Device &device) {
  const int n = comm.size(), r = comm.rank();
  std::unique_ptr<CommGroup> all = comm.split(0, r, "every rank");
  check(all && all->size() == n, "one group of every rank");
  if (!all)
    return;
  // float32: element i of rank r is r + i / 4; the sum times 0.5.
  const int64_t count = 1000;
  std::vector<float> f(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i)
    f[size_t(i)] = float(r) + float(i) / 4;
  DeviceBuffer fb;
  fb.allocate(device, count * 4, "floats");
  device.toDevice(fb.get(), f.data(), count * 4);
  comm.allreduceSum(*all, fb.get(), count, /*f64=*/false, 0.5, "float sum");
  device.toHost(f.data(), fb.get(), count * 4);
  bool ok = true;
  for (int64_t i = 0; i < count; ++i)
    ok &= f[size_t(i)] == float(0.5 * (0.5 * n * (n - 1) + n * (i / 4.0)));
  check(ok, "float32 sum over the group, scaled by 0.5");
  // float64, no scale; a group of the odd ranks leaves the others alone.
  std::unique_ptr<CommGroup> odd = comm.split(r % 2 ? 0 : -1, r, "odd ranks");
  std::vector<double> d = {double(r), 1e-17 * r, -1.0};
  DeviceBuffer db;
  db.allocate(device, 3 * 8, "doubles");
  device.toDevice(db.get(), d.data(), 3 * 8);
  if (odd)
    comm.allreduceSum(*odd, db.get(), 3, /*f64=*/true, 1.0, "double sum");
  device.toHost(d.data(), db.get(), 3 * 8);
  double oddSum = 0;
  int odds = 0;
  for (int i = 1; i < n; i += 2) {
    oddSum += i;
    ++odds;
  }
  if (odd)
    check(d[0] == oddSum && d[2] == -double(odds) &&
              std::fabs(d[1] - 1e-17 * oddSum) < 1e-30,
          "float64 sum over the odd ranks");
  else
    check(d[0] == double(r) && d[2] == -1.0, "an even rank's data untouched");
  // Each rank a group of its own, summed twice (the CUDA communicator with
  // PIPEC_NCCL=1 makes a NCCL communicator of one rank at the first sum:
  // NCCL's start and sum, on one GPU too).
  std::unique_ptr<CommGroup> alone = comm.split(r, 0, "each rank alone");
  check(alone && alone->size() == 1, "a group of one rank");
  if (!alone)
    return;
  for (int round = 0; round < 2; ++round) {
    for (int64_t i = 0; i < count; ++i)
      f[size_t(i)] = float(r) + float(i) / 4;
    device.toDevice(fb.get(), f.data(), count * 4);
    comm.allreduceSum(*alone, fb.get(), count, /*f64=*/false, 2.0,
                      "a sum over one rank");
    device.toHost(f.data(), fb.get(), count * 4);
    bool same = true;
    for (int64_t i = 0; i < count; ++i)
      same &= f[size_t(i)] == 2 * (float(r) + float(i) / 4);
    check(same, "a sum over a group of one rank, scaled by 2 (round " +
                    std::to_string(round + 1) + ")");
  }
}

} // namespace

/// A large message completes while its sender only calls progress(). MPI
/// moves messages only inside its calls: a sender busy computing would
/// hold back the rest of a message sent by copy-in/copy-out (these tests
/// run with OpenMPI's shared-memory single-copy mechanism off). Rank 1
/// tells rank 0 that the bytes arrived through a file, not through MPI.
void checkProgress(Communicator &comm, Device &device) {
  const int r = comm.rank();
  const int64_t bytes = int64_t(16) << 20;
  const std::vector<std::string> ids =
      comm.allgather(std::to_string(getpid()), "progress: ids");
  const std::filesystem::path flag = std::filesystem::temp_directory_path() /
                                     ("pipec-progress-" + ids[0] + ".flag");
  if (r == 0)
    std::filesystem::remove(flag);
  comm.barrier("progress: start");
  if (r == 0) {
    DeviceBytes src(device, pattern(bytes, 3), bytes);
    std::unique_ptr<Transfer> t =
        comm.send(src.buffer.get(), bytes, 1, 21, "16 MiB");
    const auto start = std::chrono::steady_clock::now();
    bool arrived = false;
    while (!arrived && std::chrono::steady_clock::now() - start <
                           std::chrono::seconds(30)) {
      comm.progress();
      arrived = std::filesystem::exists(flag);
    }
    check(arrived, "a 16 MiB message arrives while its sender only calls "
                   "progress() (30 s)");
    t->wait();
    std::filesystem::remove(flag);
  } else if (r == 1) {
    DeviceBytes dst(device, {}, bytes);
    comm.receive(dst.buffer.get(), bytes, 0, 21, "16 MiB");
    const bool same =
        sameBytes(dst.read(device, bytes), pattern(bytes, 3), bytes);
    std::ofstream(flag) << "arrived\n";
    check(same, "the 16 MiB message's bytes");
  }
  comm.barrier("progress: end");
}

int main(int argc, char **argv) {
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<Device> device;
  try {
#ifdef PIPEC_CONTRACT_CUDA
    comm = pipec::cuda::makeCudaCommunicator(argc, argv);
#else
    comm = makeMpiCommunicator(argc, argv);
#endif
    me = comm->rank();
    DeviceRequest request;
    request.localRank = comm->localRank();
#ifdef PIPEC_CONTRACT_CUDA
    // The same checks with the tensors in GPU memory (host-staged MPI);
    // every rank sees the same GPUs, so every rank skips alike.
    try {
      device = pipec::cuda::makeCudaDevice(request);
    } catch (const std::exception &e) {
      if (me == 0)
        std::printf("skipped: no GPU (%s)\n", e.what());
      comm->finalize();
      return 0;
    }
#else
    device = makeCpuDevice(request);
#endif
    comm->useDevice(*device);
    checkJob(*comm);
    checkHostValues(*comm);
    checkGroups(*comm);
    checkMessages(*comm, *device);
    checkSums(*comm, *device);
    checkProgress(*comm, *device);
  } catch (const std::exception &e) {
    std::fprintf(stderr, "rank %d: FAILED with an error: %s\n", me, e.what());
    if (comm)
      comm->abort(1);
    return 1;
  }
  int64_t totals[2] = {passed, failed};
  comm->allreduce(totals, 2, ReduceOp::Sum, "the totals");
  if (me == 0)
    std::printf("%s: %s\n%lld passed, %lld failed\n", comm->name().c_str(),
                totals[1] ? "FAILED" : "ok", static_cast<long long>(totals[0]),
                static_cast<long long>(totals[1]));
  comm->finalize();
  return totals[1] ? 1 : 0;
}
