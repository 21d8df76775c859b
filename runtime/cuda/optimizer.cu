//===- optimizer.cu - SGD and ONNX Momentum, Adam, Adagrad ----------------===//
//
// Part of pipec's CUDA runtime. CUDA twins of pipec_k_sgd, pipec_k_momentum,
// pipec_k_adam and pipec_k_adagrad (see include/pipec_rt.h for the parameter
// layouts, cpu/elementwise.cpp and cpu/optimizer.cpp for the reference).
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The update formulas of ai.onnx.preview.training (opset 1), computed in
/// float per element with the scalar coefficients as the CPU computes them
/// (Adam's bias-corrected rate in double, rounded to float). The learning
/// rate R (one float) and the update count T (one int64, the number of
/// updates already made) live in device memory (the arena, written by the
/// runtime on the stream), so every kernel reads them itself; nothing is
/// read back to the host.
///
/// Each element is read and written by one thread, the inputs before the
/// outputs, so every output may alias its input (Xnew == X, Vnew == V, ...).
/// Float products and sums use explicit round-to-nearest intrinsics so that
/// the compiler cannot contract them into FMAs (the CPU build has none), and
/// division and square root are the IEEE ones whatever the build flags.
///
//===----------------------------------------------------------------------===//

#include "cuda_rt.h"
#include "pipec_rt.h"

#include <cstdint>
#include <cstring>
#include <map>
#include <vector>

