//===- movement.cu - Broadcast, strided copy, transpose, reduce, gather ---===//
//
// Part of pipec's CUDA runtime. CUDA twins of pipec_k_broadcast,
// pipec_k_strided_copy, pipec_k_transpose, pipec_k_reduce_sum,
// pipec_k_gather and pipec_k_gather_grad (see include/pipec_rt.h for the
// parameter layouts and cpu/movement.cpp, cpu/transpose.cpp and
// cpu/reduce.cpp for the references).
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Index spaces are canonicalised as on the CPU (strided.cuh). Every kernel
/// is deterministic: no atomics, and every sum adds its terms in the CPU
/// kernel's order, so results agree with the CPU to the bit except where
/// noted.
///
///  - broadcast, transpose: one thread per output element reading through
///    strides. A transpose that moves X's innermost dimension goes through
///    32x32 shared-memory tiles so that reads and writes are both coalesced.
///  - strided_copy: one thread per destination element. Dimensions along
///    which the destination stride is 0 (several source elements onto one
///    destination element) run inside the thread, in row-major order: the
///    last one wins a plain copy, and an accumulating copy adds them in
///    order, as the CPU loop does.
///  - reduce_sum follows cpu/reduce.cpp's accumulations exactly. [R, C]
///    onto [C] (a bias gradient) adds rows in chunks of 64 as the CPU does:
///    one thread per (chunk, column) sums its chunk, one thread per column
///    adds the chunk sums in order.
///    Where X's innermost dimension is kept, the CPU adds X rows into Y rows
///    in float, so each Y element is a float chain over the reduced indices
///    in X's memory order: one thread per Y element, or, for long chains
///    into few Y elements, blocks of 32 Y elements where eight warps stage
///    X tiles in shared memory and one warp adds them in order. Where X's
///    innermost dimension is reduced, each such row is summed in double
///    (by a thread, a warp, or for few long rows by several blocks whose
///    partial sums are added in a fixed order), rounded to float, and the
///    rows of one Y element are then added in float in order (a chain over
///    a scratch buffer). A double sum may differ from the CPU's eight-lane
///    one in the last bits of the double, which changes the float only on
///    a rounding tie. The float chains are serial by nature: a few Y
///    elements with very long chains ([262144, 64] onto [64]) take
///    milliseconds.
///  - gather_grad: dData is zeroed, then the indices are sorted stably by
///    the row they select (CUB radix sort in the context's scratch), and one
///    thread per (outer, selected row, inner) adds its dY rows in index
///    order: the CPU's summation order, without atomics.
///
/// Like the CPU kernels, broadcast and strided_copy need src and dst not to
/// overlap except exactly (same element read and written by one thread);
/// gather_grad's dData must not alias dY. A rank above 8 is an error.
///
//===----------------------------------------------------------------------===//

#include "cuda_rt.h"
#include "pipec_rt.h"
#include "strided.cuh"

#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <limits>
#include <string>

