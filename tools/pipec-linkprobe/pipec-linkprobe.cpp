//===- pipec-linkprobe.cpp - Message times between two ranks --------------===//
//
// Part of pipec. Run by `pipec topology --measure` as two MPI ranks:
//
//   mpirun -np 2 pipec-linkprobe --out FILE.json          (CPU stages)
//   mpirun -np 2 pipec-linkprobe-cuda --out FILE.json     (CUDA stages)
//
// Rank 0 and rank 1 send each other messages of 8 bytes to 64 MiB through
// the runtime's own Communicator and Device (runtime/core/communicator.h),
// so the times are those of a stage's sends: on the CPU a staging copy,
// then MPI; built with PIPEC_LINKPROBE_CUDA (pipec-linkprobe-cuda) the
// tensors are in the GPU's memory, and a message is the copy to the host,
// MPI and the copy back to the peer's GPU, whatever transport the runtime
// uses between the two ranks (they may share one GPU). Rank 0 writes, per
// size, the best one-way time of several round trips (half a round trip)
// as {"sizes": [...], "seconds": [...]} with the device's name and memory
// and the transport's name.
// pipec fits latency + bytes / bandwidth to them (`pipec topology
// --measure`, or `--fit FILE.json` for a file measured on another machine,
// such as a GPU node without the compiler).
//
//===----------------------------------------------------------------------===//

#include "core/communicator.h"
#include "core/device.h"
#ifdef PIPEC_LINKPROBE_CUDA
#include "cuda/device_factory.h"
#endif

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "core/mpi_c.h"

using namespace pipec::rt;

namespace {

/// The one-way times of messages of `sizes` bytes between ranks 0 and 1.
std::vector<double> probe(Communicator &comm, Device &device,
                          const std::vector<long long> &sizes) {
  const int rank = comm.rank(), peer = 1 - rank;
  const int64_t largest = sizes.back();
  DeviceBuffer tensor, into;
  tensor.allocate(device, largest, "the probe's message");
  into.allocate(device, largest, "the probe's receive");
  std::vector<char> ones(size_t(largest), 1);
  device.toDevice(tensor.get(), ones.data(), largest);
  device.synchronize();
  std::vector<double> best(sizes.size(), 1e30);
  for (size_t k = 0; k < sizes.size(); ++k) {
    const int64_t bytes = sizes[k];
    const int trips = bytes <= (1 << 16) ? 200 : bytes <= (4 << 20) ? 20 : 5;
    const std::string what =
        "the probe's message of " + std::to_string(bytes) + " bytes";
    for (int t = -2; t < trips; ++t) { // two unmeasured round trips first
      comm.barrier("the probe's round trip");
      const double start = MPI_Wtime();
      for (int leg = 0; leg < 2; ++leg) {
        if ((leg == 0) == (rank == 0)) {
          comm.send(tensor.get(), bytes, peer, 7, what)->wait();
        } else {
          comm.receive(into.get(), bytes, peer, 7, what);
          device.synchronize(); // the bytes are in the device's memory
        }
      }
      if (t >= 0)
        best[k] = std::min(best[k], (MPI_Wtime() - start) / 2);
    }
  }
  return best;
}

int writeTimes(const std::string &out, const std::vector<long long> &sizes,
               const std::vector<double> &seconds, const Device &device,
               const Communicator &comm) {
  std::FILE *f = std::fopen(out.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "pipec-linkprobe: error: cannot write %s\n",
                 out.c_str());
    return 1;
  }
  std::fprintf(f,
               "{\"format\": \"pipec.linkprobe/1\", \"device\": \"%s\", "
               "\"device_memory_bytes\": %lld, \"transport\": \"%s\", "
               "\"sizes\": [",
               device.name().c_str(),
               static_cast<long long>(device.memoryBytes()),
               comm.name().c_str());
  for (size_t k = 0; k < sizes.size(); ++k)
    std::fprintf(f, "%s%lld", k ? ", " : "", sizes[k]);
  std::fprintf(f, "], \"seconds\": [");
  for (size_t k = 0; k < seconds.size(); ++k)
    std::fprintf(f, "%s%.9g", k ? ", " : "", seconds[k]);
  std::fprintf(f, "]}\n");
  return std::fclose(f) == 0 ? 0 : 1;
}

} // namespace

int main(int argc, char **argv) {
  std::string out;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--out") == 0)
      out = argv[i + 1];
  std::unique_ptr<Communicator> comm;
  try {
#ifdef PIPEC_LINKPROBE_CUDA
    comm = pipec::cuda::makeCudaCommunicator(argc, argv);
#else
    comm = makeMpiCommunicator(argc, argv);
#endif
    if (comm->size() != 2 || out.empty()) {
      if (comm->rank() == 0)
        std::fprintf(stderr, "pipec-linkprobe: error: run as 2 ranks with "
                             "--out FILE.json\n");
      comm->finalize();
      return 2;
    }
    DeviceRequest request;
    request.localRank = comm->localRank();
#ifdef PIPEC_LINKPROBE_CUDA
    std::unique_ptr<Device> device = pipec::cuda::makeCudaDevice(request);
#else
    std::unique_ptr<Device> device = makeCpuDevice(request);
#endif
    comm->useDevice(*device);
    std::vector<long long> sizes;
    for (long long s = 8; s <= (64ll << 20); s *= 2)
      sizes.push_back(s);
    std::vector<double> seconds = probe(*comm, *device, sizes);
    int rc =
        comm->rank() == 0 ? writeTimes(out, sizes, seconds, *device, *comm) : 0;
    comm->finalize();
    return rc;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "pipec-linkprobe: error: %s\n", e.what());
    if (comm)
      comm->abort(1);
    return 1;
  }
}