namespace pipec {
namespace cuda {
namespace {

#define GRID_STRIDE(i, n)                                                      \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n);    \
       i += int64_t(gridDim.x) * blockDim.x)

__device__ inline float add(float a, float b) { return __fadd_rn(a, b); }
__device__ inline float sub(float a, float b) { return __fsub_rn(a, b); }
__device__ inline float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ inline float div(float a, float b) { return __fdiv_rn(a, b); }

// Each update is a function of one element, shared by the one-tensor
// kernels and the multi-tensor ones (multi_tensor.cu's layout below).

/// Wout = W - lr * G.
__device__ inline void sgdElement(float lr, const float *w, const float *g,
                                  float *wOut, int64_t i) {
  wOut[i] = sub(w[i], mul(lr, g[i]));
}

__global__ void sgdKernel(const float *w, const float *g, const float *lrPtr,
                          float *wOut, int64_t n) {
  const float lr = *lrPtr;
  GRID_STRIDE(i, n) { sgdElement(lr, w, g, wOut, i); }
}

/// G' = norm X + G; V_new = alpha V + beta' G' (beta' = T > 0 ? beta : 1);
/// X_new = X - R (G' + alpha V_new) (Nesterov) or X - R V_new.
struct MomentumCoefficients {
  float r, alpha, beta, norm;
  bool nesterov;
};

__device__ inline MomentumCoefficients
momentumCoefficients(const float *rPtr, const int64_t *tPtr, bool nesterov,
                     float alpha, float betaIn, float norm) {
  return {*rPtr, alpha, *tPtr > 0 ? betaIn : 1.0f, norm, nesterov};
}

__device__ inline void momentumElement(const MomentumCoefficients &c,
                                       const float *x, const float *g,
                                       const float *v, float *xNew, float *vNew,
                                       int64_t i) {
  const float xi = x[i];
  const float gReg = add(mul(c.norm, xi), g[i]);
  const float vi = add(mul(c.alpha, v[i]), mul(c.beta, gReg));
  const float step = c.nesterov ? add(gReg, mul(c.alpha, vi)) : vi;
  vNew[i] = vi;
  xNew[i] = sub(xi, mul(c.r, step));
}

__global__ void momentumKernel(const float *rPtr, const int64_t *tPtr,
                               const float *x, const float *g, const float *v,
                               float *xNew, float *vNew, int64_t n,
                               bool nesterov, float alpha, float betaIn,
                               float norm) {
  const MomentumCoefficients c =
      momentumCoefficients(rPtr, tPtr, nesterov, alpha, betaIn, norm);
  GRID_STRIDE(i, n) { momentumElement(c, x, g, v, xNew, vNew, i); }
}

/// G' = norm X + G; V_new = alpha V + (1 - alpha) G';
/// H_new = beta H + (1 - beta) G'^2;
/// X_new = (1 - normPost) (X - R' V_new / (sqrt(H_new) + eps)) with
/// R' = T > 0 ? R sqrt(1 - beta^T) / (1 - alpha^T) : R (in double).
struct AdamCoefficients {
  float rAdj, a, b, oneMinusA, oneMinusB, keep, norm, eps;
};

__device__ inline AdamCoefficients
adamCoefficients(const float *rPtr, const int64_t *tPtr, double alphaD,
                 double betaD, float norm, float normPost, float eps) {
  const float r = *rPtr;
  const int64_t t = *tPtr;
  AdamCoefficients c;
  c.rAdj = t > 0 ? float(double(r) * sqrt(1 - pow(betaD, double(t))) /
                         (1 - pow(alphaD, double(t))))
                 : r;
  c.a = float(alphaD);
  c.b = float(betaD);
  c.oneMinusA = sub(1.0f, c.a);
  c.oneMinusB = sub(1.0f, c.b);
  c.keep = sub(1.0f, normPost);
  c.norm = norm;
  c.eps = eps;
  return c;
}

__device__ inline void adamElement(const AdamCoefficients &c, const float *x,
                                   const float *g, const float *v,
                                   const float *h, float *xNew, float *vNew,
                                   float *hNew, int64_t i) {
  const float xi = x[i];
  const float gReg = add(mul(c.norm, xi), g[i]);
  const float vi = add(mul(c.a, v[i]), mul(c.oneMinusA, gReg));
  const float hi = add(mul(c.b, h[i]), mul(mul(c.oneMinusB, gReg), gReg));
  const float upd = sub(xi, div(mul(c.rAdj, vi), add(__fsqrt_rn(hi), c.eps)));
  vNew[i] = vi;
  hNew[i] = hi;
  xNew[i] = mul(c.keep, upd);
}

__global__ void adamKernel(const float *rPtr, const int64_t *tPtr,
                           const float *x, const float *g, const float *v,
                           const float *h, float *xNew, float *vNew,
                           float *hNew, int64_t n, double alphaD, double betaD,
                           float norm, float normPost, float eps) {
  const AdamCoefficients c =
      adamCoefficients(rPtr, tPtr, alphaD, betaD, norm, normPost, eps);
  GRID_STRIDE(i, n) { adamElement(c, x, g, v, h, xNew, vNew, hNew, i); }
}

/// G' = norm X + G; H_new = H + G'^2;
/// X_new = X - r G' / (sqrt(H_new) + eps), r = R / (1 + T decay).
__device__ inline float adagradRate(const float *rPtr, const int64_t *tPtr,
                                    float decay) {
  return div(*rPtr, add(1.0f, mul(float(*tPtr), decay)));
}

__device__ inline void adagradElement(float rt, float eps, float norm,
                                      const float *x, const float *g,
                                      const float *h, float *xNew, float *hNew,
                                      int64_t i) {
  const float xi = x[i];
  const float gReg = add(mul(norm, xi), g[i]);
  const float hi = add(h[i], mul(gReg, gReg));
  xNew[i] = sub(xi, div(mul(rt, gReg), add(__fsqrt_rn(hi), eps)));
  hNew[i] = hi;
}

__global__ void adagradKernel(const float *rPtr, const int64_t *tPtr,
                              const float *x, const float *g, const float *h,
                              float *xNew, float *hNew, int64_t n, float decay,
                              float eps, float norm) {
  const float rt = adagradRate(rPtr, tPtr, decay);
  GRID_STRIDE(i, n) { adagradElement(rt, eps, norm, x, g, h, xNew, hNew, i); }
}

#undef GRID_STRIDE

} // namespace
} // namespace cuda
} // namespace pipec

using namespace pipec::cuda;