namespace pipec {
namespace cuda {
namespace {

constexpr int kBlock = 256;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

//===----------------------------------------------------------------------===//
// Broadcast and the row-copy transpose
//===----------------------------------------------------------------------===//

/// Y[i] = X[offset of i] for the contiguous Y of the nest; V is float, or
/// float4 for a nest in units of four floats (inFours).
template <typename I, typename V>
__global__ void gatherStrided(const V *__restrict__ x, V *__restrict__ y,
                              Nest<1> nest, int64_t n) {
  for (int64_t i = gridStart(); i < n; i += gridStep()) {
    int64_t off[1];
    nestOffsets(nest, I(i), off);
    y[i] = x[off[0]];
  }
}

template <typename V>
void launchGatherStridedAs(Context &ctx, const V *x, V *y,
                           const Nest<1> &nest) {
  const int64_t n = numelOf(nest);
  cudaStream_t s = ctx.stream;
  if (fits32(n))
    gatherStrided<uint32_t, V>
        <<<gridFor(n, kBlock), kBlock, 0, s>>>(x, y, nest, n);
  else
    gatherStrided<uint64_t, V>
        <<<gridFor(n, kBlock), kBlock, 0, s>>>(x, y, nest, n);
}

void launchGatherStrided(Context &ctx, const float *x, float *y,
                         const Nest<1> &nest, const char *kernel) {
  if (inFours(nest, {x, y}))
    launchGatherStridedAs(ctx, reinterpret_cast<const float4 *>(x),
                          reinterpret_cast<float4 *>(y), inUnitsOfFour(nest));
  else
    launchGatherStridedAs(ctx, x, y, nest);
  checkLaunch(kernel);
}

//===----------------------------------------------------------------------===//
// Tiled transpose
//===----------------------------------------------------------------------===//

constexpr int kTile = 32, kTileRows = 8;

/// Y[b][i * ysI + j] = X[b][i + j * xsJ] for i < ni, j < nj, one 32x32 tile
/// per block iteration; `batch` gives the Y (operand 0) and X (operand 1)
/// offsets of the remaining dimensions. Blocks are kTile x kTileRows.
__global__ void transposeTiles(const float *__restrict__ x,
                               float *__restrict__ y, Nest<2> batch, int64_t ni,
                               int64_t ysI, int64_t nj, int64_t xsJ,
                               int64_t tilesI, int64_t tilesJ, int64_t nTiles) {
  __shared__ float tile[kTile][kTile + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  for (int64_t t = blockIdx.x; t < nTiles; t += gridDim.x) {
    const int64_t tj = t % tilesJ, rest = t / tilesJ;
    const int64_t ti = rest % tilesI, b = rest / tilesI;
    int64_t off[2];
    nestOffsets(batch, uint64_t(b), off);
    const int64_t i0 = ti * kTile, j0 = tj * kTile;
    // Read along i (X's stride 1): tile[j - j0][i - i0].
    const int64_t i = i0 + tx;
    for (int k = ty; k < kTile; k += kTileRows) {
      const int64_t j = j0 + k;
      if (i < ni && j < nj)
        tile[k][tx] = x[off[1] + i + j * xsJ];
    }
    __syncthreads();
    // Write along j (Y's stride 1).
    const int64_t j = j0 + tx;
    for (int k = ty; k < kTile; k += kTileRows) {
      const int64_t ii = i0 + k;
      if (ii < ni && j < nj)
        y[off[0] + ii * ysI + j] = tile[tx][k];
    }
    __syncthreads();
  }
}

//===----------------------------------------------------------------------===//
// Strided copy
//===----------------------------------------------------------------------===//

/// One thread per element of the parallel nest (operand 0: src, 1: dst).
/// `serial` holds the dimensions along which dst does not move (src
/// strides); `lastSerial` is the src offset of its last index.
template <typename I>
__global__ void stridedCopyKernel(const float *src, float *dst, Nest<2> par,
                                  int64_t n, Nest<1> serial, int64_t nSerial,
                                  int64_t lastSerial, bool accumulate) {
  for (int64_t i = gridStart(); i < n; i += gridStep()) {
    int64_t off[2];
    nestOffsets(par, I(i), off);
    if (!accumulate) {
      dst[off[1]] = src[off[0] + lastSerial];
      continue;
    }
    float acc = dst[off[1]];
    int64_t idx[kMaxRank] = {}, so[1] = {0};
    for (int64_t r = 0; r < nSerial; ++r) {
      acc += src[off[0] + so[0]];
      nestAdvance(serial, idx, so);
    }
    dst[off[1]] = acc;
  }
}

/// dst = src over a nest without serial dimensions (operand 0: src, 1:
/// dst); V is float, or float4 for a nest in units of four floats.
template <typename I, typename V>
__global__ void copyNest(const V *src, V *dst, Nest<2> par, int64_t n) {
  for (int64_t i = gridStart(); i < n; i += gridStep()) {
    int64_t off[2];
    nestOffsets(par, I(i), off);
    dst[off[1]] = src[off[0]];
  }
}

template <typename V>
void launchCopyNest(Context &ctx, const V *src, V *dst, const Nest<2> &par) {
  const int64_t n = numelOf(par);
  cudaStream_t s = ctx.stream;
  if (fits32(n))
    copyNest<uint32_t, V>
        <<<gridFor(n, kBlock), kBlock, 0, s>>>(src, dst, par, n);
  else
    copyNest<uint64_t, V>
        <<<gridFor(n, kBlock), kBlock, 0, s>>>(src, dst, par, n);
}

//===----------------------------------------------------------------------===//
// Reduce sum
//===----------------------------------------------------------------------===//

/// The reduction of one call. `kept`: the dimensions Y keeps (operand 0: X,
/// 1: Y strides), nOut elements. The reduced index space of one Y element,
/// in X's memory order, is `outer` (X strides; nOuter indices) times the
/// run: the innermost reduced dimension (runLen elements, X stride
/// runStride).
struct Reduction {
  Nest<2> kept;
  int64_t nOut = 1;
  Nest<1> outer;
  int64_t nOuter = 1;
  int64_t runLen = 1, runStride = 0;
  float scale = 1.0f;
};

/// X offset of the reduced index q (in order) of a Y element.
__device__ __forceinline__ int64_t reducedOffset(const Reduction &red,
                                                 int64_t q) {
  if (red.nOuter == 1)
    return q * red.runStride;
  const int64_t r = q / red.runLen, k = q - r * red.runLen;
  int64_t ro[1];
  nestOffsets(red.outer, uint64_t(r), ro);
  return ro[0] + k * red.runStride;
}

/// The float chains: Y = scale * (((0 + x_0) + x_1) + ...) over the reduced
/// space in order, as the CPU adds X rows into kept Y rows.

/// One thread per Y element; the run is loaded eight elements at a time.
template <typename I>
__global__ void chainThreads(const float *__restrict__ x, float *__restrict__ y,
                             Reduction red) {
  constexpr int kUnroll = 8;
  for (int64_t o = gridStart(); o < red.nOut; o += gridStep()) {
    int64_t off[2];
    nestOffsets(red.kept, I(o), off);
    float acc = 0.0f;
    int64_t idx[kMaxRank] = {}, ro[1] = {0};
    for (int64_t r = 0; r < red.nOuter; ++r) {
      const float *p = x + off[0] + ro[0];
      for (int64_t k = 0; k < red.runLen; k += kUnroll) {
        float v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          v[u] = k + u < red.runLen ? p[(k + u) * red.runStride] : 0.0f;
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          if (k + u < red.runLen)
            acc += v[u];
      }
      nestAdvance(red.outer, idx, ro);
    }
    y[off[1]] = red.scale != 1.0f ? acc * red.scale : acc;
  }
}

/// Long chains for few Y elements: a block takes 32 Y elements (one per
/// lane). Eight loader warps stage the next kChainRows reduced indices of
/// all 32 in shared memory while warp 0 adds the previous ones in order.
constexpr int kChainRows = 128, kLoaders = 8;
constexpr int kRowsPerLoader = kChainRows / kLoaders;
constexpr int kChainThreads = 32 * (kLoaders + 1);

__device__ __forceinline__ void loadChain(const float *x, const Reduction &red,
                                          int64_t xo, bool valid, int64_t c,
                                          int64_t nRed, float (*tile)[33],
                                          int loader, int lane) {
  float v[kRowsPerLoader];
#pragma unroll
  for (int u = 0; u < kRowsPerLoader; ++u) {
    const int64_t q = c * kChainRows + loader * kRowsPerLoader + u;
    v[u] = valid && q < nRed ? x[xo + reducedOffset(red, q)] : 0.0f;
  }
#pragma unroll
  for (int u = 0; u < kRowsPerLoader; ++u)
    tile[loader * kRowsPerLoader + u][lane] = v[u];
}

__global__ void __launch_bounds__(kChainThreads)
    chainTiles(const float *__restrict__ x, float *__restrict__ y,
               Reduction red) {
  __shared__ float tile[2][kChainRows][33];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t nRed = red.nOuter * red.runLen;
  const int64_t nChunks = (nRed + kChainRows - 1) / kChainRows;
  for (int64_t g = blockIdx.x; g * 32 < red.nOut; g += gridDim.x) {
    const int64_t o = g * 32 + lane;
    const bool valid = o < red.nOut;
    int64_t off[2] = {0, 0};
    if (valid)
      nestOffsets(red.kept, uint64_t(o), off);
    if (warp > 0)
      loadChain(x, red, off[0], valid, 0, nRed, tile[0], warp - 1, lane);
    __syncthreads();
    float acc = 0.0f;
    for (int64_t c = 0; c < nChunks; ++c) {
      if (warp == 0) {
        const int64_t left = nRed - c * kChainRows;
        const int rows = left < kChainRows ? int(left) : kChainRows;
        const float(*t)[33] = tile[c & 1];
        for (int rr = 0; rr < rows; ++rr)
          acc += t[rr][lane];
      } else if (c + 1 < nChunks) {
        loadChain(x, red, off[0], valid, c + 1, nRed, tile[(c + 1) & 1],
                  warp - 1, lane);
      }
      __syncthreads();
    }
    if (warp == 0 && valid)
      y[off[1]] = red.scale != 1.0f ? acc * red.scale : acc;
  }
}

void launchChain(const float *x, float *y, const Reduction &red,
                 cudaStream_t s) {
  if (red.nOuter * red.runLen >= 64 && red.nOut < 65536)
    chainTiles<<<gridFor(red.nOut, 32), kChainThreads, 0, s>>>(x, y, red);
  else if (fits32(red.nOut))
    chainThreads<uint32_t>
        <<<gridFor(red.nOut, kBlock), kBlock, 0, s>>>(x, y, red);
  else
    chainThreads<uint64_t>
        <<<gridFor(red.nOut, kBlock), kBlock, 0, s>>>(x, y, red);
}

/// The row sums: when X's innermost dimension is reduced, each of its rows
/// (row = o * nOuter + r: Y element o, outer index r) is summed in double,
/// as the CPU's sumRow. With nOuter == 1 the row's float sum is the Y
/// element (times scale); otherwise it goes to S[r * nOut + o] and a float
/// chain over r follows.

__device__ __forceinline__ int64_t rowBase(const Reduction &red, int64_t row) {
  const int64_t o = row / red.nOuter, r = row - o * red.nOuter;
  int64_t off[2], ro[1];
  nestOffsets(red.kept, uint64_t(o), off);
  nestOffsets(red.outer, uint64_t(r), ro);
  return off[0] + ro[0];
}

__device__ __forceinline__ void storeRow(const Reduction &red, int64_t row,
                                         double sum, float *y, float *rows) {
  const float v = float(sum);
  if (red.nOuter == 1) {
    int64_t off[2];
    nestOffsets(red.kept, uint64_t(row), off);
    y[off[1]] = red.scale != 1.0f ? v * red.scale : v;
  } else {
    const int64_t o = row / red.nOuter, r = row - o * red.nOuter;
    rows[r * red.nOut + o] = v;
  }
}

/// One thread per row (short rows).
__global__ void rowSumThreads(const float *__restrict__ x, Reduction red,
                              int64_t nRows, float *y, float *rows) {
  for (int64_t row = gridStart(); row < nRows; row += gridStep()) {
    const float *p = x + rowBase(red, row);
    double s = 0.0;
    for (int64_t k = 0; k < red.runLen; ++k)
      s += double(p[k * red.runStride]);
    storeRow(red, row, s, y, rows);
  }
}

/// One warp per row (rows not split into chunks).
__global__ void rowSumWarps(const float *__restrict__ x, Reduction red,
                            int64_t nRows, float *y, float *rows) {
  const int lane = threadIdx.x & 31;
  const int64_t st = red.runStride, len = red.runLen;
  for (int64_t row = gridStart() / 32; row < nRows; row += gridStep() / 32) {
    const float *p = x + rowBase(red, row);
    double s = 0.0;
    int64_t k = lane;
    for (; k + 96 < len; k += 128) {
      const float a0 = p[k * st], a1 = p[(k + 32) * st];
      const float a2 = p[(k + 64) * st], a3 = p[(k + 96) * st];
      s += double(a0);
      s += double(a1);
      s += double(a2);
      s += double(a3);
    }
    for (; k < len; k += 32)
      s += double(p[k * st]);
#pragma unroll
    for (int m = 16; m > 0; m >>= 1)
      s += __shfl_xor_sync(0xffffffffu, s, m);
    if (lane == 0)
      storeRow(red, row, s, y, rows);
  }
}

/// Sum of `v` over the block in a fixed order; the result is in thread 0.
__device__ double blockSum(double v, double *shared) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, m);
  __syncthreads(); // `shared` may still be read from the previous round
  if ((threadIdx.x & 31) == 0)
    shared[threadIdx.x >> 5] = v;
  __syncthreads();
  double total = 0.0;
  if (threadIdx.x == 0)
    for (unsigned w = 0; w < (blockDim.x >> 5); ++w)
      total += shared[w];
  return total;
}

/// One block per chunk k of row `row` (chunks rows of chunkLen elements,
/// nChunks per row). With one chunk per row the sum is stored at once;
/// otherwise it goes to partial[row * nChunks + k] for rowSumFinish.
__global__ void rowSumBlocks(const float *__restrict__ x, Reduction red,
                             int64_t nRows, int64_t nChunks, int64_t chunkLen,
                             double *partial, float *y, float *rows) {
  __shared__ double shared[32];
  const int64_t bd = blockDim.x;
  for (int64_t b = blockIdx.x; b < nRows * nChunks; b += gridDim.x) {
    const int64_t row = b / nChunks, k = b - row * nChunks;
    const float *p = x + rowBase(red, row);
    const int64_t st = red.runStride;
    const int64_t begin = k * chunkLen;
    const int64_t end =
        begin + chunkLen < red.runLen ? begin + chunkLen : red.runLen;
    double s = 0.0;
    int64_t e = begin + threadIdx.x;
    for (; e + 3 * bd < end; e += 4 * bd) {
      const float a0 = p[e * st], a1 = p[(e + bd) * st];
      const float a2 = p[(e + 2 * bd) * st], a3 = p[(e + 3 * bd) * st];
      s += double(a0);
      s += double(a1);
      s += double(a2);
      s += double(a3);
    }
    for (; e < end; e += bd)
      s += double(p[e * st]);
    s = blockSum(s, shared);
    if (threadIdx.x == 0) {
      if (nChunks == 1)
        storeRow(red, row, s, y, rows);
      else
        partial[b] = s;
    }
  }
}

/// Adds the chunk sums of each row in order.
__global__ void rowSumFinish(Reduction red, int64_t nRows, int64_t nChunks,
                             const double *partial, float *y, float *rows) {
  for (int64_t row = gridStart(); row < nRows; row += gridStep()) {
    double s = 0.0;
    for (int64_t k = 0; k < nChunks; ++k)
      s += partial[row * nChunks + k];
    storeRow(red, row, s, y, rows);
  }
}

/// [R, C] onto [C] (cpu/reduce.cpp's chunked order): partial[k * C + j] is
/// the float sum, from 0 in row order, of column j over rows [k * kChunk,
/// (k + 1) * kChunk).
constexpr int64_t kChunkRows = 64;

__global__ void columnChunkSums(const float *__restrict__ x,
                                float *__restrict__ partial, int64_t rows,
                                int64_t cols, int64_t chunks) {
  for (int64_t t = gridStart(); t < chunks * cols; t += gridStep()) {
    const int64_t k = t / cols, j = t - k * cols;
    const int64_t end =
        (k + 1) * kChunkRows < rows ? (k + 1) * kChunkRows : rows;
    float s = 0.0f;
    for (int64_t r = k * kChunkRows; r < end; ++r)
      s = __fadd_rn(s, x[r * cols + j]);
    partial[t] = s;
  }
}

/// y[j] = the chunks' sums added from 0 in chunk order, then times `scale`
/// when it is not 1 (as the CPU scales Y at the end).
__global__ void columnChunkFinish(const float *__restrict__ partial,
                                  float *__restrict__ y, int64_t cols,
                                  int64_t chunks, float scale) {
  for (int64_t j = gridStart(); j < cols; j += gridStep()) {
    float s = 0.0f;
    for (int64_t k = 0; k < chunks; ++k)
      s = __fadd_rn(s, partial[k * cols + j]);
    y[j] = scale != 1.0f ? __fmul_rn(s, scale) : s;
  }
}

/// Elements of Y implied by X's dims and Y's strides (cpu/reduce.cpp).
int64_t impliedYCount(int64_t rank, const int64_t *xDims,
                      const int64_t *yStrides) {
  int64_t last = 0;
  for (int64_t i = 0; i < rank; ++i)
    if (yStrides[i] != 0)
      last += (xDims[i] - 1) * yStrides[i];
  return std::max<int64_t>(last + 1, 0);
}

/// Rounds a scratch sub-buffer size up to 256 bytes.
size_t aligned(size_t bytes) { return (bytes + 255) & ~size_t(255); }

//===----------------------------------------------------------------------===//
// Gather
//===----------------------------------------------------------------------===//

/// The row selected by `index` ([-axisDim, 0) wraps), or -1 out of range.
__device__ __forceinline__ int64_t wrapIndex(int64_t index, int64_t axisDim) {
  if (index < 0)
    index += axisDim;
  return (index >= 0 && index < axisDim) ? index : -1;
}

template <typename I>
__global__ void gatherKernel(const float *__restrict__ data,
                             const int64_t *__restrict__ indices,
                             float *__restrict__ y, int64_t axisDim,
                             int64_t inner, int64_t nIndices, int64_t n) {
  for (int64_t t = gridStart(); t < n; t += gridStep()) {
    const I it = I(t), in = I(inner), ni = I(nIndices);
    const I rest = it / in;
    const int64_t j = int64_t(it - rest * in);
    const I o = rest / ni;
    const int64_t i = int64_t(rest - o * ni);
    const int64_t row = wrapIndex(indices[i], axisDim);
    y[t] = row < 0 ? 0.0f : data[(int64_t(o) * axisDim + row) * inner + j];
  }
}

/// Sort keys of gather_grad: the selected row, or axisDim (sorted last,
/// ignored) for an out-of-range index; values: the index positions.
__global__ void gatherGradKeys(const int64_t *__restrict__ indices,
                               uint64_t *__restrict__ keys,
                               int32_t *__restrict__ positions, int64_t axisDim,
                               int64_t nIndices) {
  for (int64_t i = gridStart(); i < nIndices; i += gridStep()) {
    const int64_t row = wrapIndex(indices[i], axisDim);
    keys[i] = uint64_t(row < 0 ? axisDim : row);
    positions[i] = int32_t(i);
  }
}

/// One thread per (o, s, j) where s is the first sorted position of a run
/// of equal keys: dData[o, key, j] = sum of dY[o, position, j] over the run,
/// in position order. Other threads have nothing to do.
template <typename I>
__global__ void
gatherGradSums(const float *__restrict__ dy, const uint64_t *__restrict__ keys,
               const int32_t *__restrict__ positions, float *__restrict__ dData,
               int64_t axisDim, int64_t inner, int64_t nIndices, int64_t n) {
  for (int64_t t = gridStart(); t < n; t += gridStep()) {
    const I it = I(t), in = I(inner), ni = I(nIndices);
    const I rest = it / in;
    const int64_t j = int64_t(it - rest * in);
    const I o = rest / ni;
    const int64_t s = int64_t(rest - o * ni);
    const uint64_t key = keys[s];
    if (key >= uint64_t(axisDim) || (s > 0 && keys[s - 1] == key))
      continue;
    const float *dyPlane = dy + int64_t(o) * nIndices * inner + j;
    float acc = 0.0f;
    for (int64_t u = s; u < nIndices && keys[u] == key; ++u)
      acc += dyPlane[int64_t(positions[u]) * inner];
    dData[(int64_t(o) * axisDim + int64_t(key)) * inner + j] = acc;
  }
}

} // namespace

void gatherDense(Context &ctx, const float *x, float *y, int rank,
                 const int64_t *dims, const int64_t *strides,
                 const char *kernel) {
  checkRank(rank, kernel);
  const int64_t *const nestStrides[1] = {strides};
  Nest<1> nest;
  if (buildNest(rank, dims, nestStrides, nest))
    launchGatherStrided(ctx, x, y, nest, kernel);
}

void scatterDense(Context &ctx, const float *x, float *y, int rank,
                  const int64_t *dims, const int64_t *strides,
                  const char *kernel) {
  checkRank(rank, kernel);
  int64_t dense[kMaxRank];
  for (int64_t d = rank - 1, step = 1; d >= 0; --d) {
    dense[d] = step;
    step *= dims[d];
  }
  const int64_t *const nestStrides[2] = {dense, strides};
  Nest<2> nest;
  if (!buildNest(rank, dims, nestStrides, nest))
    return;
  if (inFours(nest, {x, y}))
    launchCopyNest(ctx, reinterpret_cast<const float4 *>(x),
                   reinterpret_cast<float4 *>(y), inUnitsOfFour(nest));
  else
    launchCopyNest(ctx, x, y, nest);
  checkLaunch(kernel);
}

} // namespace cuda
} // namespace pipec

