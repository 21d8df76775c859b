//===- cudnn_conv.cpp - Convolutions on cuDNN, when it is there -----------===//
//
// Part of pipec's CUDA runtime (cudnn_conv.h).
//
//===----------------------------------------------------------------------===//
///
/// \file
/// cuDNN is opened with dlopen ("libcudnn.so.9", then "libcudnn.so") the
/// first time a convolution runs, unless PIPEC_CUDNN=0; <cudnn.h> supplies
/// the types and the signatures only. Without it (or below version 9)
/// every convolution runs on conv.cu's im2col + cuBLAS, and the runtime
/// says so once on stderr.
///
/// Arithmetic, matching the context's matrix products (cuda_rt.h):
///  - float32 (the default): CUDNN_FMA_MATH, float32 inputs, products and
///    sums (no TF32), as the CPU kernels compute;
///  - --allow-tf32: CUDNN_DEFAULT_MATH (TF32 tensor cores allowed);
///  - --precision bf16: both operands are first rounded to the nearest
///    bfloat16 values (kept as float32, in the context's bf16 staging), then
///    convolved with CUDNN_DEFAULT_MATH: a bfloat16 value is exact in TF32,
///    so the products are exact and the sums float32, as the CPU emulation
///    (runtime/cpu/matmul_bf16.cpp) does up to the order of the sums;
///  - --precision bf16 with PIPEC_CUDNN_BF16=1 (off by default): both
///    operands are rounded into bfloat16 tensors (2 bytes a value) and
///    convolved as such (x, w, y bfloat16, float32 arithmetic inside:
///    cuDNN's PSEUDO_BFLOAT16 configuration), and the bfloat16 result is
///    widened into the float32 output. The result is rounded once to
///    bfloat16, which the CPU emulation does not do (within 2^-8 of it),
///    as PyTorch's autocast convolutions do. The tensor cores then run at
///    their bfloat16 rate on half the bytes; the H200's ResNet-50 took
///    22.8 of its 43.7 ms bf16 step in TF32 convolutions (2026-11-27).
///    Written after that run: not yet run on a GPU. (1x1 convolutions do
///    not reach cuDNN unless PIPEC_POINTWISE_GEMM=0: conv.cu multiplies
///    them as bfloat16 matrix products with float32 sums.)
///
/// Algorithm: the first call of a pass for a shape (and arithmetic) times
/// cuDNN's algorithms on the call's own buffers (cudnnFind*AlgorithmEx,
/// writing only `out`, which the call overwrites anyway) and keeps the
/// fastest deterministic one whose math type is allowed and whose
/// workspace fits (kWorkspaceLimit, less when the GPU has less than twice
/// that free); a shape without one is remembered and goes to the fallback.
/// PIPEC_CUDNN_DETERMINISTIC=0 lets the non-deterministic ones compete too
/// (the backward passes' atomics; not measured on a GPU yet).
/// Deterministic algorithms give the same result for the same inputs
/// within a process; two processes may time their way to different
/// algorithms for a shape, which then agree to rounding only. In bf16 the
/// FFT and Winograd algorithms are left out: they multiply transformed
/// operands, which are no longer bfloat16 values. The descriptors are made
/// once per shape. Every failure before an algorithm is chosen (a missing
/// cuDNN part, a shape it refuses, no memory for a workspace) sends the
/// convolution to the fallback; a failure of a chosen algorithm throws.
///
/// cuDNN's convolution pads symmetrically: a convolution whose output size
/// differs from the one the symmetric padding padTop x padLeft gives (the
/// bottom / right padding implied by oH / oW is not the top / left one)
/// goes to the fallback.
///
//===----------------------------------------------------------------------===//

#include "cudnn_conv.h"

#include "core/error.h"
#include "cuda_rt.h"

// The convolution API is marked deprecated in cuDNN 9 (the graph API
// replaces it) but is supported there; its declarations are only read here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#include <cudnn.h>

#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