extern "C" void pipec_cuda_k_sgd(pipec_kctx *kc, void *const *bufs,
                                 const int64_t *ints, const double *) {
  Context &ctx = context(kc, "pipec_cuda_k_sgd");
  const int64_t n = ints[0];
  if (n <= 0)
    return;
  sgdKernel<<<gridFor(n), 256, 0, ctx.stream>>>(
      static_cast<const float *>(bufs[0]), static_cast<const float *>(bufs[1]),
      static_cast<const float *>(bufs[2]), static_cast<float *>(bufs[3]), n);
  checkLaunch("pipec_cuda_k_sgd");
}

extern "C" void pipec_cuda_k_momentum(pipec_kctx *kc, void *const *bufs,
                                      const int64_t *ints,
                                      const double *reals) {
  Context &ctx = context(kc, "pipec_cuda_k_momentum");
  const int64_t n = ints[0];
  if (n <= 0)
    return;
  momentumKernel<<<gridFor(n), 256, 0, ctx.stream>>>(
      static_cast<const float *>(bufs[0]),
      static_cast<const int64_t *>(bufs[1]),
      static_cast<const float *>(bufs[2]), static_cast<const float *>(bufs[3]),
      static_cast<const float *>(bufs[4]), static_cast<float *>(bufs[5]),
      static_cast<float *>(bufs[6]), n, ints[1] != 0, float(reals[0]),
      float(reals[1]), float(reals[2]));
  checkLaunch("pipec_cuda_k_momentum");
}

extern "C" void pipec_cuda_k_adam(pipec_kctx *kc, void *const *bufs,
                                  const int64_t *ints, const double *reals) {
  Context &ctx = context(kc, "pipec_cuda_k_adam");
  const int64_t n = ints[0];
  if (n <= 0)
    return;
  adamKernel<<<gridFor(n), 256, 0, ctx.stream>>>(
      static_cast<const float *>(bufs[0]),
      static_cast<const int64_t *>(bufs[1]),
      static_cast<const float *>(bufs[2]), static_cast<const float *>(bufs[3]),
      static_cast<const float *>(bufs[4]), static_cast<const float *>(bufs[5]),
      static_cast<float *>(bufs[6]), static_cast<float *>(bufs[7]),
      static_cast<float *>(bufs[8]), n, reals[0], reals[1], float(reals[2]),
      float(reals[3]), float(reals[4]));
  checkLaunch("pipec_cuda_k_adam");
}

extern "C" void pipec_cuda_k_adagrad(pipec_kctx *kc, void *const *bufs,
                                     const int64_t *ints, const double *reals) {
  Context &ctx = context(kc, "pipec_cuda_k_adagrad");
  const int64_t n = ints[0];
  if (n <= 0)
    return;
  adagradKernel<<<gridFor(n), 256, 0, ctx.stream>>>(
      static_cast<const float *>(bufs[0]),
      static_cast<const int64_t *>(bufs[1]),
      static_cast<const float *>(bufs[2]), static_cast<const float *>(bufs[3]),
      static_cast<const float *>(bufs[4]), static_cast<float *>(bufs[5]),
      static_cast<float *>(bufs[6]), n, float(reals[0]), float(reals[1]),
      float(reals[2]));
  checkLaunch("pipec_cuda_k_adagrad");
}

//===----------------------------------------------------------------------===//
// Multi-tensor kernels (include/pipec_multi_tensor.def): one launch updates
// every tensor of a call. Each block takes chunks of kMultiChunk elements
// of one tensor from a table in device memory (the tensors' buffers, their
// lengths, the chunks), built and uploaded on a call site's first call and
// kept while the call's buffers are the same (the arena's are). Every
// element is computed by the one-tensor kernels' own function, so a
// tensor's result is theirs bit for bit.
//===----------------------------------------------------------------------===//