using namespace pipec::cuda;

//===----------------------------------------------------------------------===//
// Entry points
//===----------------------------------------------------------------------===//

extern "C" void pipec_cuda_k_broadcast(pipec_kctx *kc, void *const *bufs,
                                       const int64_t *ints, const double *) {
  Context &ctx = context(kc, "pipec_cuda_k_broadcast");
  const float *x = static_cast<const float *>(bufs[0]);
  float *y = static_cast<float *>(bufs[1]);
  const int64_t rank = ints[0];
  checkRank(rank, "pipec_cuda_k_broadcast");
  const int64_t *yDims = ints + 1;
  const int64_t *const strides[1] = {ints + 1 + rank};
  Nest<1> nest;
  if (!buildNest(rank, yDims, strides, nest))
    return;
  launchGatherStrided(ctx, x, y, nest, "pipec_cuda_k_broadcast");
}

extern "C" void pipec_cuda_k_strided_copy(pipec_kctx *kc, void *const *bufs,
                                          const int64_t *ints, const double *) {
  Context &ctx = context(kc, "pipec_cuda_k_strided_copy");
  const char *kernel = "pipec_cuda_k_strided_copy";
  const int64_t rank = ints[0];
  checkRank(rank, kernel);
  const int64_t *dims = ints + 1;
  const int64_t *srcStrides = ints + 1 + rank;
  const int64_t srcOffset = ints[1 + 2 * rank];
  const int64_t *dstStrides = ints + 2 + 2 * rank;
  const int64_t dstOffset = ints[2 + 3 * rank];
  const bool accumulate = ints[3 + 3 * rank] != 0;
  Nest<2> nest;
  const int64_t *const strides[2] = {srcStrides, dstStrides};
  if (!buildNest(rank, dims, strides, nest))
    return;
  // Split off the dimensions along which dst does not move.
  Nest<2> par;
  Nest<1> serial;
  int64_t nSerial = 1, lastSerial = 0;
  for (int d = 0; d < nest.rank; ++d) {
    if (nest.strides[1][d] != 0) {
      par.dims[par.rank] = nest.dims[d];
      par.strides[0][par.rank] = nest.strides[0][d];
      par.strides[1][par.rank] = nest.strides[1][d];
      ++par.rank;
    } else {
      serial.dims[serial.rank] = nest.dims[d];
      serial.strides[0][serial.rank] = nest.strides[0][d];
      ++serial.rank;
      nSerial *= nest.dims[d];
      lastSerial += (nest.dims[d] - 1) * nest.strides[0][d];
    }
  }
  const float *src = static_cast<const float *>(bufs[0]) + srcOffset;
  float *dst = static_cast<float *>(bufs[1]) + dstOffset;
  // A plain copy (every element of dst written once, from one src element:
  // slices, pads, concatenations) four floats at a time where it can.
  // (An exactly in-place copy reads and writes the same four floats in one
  // thread, as one at a time.)
  if (!accumulate && serial.rank == 0 && inFours(par, {src, dst})) {
    launchCopyNest(ctx, reinterpret_cast<const float4 *>(src),
                   reinterpret_cast<float4 *>(dst), inUnitsOfFour(par));
    checkLaunch(kernel);
    return;
  }
  const int64_t n = numelOf(par);
  cudaStream_t s = ctx.stream;
  if (fits32(n))
    stridedCopyKernel<uint32_t><<<gridFor(n, kBlock), kBlock, 0, s>>>(
        src, dst, par, n, serial, nSerial, lastSerial, accumulate);
  else
    stridedCopyKernel<uint64_t><<<gridFor(n, kBlock), kBlock, 0, s>>>(
        src, dst, par, n, serial, nSerial, lastSerial, accumulate);
  checkLaunch(kernel);
}

