//===- pipec-linkprobe.cpp - Message times between two ranks --------------===//
//
// Part of pipec. Run by `pipec topology --measure` as two MPI ranks:
//
//   mpirun -np 2 pipec-linkprobe --out FILE.json
//
// Rank 0 and rank 1 send each other messages of 8 bytes to 64 MiB, the way
// a CPU stage's runtime does (the sender copies the tensor into a staging
// buffer, then MPI_Isend; the receiver receives into place), and rank 0
// writes, per size, the best one-way time of several round trips (half a
// round trip) as {"sizes": [...], "seconds": [...]}. pipec fits
// latency + bytes / bandwidth to them.
//
//===----------------------------------------------------------------------===//

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

int main(int argc, char **argv) {
  std::string out;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--out") == 0)
      out = argv[i + 1];
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 2 || out.empty()) {
    if (rank == 0)
      std::fprintf(stderr, "pipec-linkprobe: error: run as 2 ranks with "
                           "--out FILE.json\n");
    MPI_Finalize();
    return 2;
  }
  const int peer = 1 - rank;
  std::vector<long long> sizes;
  for (long long s = 8; s <= (64ll << 20); s *= 2)
    sizes.push_back(s);
  const long long most = sizes.back();
  const size_t largest = static_cast<size_t>(most);
  std::vector<char> tensor(largest, 1), staging(largest), into(largest);
  std::vector<double> best(sizes.size(), 1e30);
  for (size_t k = 0; k < sizes.size(); ++k) {
    const int bytes = int(sizes[k]);
    const int trips = sizes[k] <= (1 << 16)   ? 200
                      : sizes[k] <= (4 << 20) ? 20
                                              : 5;
    for (int t = -2; t < trips; ++t) { // two unmeasured round trips first
      MPI_Barrier(MPI_COMM_WORLD);
      const double start = MPI_Wtime();
      for (int leg = 0; leg < 2; ++leg) {
        if ((leg == 0) == (rank == 0)) {
          std::memcpy(staging.data(), tensor.data(), size_t(bytes));
          MPI_Request request;
          MPI_Isend(staging.data(), bytes, MPI_BYTE, peer, 7, MPI_COMM_WORLD,
                    &request);
          MPI_Wait(&request, MPI_STATUS_IGNORE);
        } else {
          MPI_Recv(into.data(), bytes, MPI_BYTE, peer, 7, MPI_COMM_WORLD,
                   MPI_STATUS_IGNORE);
        }
      }
      if (t >= 0)
        best[k] = std::min(best[k], (MPI_Wtime() - start) / 2);
    }
  }
  int rc = 0;
  if (rank == 0) {
    std::FILE *f = std::fopen(out.c_str(), "w");
    if (!f) {
      std::fprintf(stderr, "pipec-linkprobe: error: cannot write %s\n",
                   out.c_str());
      rc = 1;
    } else {
      std::fprintf(f, "{\"format\": \"pipec.linkprobe/1\", \"sizes\": [");
      for (size_t k = 0; k < sizes.size(); ++k)
        std::fprintf(f, "%s%lld", k ? ", " : "", sizes[k]);
      std::fprintf(f, "], \"seconds\": [");
      for (size_t k = 0; k < sizes.size(); ++k)
        std::fprintf(f, "%s%.9g", k ? ", " : "", best[k]);
      std::fprintf(f, "]}\n");
      rc = std::fclose(f) == 0 ? 0 : 1;
    }
  }
  MPI_Finalize();
  return rc;
}