namespace pipec {
namespace cuda {
namespace {

constexpr int64_t kMultiChunk = int64_t(1) << 16;

struct MultiTable {
  void *allocation = nullptr;
  void *const *ptrs = nullptr;     ///< K x bufs-per-tensor device pointers
  const int64_t *ns = nullptr;     ///< K lengths
  const int64_t *chunks = nullptr; ///< (tensor, first element) pairs
  int64_t numChunks = 0;
};
using MultiTables = std::map<std::vector<uint64_t>, MultiTable>;

MultiTables &tablesOf(Context &c) {
  if (!c.multiTensorTables)
    c.multiTensorTables = new MultiTables();
  return *static_cast<MultiTables *>(c.multiTensorTables);
}

void freeTables(Context &c) {
  if (!c.multiTensorTables)
    return;
  if (c.stream)
    cudaStreamSynchronize(c.stream); // no queued kernel reads them any more
  for (auto &entry : tablesOf(c))
    cudaFree(entry.second.allocation);
  if (!tablesOf(c).empty())
    ++c.buffersMoved;
  tablesOf(c).clear();
}

/// The table of the call (bufs, ints), uploaded on its first call; null
/// when it updates no element. Checks the lengths and the shared buffers.
const MultiTable *multiTable(Context &ctx, int bufsPer, int intsPer,
                             unsigned shared, void *const *bufs,
                             const int64_t *ints, const char *what) {
  const int64_t k = ints[0];
  if (k < 0)
    fail(what);
  std::vector<uint64_t> key;
  key.reserve(size_t(1 + k * (bufsPer + 1)));
  key.push_back(uint64_t(bufsPer));
  int64_t total = 0;
  for (int64_t t = 0; t < k; ++t) {
    const int64_t n = ints[1 + t * intsPer];
    if (n < 0)
      fail(what);
    total += n;
    key.push_back(uint64_t(n));
    for (int b = 0; b < bufsPer; ++b) {
      void *p = bufs[t * bufsPer + b];
      if ((shared >> b) & 1u ? p != bufs[b] : (n > 0 && !p))
        fail(what); // a shared buffer that differs, or a null tensor
      key.push_back(uint64_t(reinterpret_cast<uintptr_t>(p)));
    }
  }
  if (total == 0)
    return nullptr;
  MultiTables &tables = tablesOf(ctx);
  auto it = tables.find(key);
  if (it != tables.end())
    return &it->second;
  if (tables.size() >= 256) // call sites whose buffers keep changing
    freeTables(ctx);
  std::vector<int64_t> chunks;
  for (int64_t t = 0; t < k; ++t)
    for (int64_t start = 0; start < ints[1 + t * intsPer];
         start += kMultiChunk) {
      chunks.push_back(t);
      chunks.push_back(start);
    }
  const size_t ptrBytes = size_t(k * bufsPer) * sizeof(void *),
               nBytes = size_t(k) * sizeof(int64_t),
               chunkBytes = chunks.size() * sizeof(int64_t);
  std::vector<char> host(ptrBytes + nBytes + chunkBytes);
  std::memcpy(host.data(), bufs, ptrBytes);
  for (int64_t t = 0; t < k; ++t)
    std::memcpy(host.data() + ptrBytes + size_t(t) * sizeof(int64_t),
                &ints[1 + t * intsPer], sizeof(int64_t));
  std::memcpy(host.data() + ptrBytes + nBytes, chunks.data(), chunkBytes);
  MultiTable table;
  check(cudaMalloc(&table.allocation, host.size()), what);
  // On the kernels' stream, so that the launch after it reads the table
  // (a plain cudaMemcpy from pageable memory may return before the bytes
  // land, and the legacy stream does not order a non-blocking one).
  check(cudaMemcpyAsync(table.allocation, host.data(), host.size(),
                        cudaMemcpyHostToDevice, ctx.stream),
        what);
  char *base = static_cast<char *>(table.allocation);
  table.ptrs = reinterpret_cast<void *const *>(base);
  table.ns = reinterpret_cast<const int64_t *>(base + ptrBytes);
  table.chunks = reinterpret_cast<const int64_t *>(base + ptrBytes + nBytes);
  table.numChunks = int64_t(chunks.size() / 2);
  return &tables.emplace(std::move(key), table).first->second;
}

template <int Bufs, typename Update>
__global__ void multiKernel(void *const *ptrs, const int64_t *ns,
                            const int64_t *chunks, int64_t numChunks,
                            Update u) {
  const auto coefficients = u.prepare();
  for (int64_t ch = blockIdx.x; ch < numChunks; ch += gridDim.x) {
    const int64_t t = chunks[2 * ch], start = chunks[2 * ch + 1];
    const int64_t end =
        start + kMultiChunk < ns[t] ? start + kMultiChunk : ns[t];
    void *const *p = ptrs + t * Bufs;
    for (int64_t i = start + threadIdx.x; i < end; i += blockDim.x)
      u.apply(coefficients, p, i);
  }
}

/// Each kernel's layout, from its line of pipec_multi_tensor.def.
#define PIPEC_MULTI_TENSOR(name, bufs, ints, firstOutput, shared)              \
  struct name##Layout {                                                        \
    static constexpr int kBufs = bufs, kInts = ints,                           \
                         kFirstOutput = firstOutput;                           \
    static constexpr unsigned kShared = shared;                                \
  };
#include "pipec_multi_tensor.def"

template <typename Layout, typename Update>
void launchMulti(Context &ctx, void *const *bufs, const int64_t *ints,
                 const Update &u, const char *what) {
  const MultiTable *table = multiTable(ctx, Layout::kBufs, Layout::kInts,
                                       Layout::kShared, bufs, ints, what);
  if (!table)
    return;
  const unsigned grid =
      unsigned(table->numChunks < 65535 ? table->numChunks : 65535);
  multiKernel<Layout::kBufs><<<grid, 256, 0, ctx.stream>>>(
      table->ptrs, table->ns, table->chunks, table->numChunks, u);
  checkLaunch(what);
}

inline __device__ float *out(void *const *p, int b) {
  return static_cast<float *>(p[b]);
}

struct FillUpdate {
  float value;
  __device__ int prepare() const { return 0; }
  __device__ void apply(int, void *const *p, int64_t i) const {
    out(p, 0)[i] = value;
  }
};

struct SgdUpdate {
  const float *lr;
  __device__ float prepare() const { return *lr; }
  __device__ void apply(float rate, void *const *p, int64_t i) const {
    sgdElement(rate, static_cast<const float *>(p[0]),
               static_cast<const float *>(p[1]), out(p, 3), i);
  }
};

struct MomentumUpdate {
  const float *r;
  const int64_t *t;
  bool nesterov;
  float alpha, beta, norm;
  __device__ MomentumCoefficients prepare() const {
    return momentumCoefficients(r, t, nesterov, alpha, beta, norm);
  }
  __device__ void apply(const MomentumCoefficients &c, void *const *p,
                        int64_t i) const {
    momentumElement(c, static_cast<const float *>(p[2]),
                    static_cast<const float *>(p[3]),
                    static_cast<const float *>(p[4]), out(p, 5), out(p, 6), i);
  }
};

struct AdamUpdate {
  const float *r;
  const int64_t *t;
  double alpha, beta;
  float norm, normPost, eps;
  __device__ AdamCoefficients prepare() const {
    return adamCoefficients(r, t, alpha, beta, norm, normPost, eps);
  }
  __device__ void apply(const AdamCoefficients &c, void *const *p,
                        int64_t i) const {
    adamElement(
        c, static_cast<const float *>(p[2]), static_cast<const float *>(p[3]),
        static_cast<const float *>(p[4]), static_cast<const float *>(p[5]),
        out(p, 6), out(p, 7), out(p, 8), i);
  }
};

struct AdagradUpdate {
  const float *r;
  const int64_t *t;
  float decay, eps, norm;
  __device__ float prepare() const { return adagradRate(r, t, decay); }
  __device__ void apply(float rt, void *const *p, int64_t i) const {
    adagradElement(rt, eps, norm, static_cast<const float *>(p[2]),
                   static_cast<const float *>(p[3]),
                   static_cast<const float *>(p[4]), out(p, 5), out(p, 6), i);
  }
};

// The functors' buffer indices are the .def's layouts.
static_assert(fillLayout::kFirstOutput == 0 && fillLayout::kBufs == 1, "");
static_assert(sgdLayout::kFirstOutput == 3 && sgdLayout::kShared == 0x4, "");
static_assert(momentumLayout::kFirstOutput == 5 && momentumLayout::kBufs == 7,
              "");
static_assert(adamLayout::kFirstOutput == 6 && adamLayout::kBufs == 9, "");
static_assert(adagradLayout::kFirstOutput == 5 && adagradLayout::kBufs == 7,
              "");

} // namespace

void releaseMultiTensorTables(Context &c) {
  freeTables(c);
  delete static_cast<MultiTables *>(c.multiTensorTables);
  c.multiTensorTables = nullptr;
}

} // namespace cuda
} // namespace pipec