extern "C" void pipec_cuda_k_transpose(pipec_kctx *kc, void *const *bufs,
                                       const int64_t *ints, const double *) {
  Context &ctx = context(kc, "pipec_cuda_k_transpose");
  const char *kernel = "pipec_cuda_k_transpose";
  const float *x = static_cast<const float *>(bufs[0]);
  float *y = static_cast<float *>(bufs[1]);
  const int64_t rank = ints[0];
  checkRank(rank, kernel);
  const int64_t *xDims = ints + 1;
  const int64_t *perm = ints + 1 + rank;
  int64_t numel = 1;
  for (int64_t i = 0; i < rank; ++i)
    numel *= std::max<int64_t>(xDims[i], 0);
  if (numel == 0)
    return;
  int64_t xStrides[kMaxRank], yDims[kMaxRank], xStridesInY[kMaxRank];
  bool seen[kMaxRank] = {};
  int64_t stride = 1;
  for (int64_t i = rank - 1; i >= 0; --i) {
    xStrides[i] = stride;
    stride *= xDims[i];
  }
  for (int64_t i = 0; i < rank; ++i) {
    const int64_t p = perm[i];
    if (p < 0 || p >= rank || seen[p]) { // Not a permutation (as the CPU).
      launchFill(ctx, y, numel, kNaN, kernel);
      return;
    }
    seen[p] = true;
    yDims[i] = xDims[p];
    xStridesInY[i] = xStrides[p];
  }
  Nest<1> nest;
  const int64_t *const strides[1] = {xStridesInY};
  buildNest(rank, yDims, strides, nest);
  const int r = nest.rank;
  if (r == 0 || nest.strides[0][r - 1] == 1) {
    // X's innermost dimension stays innermost: reads are coalesced.
    launchGatherStrided(ctx, x, y, nest, kernel);
    return;
  }
  // Dimension p has X stride 1; tile the (p, r - 1) plane, the other
  // dimensions are the batch.
  int64_t yStrides[kMaxRank];
  stride = 1;
  for (int d = r - 1; d >= 0; --d) {
    yStrides[d] = stride;
    stride *= nest.dims[d];
  }
  int p = 0;
  while (p < r && nest.strides[0][p] != 1)
    ++p;
  if (p >= r - 1) // Cannot happen for a permutation of a dense X.
    fail("pipec_cuda_k_transpose: no unit-stride dimension");
  Nest<2> batch; // Operand 0: Y, operand 1: X.
  int64_t nBatch = 1;
  for (int d = 0; d < r - 1; ++d) {
    if (d == p)
      continue;
    batch.dims[batch.rank] = nest.dims[d];
    batch.strides[0][batch.rank] = yStrides[d];
    batch.strides[1][batch.rank] = nest.strides[0][d];
    ++batch.rank;
    nBatch *= nest.dims[d];
  }
  const int64_t ni = nest.dims[p], nj = nest.dims[r - 1];
  const int64_t tilesI = (ni + kTile - 1) / kTile;
  const int64_t tilesJ = (nj + kTile - 1) / kTile;
  const int64_t nTiles = nBatch * tilesI * tilesJ;
  transposeTiles<<<gridFor(nTiles, 1), dim3(kTile, kTileRows), 0, ctx.stream>>>(
      x, y, batch, ni, yStrides[p], nj, nest.strides[0][r - 1], tilesI, tilesJ,
      nTiles);
  checkLaunch(kernel);
}