namespace pipec {
namespace cuda {
namespace {

/// Most workspace an algorithm may ask for.
constexpr size_t kWorkspaceLimit = size_t(256) << 20;

/// The entry points used, looked up by name in the opened library.
struct Api {
#define PIPEC_CUDNN_FUNCTIONS(X)                                               \
  X(cudnnGetVersion)                                                           \
  X(cudnnGetErrorString)                                                       \
  X(cudnnCreate)                                                               \
  X(cudnnDestroy)                                                              \
  X(cudnnSetStream)                                                            \
  X(cudnnCreateTensorDescriptor)                                               \
  X(cudnnSetTensor4dDescriptor)                                                \
  X(cudnnDestroyTensorDescriptor)                                              \
  X(cudnnCreateFilterDescriptor)                                               \
  X(cudnnSetFilter4dDescriptor)                                                \
  X(cudnnDestroyFilterDescriptor)                                              \
  X(cudnnCreateConvolutionDescriptor)                                          \
  X(cudnnDestroyConvolutionDescriptor)                                         \
  X(cudnnSetConvolution2dDescriptor)                                           \
  X(cudnnSetConvolutionGroupCount)                                             \
  X(cudnnSetConvolutionMathType)                                               \
  X(cudnnGetConvolution2dForwardOutputDim)                                     \
  X(cudnnFindConvolutionForwardAlgorithmEx)                                    \
  X(cudnnFindConvolutionBackwardDataAlgorithmEx)                               \
  X(cudnnFindConvolutionBackwardFilterAlgorithmEx)                             \
  X(cudnnConvolutionForward)                                                   \
  X(cudnnConvolutionBackwardData)                                              \
  X(cudnnConvolutionBackwardFilter)
#define PIPEC_CUDNN_POINTER(name) decltype(&::name) name = nullptr;
  PIPEC_CUDNN_FUNCTIONS(PIPEC_CUDNN_POINTER)
#undef PIPEC_CUDNN_POINTER
  void *library = nullptr;
  int version = 0;
};

/// One pass of one convolution shape: its descriptors and algorithm, or
/// `usable` false (the fallback).
struct Plan {
  bool usable = false;
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  int algo = 0;
  size_t workspace = 0;
  cudnnMathType_t math = CUDNN_FMA_MATH;
};

/// What the descriptors depend on: the shape without its bias flag.
using ShapeKey =
    std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
               int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
               int64_t, int64_t>;
ShapeKey shapeKey(const ConvShape &s) {
  return {s.n,  s.c,  s.h,  s.w,  s.m,  s.kh, s.kw, s.oh,
          s.ow, s.sh, s.sw, s.pt, s.pl, s.dh, s.dw, s.groups};
}
/// How a convolution's tensors reach cuDNN: float32, float32 holding
/// bfloat16 values, or bfloat16 (PIPEC_CUDNN_BF16=1).
enum class Operands { Float, Bf16Values, Bf16 };
Operands operandsOf(const Context &c) {
  if (!c.matmulBf16)
    return Operands::Float;
  return c.cudnnBf16 ? Operands::Bf16 : Operands::Bf16Values;
}

/// A plan's key: the pass, the math type, the operands (bfloat16 ones:
/// no transforming algorithms) and the shape.
using Key = std::tuple<int, int, int, ShapeKey>;

struct State {
  std::mutex mutex;
  bool tried = false, enabled = true;
  int64_t calls = 0;     ///< convolutions cuDNN ran
  int64_t bf16Calls = 0; ///< of which on bfloat16 tensors
  Api api;
  cudnnHandle_t handle = nullptr;
  std::map<Key, Plan> plans;
};

State &state() {
  static State s;
  return s;
}

void checkDnn(const Api &api, cudnnStatus_t status, const char *call) {
  if (status == CUDNN_STATUS_SUCCESS)
    return;
  throw rt::RtError(std::string("cuDNN ") + call + ": " +
                    (api.cudnnGetErrorString
                         ? api.cudnnGetErrorString(status)
                         : ("status " + std::to_string(int(status))).c_str()));
}

/// Opens the library once; false when it is not there (or too old).
bool load(State &s) {
  if (s.tried)
    return s.api.library != nullptr;
  s.tried = true;
  if (const char *flag = std::getenv("PIPEC_CUDNN");
      flag && std::string(flag) == "0") {
    s.enabled = false;
    return false;
  }
  void *library = nullptr;
  std::string why;
  for (const char *name : {"libcudnn.so.9", "libcudnn.so"}) {
    if ((library = dlopen(name, RTLD_NOW | RTLD_LOCAL)))
      break;
    const char *error = dlerror();
    why += std::string(why.empty() ? "" : "; ") + (error ? error : name);
  }
  if (!library) {
    std::fprintf(stderr,
                 "pipec: cuDNN not found (%s); convolutions use im2col + "
                 "cuBLAS\n",
                 why.c_str());
    return false;
  }
  Api api;
  bool complete = true;
#define PIPEC_CUDNN_LOOKUP(name)                                               \
  api.name = reinterpret_cast<decltype(api.name)>(dlsym(library, #name));      \
  complete = complete && api.name != nullptr;
  PIPEC_CUDNN_FUNCTIONS(PIPEC_CUDNN_LOOKUP)
#undef PIPEC_CUDNN_LOOKUP
  api.version = complete ? int(api.cudnnGetVersion()) : 0;
  // The perf structures of <cudnn.h> are cuDNN 9's.
  if (!complete || api.version / 10000 != 9) {
    std::fprintf(stderr,
                 "pipec: the cuDNN found (version %d) lacks the convolution "
                 "API of cuDNN 9; convolutions use im2col + cuBLAS\n",
                 api.version);
    dlclose(library);
    return false;
  }
  api.library = library;
  s.api = api;
  return true;
}

/// cuDNN's math type for the context's arithmetic, and whether an
/// algorithm of math type `got` computes it.
cudnnMathType_t wantedMath(const Context &c) {
  // (bfloat16 tensors: tensor-core algorithms are offered for the
  // descriptor's math type CUDNN_TENSOR_OP_MATH.)
  if (c.matmulBf16 && c.cudnnBf16)
    return CUDNN_TENSOR_OP_MATH;
  return c.allowTf32 || c.matmulBf16 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
}
bool mathAllowed(cudnnMathType_t wanted, cudnnMathType_t got) {
  if (wanted == CUDNN_FMA_MATH)
    return got == CUDNN_FMA_MATH;
  // TF32 (or bfloat16 values in TF32): never a conversion to half.
  return got != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
}

bool fitsCudnn(int64_t v) { return v >= 0 && v <= INT32_MAX; }

/// The algorithms that multiply transformed operands (FFT, Winograd).
bool transforms(cudnnConvolutionFwdAlgo_t a) {
  return a == CUDNN_CONVOLUTION_FWD_ALGO_FFT ||
         a == CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD ||
         a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
}
bool transforms(cudnnConvolutionBwdDataAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT ||
         a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD ||
         a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
}
bool transforms(cudnnConvolutionBwdFilterAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT ||
         a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
}

/// Whether a Find call succeeded; a failure (a shape this cuDNN does not
/// take) is said once per process and sends the shape to the fallback.
bool timed(const Api &api, cudnnStatus_t status, const char *call) {
  if (status == CUDNN_STATUS_SUCCESS)
    return true;
  static bool said = false;
  if (!said) {
    said = true;
    std::fprintf(stderr,
                 "pipec: cuDNN %s: %s; that convolution (and any other it "
                 "refuses) runs on im2col + cuBLAS\n",
                 call, api.cudnnGetErrorString(status));
  }
  return false;
}

/// Whether algorithms whose sums' order varies from run to run (atomics:
/// the backward passes' ALGO_0 and ALGO_3, which PyTorch's default
/// cudnn.benchmark may pick) are allowed: PIPEC_CUDNN_DETERMINISTIC=0.
bool anyDeterminism() {
  static const bool any = [] {
    const char *flag = std::getenv("PIPEC_CUDNN_DETERMINISTIC");
    return flag && std::string(flag) == "0";
  }();
  return any;
}

/// The fastest usable result of a Find call (sorted by time by cuDNN).
template <typename Perf>
bool choose(const Perf *results, int count, cudnnMathType_t wanted, bool bf16,
            size_t limit, Plan &plan) {
  for (int i = 0; i < count; ++i) {
    const Perf &r = results[i];
    if (r.status != CUDNN_STATUS_SUCCESS ||
        (r.determinism != CUDNN_DETERMINISTIC && !anyDeterminism()) ||
        r.memory > limit || !mathAllowed(wanted, r.mathType) ||
        (bf16 && transforms(r.algo)))
      continue;
    plan.algo = int(r.algo);
    plan.workspace = r.memory;
    plan.math = r.mathType;
    plan.usable = true;
    return true;
  }
  return false;
}

/// Makes the descriptors and times the algorithms (see the file comment);
/// `plan` is already in the cache, so its descriptors are released with it
/// whatever happens here.
void makePlan(Context &ctx, State &s, Plan &plan, ConvPass pass,
              const ConvShape &shape, cudnnDataType_t type, const void *a,
              const void *b, void *out) {
  const Api &api = s.api;
  const auto [n, c, h, w, m, kh, kw, oh, ow, sh, sw, pt, pl, dh, dw, groups] =
      shapeKey(shape);
  for (int64_t v : {n, c, h, w, m, kh, kw, oh, ow, sh, sw, dh, dw, groups})
    if (v < 1 || !fitsCudnn(v))
      return;
  for (int64_t v : {pt, pl, n * c * h * w, n * m * oh * ow})
    if (!fitsCudnn(v))
      return;
  if (c % groups != 0 || m % groups != 0)
    return;
  const cudnnMathType_t math = wantedMath(ctx);
  // Cross-correlation (ONNX Conv), float32 accumulation. Any refusal: the
  // fallback.
  if (api.cudnnCreateTensorDescriptor(&plan.x) != CUDNN_STATUS_SUCCESS ||
      api.cudnnCreateTensorDescriptor(&plan.y) != CUDNN_STATUS_SUCCESS ||
      api.cudnnCreateFilterDescriptor(&plan.w) != CUDNN_STATUS_SUCCESS ||
      api.cudnnCreateConvolutionDescriptor(&plan.conv) !=
          CUDNN_STATUS_SUCCESS ||
      api.cudnnSetTensor4dDescriptor(plan.x, CUDNN_TENSOR_NCHW, type, int(n),
                                     int(c), int(h),
                                     int(w)) != CUDNN_STATUS_SUCCESS ||
      api.cudnnSetTensor4dDescriptor(plan.y, CUDNN_TENSOR_NCHW, type, int(n),
                                     int(m), int(oh),
                                     int(ow)) != CUDNN_STATUS_SUCCESS ||
      api.cudnnSetFilter4dDescriptor(plan.w, type, CUDNN_TENSOR_NCHW, int(m),
                                     int(c / groups), int(kh),
                                     int(kw)) != CUDNN_STATUS_SUCCESS ||
      api.cudnnSetConvolution2dDescriptor(
          plan.conv, int(pt), int(pl), int(sh), int(sw), int(dh), int(dw),
          CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT) != CUDNN_STATUS_SUCCESS ||
      api.cudnnSetConvolutionGroupCount(plan.conv, int(groups)) !=
          CUDNN_STATUS_SUCCESS ||
      api.cudnnSetConvolutionMathType(plan.conv, math) != CUDNN_STATUS_SUCCESS)
    return;
  // Symmetric padding must give the output size the model has.
  int dims[4] = {0, 0, 0, 0};
  if (api.cudnnGetConvolution2dForwardOutputDim(
          plan.conv, plan.x, plan.w, &dims[0], &dims[1], &dims[2], &dims[3]) !=
          CUDNN_STATUS_SUCCESS ||
      dims[0] != n || dims[1] != m || dims[2] != oh || dims[3] != ow)
    return;

  // The workspace Find may use: kWorkspaceLimit, or half of what is free.
  size_t freeBytes = 0, totalBytes = 0;
  size_t limit = kWorkspaceLimit;
  if (cudaMemGetInfo(&freeBytes, &totalBytes) == cudaSuccess)
    limit = std::min(limit, freeBytes / 2);
  else
    (void)cudaGetLastError();
  void *workspace = limit ? scratch(ctx, limit) : nullptr;
  constexpr int kMax = 16;
  int count = 0;
  // Find fills `results` and `count` before pick reads them.
  auto pick = [&](const auto *results, cudnnStatus_t status, const char *call) {
    if (timed(api, status, call))
      choose(results, count, math, ctx.matmulBf16, limit, plan);
  };
  switch (pass) {
  case ConvPass::Forward: {
    cudnnConvolutionFwdAlgoPerf_t results[kMax];
    pick(results,
         api.cudnnFindConvolutionForwardAlgorithmEx(
             s.handle, plan.x, a, plan.w, b, plan.conv, plan.y, out, kMax,
             &count, results, workspace, limit),
         "cudnnFindConvolutionForwardAlgorithmEx");
    break;
  }
  case ConvPass::GradInput: {
    cudnnConvolutionBwdDataAlgoPerf_t results[kMax];
    pick(results,
         api.cudnnFindConvolutionBackwardDataAlgorithmEx(
             s.handle, plan.w, b, plan.y, a, plan.conv, plan.x, out, kMax,
             &count, results, workspace, limit),
         "cudnnFindConvolutionBackwardDataAlgorithmEx");
    break;
  }
  case ConvPass::GradWeight: {
    cudnnConvolutionBwdFilterAlgoPerf_t results[kMax];
    pick(results,
         api.cudnnFindConvolutionBackwardFilterAlgorithmEx(
             s.handle, plan.x, b, plan.y, a, plan.conv, plan.w, out, kMax,
             &count, results, workspace, limit),
         "cudnnFindConvolutionBackwardFilterAlgorithmEx");
    break;
  }
  }
  // Run with the math type the chosen algorithm was timed in.
  if (plan.usable && api.cudnnSetConvolutionMathType(plan.conv, plan.math) !=
                         CUDNN_STATUS_SUCCESS)
    plan.usable = false;
}

/// The element counts of a pass's two operands (a, b) and its result.
std::tuple<int64_t, int64_t, int64_t> operandCounts(ConvPass pass,
                                                    const ConvShape &s) {
  switch (pass) {
  case ConvPass::Forward:
    return {s.xCount(), s.wCount(), s.yCount()};
  case ConvPass::GradInput:
    return {s.yCount(), s.wCount(), s.xCount()};
  case ConvPass::GradWeight:
    return {s.yCount(), s.xCount(), s.wCount()};
  }
  return {0, 0, 0};
}

/// `count` elements of `bytes` each, rounded up to 256 bytes (so that the
/// next region of a staging buffer stays aligned).
size_t region(int64_t count, size_t bytes) {
  return (size_t(count) * bytes + 255) / 256 * 256;
}

} // namespace

bool cudnnConvolution(Context &ctx, ConvPass pass, const ConvShape &shape,
                      const float *a, const float *b, float *out) {
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.enabled || !load(s))
    return false;
  const Api &api = s.api;
  if (!s.handle) {
    cudnnStatus_t status = api.cudnnCreate(&s.handle);
    if (status != CUDNN_STATUS_SUCCESS) {
      // A part of cuDNN missing, or built for another CUDA or GPU.
      std::fprintf(stderr,
                   "pipec: cuDNN %d cannot start on this GPU (%s); "
                   "convolutions use im2col + cuBLAS\n",
                   api.version, api.cudnnGetErrorString(status));
      s.handle = nullptr;
      s.enabled = false;
      return false;
    }
  }
  checkDnn(api, api.cudnnSetStream(s.handle, ctx.stream), "cudnnSetStream");
  const Operands operands = operandsOf(ctx);
  const Key key{int(pass), int(wantedMath(ctx)), int(operands),
                shapeKey(shape)};
  // The tensors cuDNN reads and writes: a, b and out themselves, or their
  // rounded copies in the staging buffer (bfloat16 values kept as float32,
  // or bfloat16, with the result then widened into out).
  auto found = s.plans.find(key);
  if (found != s.plans.end() && !found->second.usable)
    return false;
  const void *da = a, *db = b;
  void *dout = out;
  const auto [na, nb, nout] = operandCounts(pass, shape);
  if (operands == Operands::Bf16Values) {
    const size_t offset = region(na, sizeof(float));
    char *staged = static_cast<char *>(
        bf16Staging(ctx, offset + size_t(nb) * sizeof(float)));
    roundToBf16Values(ctx, a, reinterpret_cast<float *>(staged), na,
                      "cuDNN convolution (bf16)");
    roundToBf16Values(ctx, b, reinterpret_cast<float *>(staged + offset), nb,
                      "cuDNN convolution (bf16)");
    da = staged;
    db = staged + offset;
  } else if (operands == Operands::Bf16) {
    const size_t offsetB = region(na, 2), offsetOut = offsetB + region(nb, 2);
    char *staged =
        static_cast<char *>(bf16Staging(ctx, offsetOut + size_t(nout) * 2));
    toBf16Storage(ctx, a, staged, na, "cuDNN convolution (bf16 tensors)");
    toBf16Storage(ctx, b, staged + offsetB, nb,
                  "cuDNN convolution (bf16 tensors)");
    da = staged;
    db = staged + offsetB;
    dout = staged + offsetOut;
  }
  if (found == s.plans.end()) {
    // (Timed on the staged tensors; a shape cuDNN refuses staged them for
    // nothing this once.)
    found = s.plans.emplace(key, Plan()).first;
    makePlan(ctx, s, found->second, pass, shape,
             operands == Operands::Bf16 ? CUDNN_DATA_BFLOAT16
                                        : CUDNN_DATA_FLOAT,
             da, db, dout);
  }
  const Plan &plan = found->second;
  if (!plan.usable)
    return false;
  ++s.calls;
  if (operands == Operands::Bf16)
    ++s.bf16Calls;
  void *workspace = plan.workspace ? scratch(ctx, plan.workspace) : nullptr;
  const float one = 1.0f, zero = 0.0f;
  switch (pass) {
  case ConvPass::Forward:
    checkDnn(api,
             api.cudnnConvolutionForward(
                 s.handle, &one, plan.x, da, plan.w, db, plan.conv,
                 cudnnConvolutionFwdAlgo_t(plan.algo), workspace,
                 plan.workspace, &zero, plan.y, dout),
             "cudnnConvolutionForward");
    break;
  case ConvPass::GradInput:
    checkDnn(api,
             api.cudnnConvolutionBackwardData(
                 s.handle, &one, plan.w, db, plan.y, da, plan.conv,
                 cudnnConvolutionBwdDataAlgo_t(plan.algo), workspace,
                 plan.workspace, &zero, plan.x, dout),
             "cudnnConvolutionBackwardData");
    break;
  case ConvPass::GradWeight:
    checkDnn(api,
             api.cudnnConvolutionBackwardFilter(
                 s.handle, &one, plan.x, db, plan.y, da, plan.conv,
                 cudnnConvolutionBwdFilterAlgo_t(plan.algo), workspace,
                 plan.workspace, &zero, plan.w, dout),
             "cudnnConvolutionBackwardFilter");
    break;
  }
  if (operands == Operands::Bf16)
    fromBf16Storage(ctx, dout, out, nout, "cuDNN convolution (bf16 tensors)");
  return true;
}

bool setCudnnEnabled(bool enabled) {
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  const bool was = s.enabled;
  s.enabled = enabled;
  return was;
}

int64_t cudnnCallsRun() {
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.calls;
}

int64_t cudnnBf16CallsRun() {
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.bf16Calls;
}

int cudnnVersionLoaded() {
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.api.library ? s.api.version : 0;
}

void releaseCudnn() {
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  const Api &api = s.api;
  for (auto &[key, plan] : s.plans) {
    if (plan.x)
      api.cudnnDestroyTensorDescriptor(plan.x);
    if (plan.y)
      api.cudnnDestroyTensorDescriptor(plan.y);
    if (plan.w)
      api.cudnnDestroyFilterDescriptor(plan.w);
    if (plan.conv)
      api.cudnnDestroyConvolutionDescriptor(plan.conv);
  }
  s.plans.clear();
  if (s.handle && s.api.cudnnDestroy)
    s.api.cudnnDestroy(s.handle);
  s.handle = nullptr;
}

} // namespace cuda
} // namespace pipec

#pragma GCC diagnostic pop