extern "C" void pipec_cuda_k_fill_multi(pipec_kctx *kc, void *const *bufs,
                                        const int64_t *ints,
                                        const double *reals) {
  const char *what = "pipec_cuda_k_fill_multi";
  Context &ctx = context(kc, what);
  launchMulti<fillLayout>(ctx, bufs, ints,
                          FillUpdate{reals ? float(reals[0]) : 0.0f}, what);
}

extern "C" void pipec_cuda_k_sgd_multi(pipec_kctx *kc, void *const *bufs,
                                       const int64_t *ints, const double *) {
  const char *what = "pipec_cuda_k_sgd_multi";
  Context &ctx = context(kc, what);
  if (ints[0] > 0)
    launchMulti<sgdLayout>(
        ctx, bufs, ints, SgdUpdate{static_cast<const float *>(bufs[2])}, what);
}

extern "C" void pipec_cuda_k_momentum_multi(pipec_kctx *kc, void *const *bufs,
                                            const int64_t *ints,
                                            const double *reals) {
  const char *what = "pipec_cuda_k_momentum_multi";
  Context &ctx = context(kc, what);
  for (int64_t t = 1; t < ints[0]; ++t)
    if (ints[2 + 2 * t] != ints[2]) // one Nesterov flag per call
      fail("pipec_cuda_k_momentum_multi: tensors differ in nesterov");
  if (ints[0] > 0)
    launchMulti<momentumLayout>(
        ctx, bufs, ints,
        MomentumUpdate{static_cast<const float *>(bufs[0]),
                       static_cast<const int64_t *>(bufs[1]), ints[2] != 0,
                       float(reals[0]), float(reals[1]), float(reals[2])},
        what);
}

extern "C" void pipec_cuda_k_adam_multi(pipec_kctx *kc, void *const *bufs,
                                        const int64_t *ints,
                                        const double *reals) {
  const char *what = "pipec_cuda_k_adam_multi";
  Context &ctx = context(kc, what);
  if (ints[0] > 0)
    launchMulti<adamLayout>(ctx, bufs, ints,
                            AdamUpdate{static_cast<const float *>(bufs[0]),
                                       static_cast<const int64_t *>(bufs[1]),
                                       reals[0], reals[1], float(reals[2]),
                                       float(reals[3]), float(reals[4])},
                            what);
}

extern "C" void pipec_cuda_k_adagrad_multi(pipec_kctx *kc, void *const *bufs,
                                           const int64_t *ints,
                                           const double *reals) {
  const char *what = "pipec_cuda_k_adagrad_multi";
  Context &ctx = context(kc, what);
  if (ints[0] > 0)
    launchMulti<adagradLayout>(
        ctx, bufs, ints,
        AdagradUpdate{static_cast<const float *>(bufs[0]),
                      static_cast<const int64_t *>(bufs[1]), float(reals[0]),
                      float(reals[1]), float(reals[2])},
        what);
}