extern "C" void pipec_cuda_k_reduce_sum(pipec_kctx *kc, void *const *bufs,
                                        const int64_t *ints,
                                        const double *reals) {
  Context &ctx = context(kc, "pipec_cuda_k_reduce_sum");
  const char *kernel = "pipec_cuda_k_reduce_sum";
  const float *x = static_cast<const float *>(bufs[0]);
  float *y = static_cast<float *>(bufs[1]);
  const int64_t rank = ints[0];
  checkRank(rank, kernel);
  const int64_t *xDims = ints + 1;
  const int64_t *yStrides = ints + 1 + rank;
  cudaStream_t s = ctx.stream;

  const int64_t yCount = impliedYCount(rank, xDims, yStrides);
  int64_t xStrides[kMaxRank];
  int64_t stride = 1;
  for (int64_t i = rank - 1; i >= 0; --i) {
    xStrides[i] = stride;
    stride *= xDims[i];
  }
  Nest<2> nest; // Operand 0: X, operand 1: Y.
  const int64_t *const strides[2] = {xStrides, yStrides};
  if (!buildNest(rank, xDims, strides, nest)) {
    // Empty X: Y is all zeros.
    if (yCount > 0)
      check(cudaMemsetAsync(y, 0, size_t(yCount) * sizeof(float), s), kernel);
    return;
  }

  const float scale = reals ? float(reals[0]) : 1.0f;
  if (nest.rank == 2 && nest.strides[0][0] == nest.dims[1] &&
      nest.strides[0][1] == 1 && nest.strides[1][0] == 0 &&
      nest.strides[1][1] == 1) {
    // [R, C] onto [C]: the CPU's chunked order, one thread per (chunk,
    // column), then one per column over the chunks.
    const int64_t rows = nest.dims[0], cols = nest.dims[1];
    const int64_t chunks = (rows + kChunkRows - 1) / kChunkRows;
    float *partial = static_cast<float *>(
        scratch(ctx, size_t(chunks * cols) * sizeof(float)));
    columnChunkSums<<<gridFor(chunks * cols, kBlock), kBlock, 0, s>>>(
        x, partial, rows, cols, chunks);
    columnChunkFinish<<<gridFor(cols, kBlock), kBlock, 0, s>>>(partial, y, cols,
                                                               chunks, scale);
    checkLaunch(kernel);
    return;
  }

  Reduction red;
  red.scale = scale;
  const int r = nest.rank;
  // X's innermost dimension reduced (or no dimension at all): row sums in
  // double, as the CPU's ys == 0 rows.
  const bool rowSum = r == 0 || nest.strides[1][r - 1] == 0;
  int runDim = -1; // The canonical dimension of the run, if any.
  if (rowSum) {
    runDim = r - 1;
  } else {
    for (int d = r - 1; d >= 0 && runDim < 0; --d)
      if (nest.strides[1][d] == 0)
        runDim = d;
  }
  if (runDim >= 0) {
    red.runLen = nest.dims[runDim];
    red.runStride = nest.strides[0][runDim];
  }
  for (int d = 0; d < r; ++d) {
    if (d == runDim)
      continue;
    if (nest.strides[1][d] != 0) {
      Nest<2> &k = red.kept;
      k.dims[k.rank] = nest.dims[d];
      k.strides[0][k.rank] = nest.strides[0][d];
      k.strides[1][k.rank] = nest.strides[1][d];
      ++k.rank;
      red.nOut *= nest.dims[d];
    } else {
      Nest<1> &q = red.outer;
      q.dims[q.rank] = nest.dims[d];
      q.strides[0][q.rank] = nest.strides[0][d];
      ++q.rank;
      red.nOuter *= nest.dims[d];
    }
  }
  // Y elements that no X element reaches stay zero (only for Y strides
  // that do not describe a dense Y).
  if (red.nOut != yCount)
    check(cudaMemsetAsync(y, 0, size_t(yCount) * sizeof(float), s), kernel);

  if (!rowSum) {
    launchChain(x, y, red, s);
    checkLaunch(kernel);
    return;
  }
  // Row sums, into Y or (several rows per Y element) into a float buffer
  // that a chain then adds up in order.
  const int64_t nRows = red.nOut * red.nOuter, len = red.runLen;
  int64_t nChunks = 1, chunkLen = len;
  if (len >= 32 && nRows < 1024) {
    // Few rows: split long ones so that about 1024 blocks share the work.
    nChunks = std::min((1024 + nRows - 1) / nRows, (len + 2047) / 2048);
    nChunks = std::max<int64_t>(nChunks, 1);
    chunkLen = (len + nChunks - 1) / nChunks;
    nChunks = (len + chunkLen - 1) / chunkLen;
  }
  const size_t partialBytes =
      nChunks > 1 ? aligned(size_t(nRows * nChunks) * sizeof(double)) : 0;
  const size_t rowBytes =
      red.nOuter > 1 ? aligned(size_t(nRows) * sizeof(float)) : 0;
  char *work = partialBytes + rowBytes
                   ? static_cast<char *>(scratch(ctx, partialBytes + rowBytes))
                   : nullptr;
  double *partial = reinterpret_cast<double *>(work);
  float *rows = reinterpret_cast<float *>(work + partialBytes);
  if (len < 32) {
    rowSumThreads<<<gridFor(nRows, kBlock), kBlock, 0, s>>>(x, red, nRows, y,
                                                            rows);
  } else if (nChunks == 1) {
    rowSumWarps<<<gridFor(nRows * 32, kBlock), kBlock, 0, s>>>(x, red, nRows, y,
                                                               rows);
  } else {
    int threads = 32;
    while (threads < 256 && threads * 4 < chunkLen)
      threads *= 2;
    rowSumBlocks<<<gridFor(nRows * nChunks, 1), threads, 0, s>>>(
        x, red, nRows, nChunks, chunkLen, partial, y, rows);
    if (nChunks > 1) {
      checkLaunch(kernel);
      rowSumFinish<<<gridFor(nRows, kBlock), kBlock, 0, s>>>(
          red, nRows, nChunks, partial, y, rows);
    }
  }
  checkLaunch(kernel);
  if (red.nOuter == 1)
    return;
  // Y = scale * float chain over the outer rows: S is [nOuter, nOut].
  Reduction chain;
  chain.kept = red.kept;
  int64_t linear = 1;
  for (int d = chain.kept.rank - 1; d >= 0; --d) {
    chain.kept.strides[0][d] = linear;
    linear *= chain.kept.dims[d];
  }
  chain.nOut = red.nOut;
  chain.runLen = red.nOuter;
  chain.runStride = red.nOut;
  chain.scale = red.scale;
  launchChain(rows, y, chain, s);
  checkLaunch(kernel);
}

extern "C" void pipec_cuda_k_gather(pipec_kctx *kc, void *const *bufs,
                                    const int64_t *ints, const double *) {
  Context &ctx = context(kc, "pipec_cuda_k_gather");
  const int64_t outer = ints[0], axisDim = ints[1], inner = ints[2],
                nIndices = ints[3];
  if (outer <= 0 || inner <= 0 || nIndices <= 0)
    return;
  const int64_t n = outer * nIndices * inner;
  const float *data = static_cast<const float *>(bufs[0]);
  const int64_t *indices = static_cast<const int64_t *>(bufs[1]);
  float *y = static_cast<float *>(bufs[2]);
  cudaStream_t s = ctx.stream;
  if (fits32(n))
    gatherKernel<uint32_t><<<gridFor(n, kBlock), kBlock, 0, s>>>(
        data, indices, y, axisDim, inner, nIndices, n);
  else
    gatherKernel<uint64_t><<<gridFor(n, kBlock), kBlock, 0, s>>>(
        data, indices, y, axisDim, inner, nIndices, n);
  checkLaunch("pipec_cuda_k_gather");
}

extern "C" void pipec_cuda_k_gather_grad(pipec_kctx *kc, void *const *bufs,
                                         const int64_t *ints, const double *) {
  Context &ctx = context(kc, "pipec_cuda_k_gather_grad");
  const char *kernel = "pipec_cuda_k_gather_grad";
  const int64_t outer = ints[0], axisDim = ints[1], inner = ints[2],
                nIndices = ints[3];
  if (outer <= 0 || axisDim <= 0 || inner <= 0)
    return;
  const float *dy = static_cast<const float *>(bufs[0]);
  const int64_t *indices = static_cast<const int64_t *>(bufs[1]);
  float *dData = static_cast<float *>(bufs[2]);
  cudaStream_t s = ctx.stream;
  check(cudaMemsetAsync(dData, 0,
                        size_t(outer * axisDim * inner) * sizeof(float), s),
        kernel);
  if (nIndices <= 0)
    return;
  if (nIndices > INT_MAX)
    fail((std::string(kernel) + ": " + std::to_string(nIndices) +
          " indices exceed the sort's 32-bit count")
             .c_str());
  const int count = int(nIndices);

  // Keys need the bits of axisDim (the out-of-range key) and no more.
  int endBit = 1;
  while (endBit < 64 && (uint64_t(axisDim) >> endBit) != 0)
    ++endBit;
  size_t sortBytes = 0;
  check(cub::DeviceRadixSort::SortPairs(
            nullptr, sortBytes, static_cast<const uint64_t *>(nullptr),
            static_cast<uint64_t *>(nullptr),
            static_cast<const int32_t *>(nullptr),
            static_cast<int32_t *>(nullptr), count, 0, endBit, s),
        kernel);
  const size_t keyBytes = aligned(size_t(count) * sizeof(uint64_t));
  const size_t posBytes = aligned(size_t(count) * sizeof(int32_t));
  char *base = static_cast<char *>(
      scratch(ctx, aligned(sortBytes) + 2 * keyBytes + 2 * posBytes));
  uint64_t *keysIn = reinterpret_cast<uint64_t *>(base);
  uint64_t *keysOut = reinterpret_cast<uint64_t *>(base + keyBytes);
  int32_t *posIn = reinterpret_cast<int32_t *>(base + 2 * keyBytes);
  int32_t *posOut = reinterpret_cast<int32_t *>(base + 2 * keyBytes + posBytes);
  void *sortTemp = base + 2 * keyBytes + 2 * posBytes;

  gatherGradKeys<<<gridFor(nIndices, kBlock), kBlock, 0, s>>>(
      indices, keysIn, posIn, axisDim, nIndices);
  checkLaunch(kernel);
  check(cub::DeviceRadixSort::SortPairs(sortTemp, sortBytes, keysIn, keysOut,
                                        posIn, posOut, count, 0, endBit, s),
        kernel);
  const int64_t n = outer * nIndices * inner;
  if (fits32(n))
    gatherGradSums<uint32_t><<<gridFor(n, kBlock), kBlock, 0, s>>>(
        dy, keysOut, posOut, dData, axisDim, inner, nIndices, n);
  else
    gatherGradSums<uint64_t><<<gridFor(n, kBlock), kBlock, 0, s>>>(
        dy, keysOut, posOut, dData, axisDim, inner, nIndices, n);
  checkLaunch(kernel);
}
