//===- two_stage.cpp - A hand-written two-stage pipeline for MPI tests ----===//
//
// Part of pipec's runtime tests. Built twice, with PIPEC_TEST_STAGE=0 and 1,
// into two stage executables that play the role of `pipec compile`'s
// output: a stage description and a per-step program calling the runtime's
// C ABI. run_two_stage.py launches them with mpirun (MPMD) and checks the
// results against its own float64 re-implementation.
//
//===----------------------------------------------------------------------===//
///
/// The model (global batch B = 8, M = 4 microbatches of b = 2, D = 4
/// features, C = 3 classes), trained with GPipe-ordered SGD:
///
///   stage 0:  h = x * scale                     (elementwise, scale: [D])
///   stage 1:  z = h @ fc.weight + fc.bias       (fc.weight: [D, C])
///             loss_mb = mean_i CE(softmax(z_i), y_i)
///
/// Stage 0 feeds x, sends h (channel 0), later receives dL/dh (channel 1).
/// Stage 1 receives h, feeds y, records the loss, back-propagates with the
/// loss seed 1/M and sends dL/dh back. Both apply W -= lr * dW after the
/// last microbatch. The arithmetic is written out by hand so that this test
/// depends only on runtime/core, not on the CPU kernels.
///
//===----------------------------------------------------------------------===//

#include "pipec_rt.h"

#include <cmath>
#include <cstring>
#include <string>

#ifndef PIPEC_TEST_STAGE
#error "define PIPEC_TEST_STAGE to 0 or 1"
#endif
#ifndef PIPEC_TEST_BUILD_ID
#error "define PIPEC_TEST_BUILD_ID"
#endif

namespace {

constexpr int B = 8, M = 4, b = 2, D = 4, C = 3;

/// The fields every stage description of this build shares.
std::string commonFields(int stage) {
  return "\"format\": \"pipec.stage/2\", \"abi\": " +
         std::to_string(PIPEC_RT_ABI_VERSION) + ", \"build_id\": \"" +
         PIPEC_TEST_BUILD_ID + "\", \"stage\": " + std::to_string(stage) +
         ", \"num_stages\": 2, \"microbatches\": " + std::to_string(M) +
         ", \"microbatch\": " + std::to_string(b) +
         ", \"global_batch\": " + std::to_string(B) +
         ", \"schedule\": \"gpipe\", \"policy\": {\"update\": \"flush\", "
         "\"flush\": true, \"versions_kept\": 1}";
}

float *at(char *arena, int offset) {
  return reinterpret_cast<float *>(arena + offset);
}

#if PIPEC_TEST_STAGE == 0

// Arena of stage 0 (byte offsets).
constexpr int kScale = 0, kGradScale = 64, kStash = 128 /* M*b*D floats */,
              kH = 256, kDH = 320, kLr = 384, kArena = 448;

std::string stageDescription() {
  return "{" + commonFields(0) +
         ", \"arena_bytes\": " + std::to_string(kArena) +
         ", \"weights\": [{\"name\": \"scale\", \"offset\": " +
         std::to_string(kScale) +
         ", \"shape\": [4], \"dtype\": \"f32\"}],"
         " \"feeds\": [{\"kind\": \"input\", \"name\": \"x\", \"index\": 0,"
         " \"shape\": [2, 4], \"dtype\": \"f32\"}],"
         " \"loss\": false,"
         " \"ops\": [{\"name\": \"/scale/Mul\", \"op\": \"Mul\", "
         "\"out_bytes\": "
         "32, \"param_bytes\": 16, \"saved_bytes\": 32, \"inputs\": []}]}";
}

void program(pipec_ctx *ctx, char *arena) {
  float *scale = at(arena, kScale), *gScale = at(arena, kGradScale);
  float *h = at(arena, kH), *dh = at(arena, kDH);
  for (int mb = 0; mb < M; ++mb) {
    float *x = at(arena, kStash) + mb * b * D;
    pipec_rt_feed(ctx, 0, mb, x);
    pipec_rt_op_begin(ctx, 0, 0);
    for (int i = 0; i < b * D; ++i)
      h[i] = x[i] * scale[i % D];
    pipec_rt_op_end(ctx, 0, 0);
    pipec_rt_send(ctx, 1, 0, mb, h, b * D * sizeof(float));
  }
  for (int mb = 0; mb < M; ++mb) {
    const float *x = at(arena, kStash) + mb * b * D;
    pipec_rt_recv(ctx, 1, 1, mb, dh, b * D * sizeof(float));
    pipec_rt_op_begin(ctx, 0, 1);
    for (int i = 0; i < b * D; ++i)
      gScale[i % D] += dh[i] * x[i];
    pipec_rt_op_end(ctx, 0, 1);
  }
  pipec_rt_lr(ctx, arena + kLr);
  float lr = *at(arena, kLr);
  pipec_rt_op_begin(ctx, 0, 2);
  for (int j = 0; j < D; ++j) {
    scale[j] -= lr * gScale[j];
    gScale[j] = 0;
  }
  pipec_rt_op_end(ctx, 0, 2);
}

#else // stage 1

// Arena of stage 1 (byte offsets).
constexpr int kW = 0, kBias = 64, kGradW = 128, kGradBias = 192, kH = 256,
              kLabels = 320, kProb = 384, kDZ = 448, kDH = 512, kLoss = 576,
              kSeed = 580, kLr = 584, kArena = 640;

std::string stageDescription() {
  return "{" + commonFields(1) +
         ", \"arena_bytes\": " + std::to_string(kArena) +
         ", \"weights\": [{\"name\": \"fc.weight\", \"offset\": " +
         std::to_string(kW) +
         ", \"shape\": [4, 3], \"dtype\": \"f32\"}, {\"name\": \"fc.bias\", "
         "\"offset\": " +
         std::to_string(kBias) +
         ", \"shape\": [3], \"dtype\": \"f32\"}],"
         " \"feeds\": [{\"kind\": \"labels\", \"name\": \"y\", \"shape\": [2],"
         " \"dtype\": \"i64\", \"classes\": 3}],"
         " \"loss\": true,"
         " \"ops\": [{\"name\": \"/fc/Gemm\", \"op\": \"Gemm\", \"out_bytes\": "
         "24, \"param_bytes\": 60, \"saved_bytes\": 32, \"inputs\": []},"
         " {\"name\": \"/loss\", \"op\": \"SoftmaxCrossEntropyLoss\", "
         "\"out_bytes\": 4, \"param_bytes\": 0, \"saved_bytes\": 24, "
         "\"inputs\": [\"/fc/Gemm\"]}]}";
}

void program(pipec_ctx *ctx, char *arena) {
  float *w = at(arena, kW), *bias = at(arena, kBias);
  float *gW = at(arena, kGradW), *gBias = at(arena, kGradBias);
  float *h = at(arena, kH), *prob = at(arena, kProb), *dz = at(arena, kDZ);
  float *dh = at(arena, kDH), *loss = at(arena, kLoss);
  auto *labels = reinterpret_cast<int64_t *>(arena + kLabels);
  pipec_rt_loss_seed(ctx, arena + kSeed);
  const float seed = *at(arena, kSeed);
  for (int mb = 0; mb < M; ++mb) {
    pipec_rt_recv(ctx, 0, 0, mb, h, b * D * sizeof(float));
    pipec_rt_feed(ctx, 0, mb, labels);
    // Forward: logits, softmax, mean cross-entropy over the microbatch.
    pipec_rt_op_begin(ctx, 0, 0);
    for (int i = 0; i < b; ++i)
      for (int c = 0; c < C; ++c) {
        float z = bias[c];
        for (int k = 0; k < D; ++k)
          z += h[i * D + k] * w[k * C + c];
        prob[i * C + c] = z;
      }
    pipec_rt_op_end(ctx, 0, 0);
    pipec_rt_op_begin(ctx, 1, 0);
    float total = 0;
    for (int i = 0; i < b; ++i) {
      float *z = prob + i * C;
      float mx = z[0];
      for (int c = 1; c < C; ++c)
        mx = std::fmax(mx, z[c]);
      float sum = 0;
      for (int c = 0; c < C; ++c)
        sum += std::exp(z[c] - mx);
      total += std::log(sum) + mx - z[labels[i]];
      for (int c = 0; c < C; ++c)
        z[c] = std::exp(z[c] - mx) / sum;
    }
    *loss = total / b;
    pipec_rt_op_end(ctx, 1, 0);
    pipec_rt_loss(ctx, mb, loss);
    // Backward: dz = seed * (p - onehot) / b.
    pipec_rt_op_begin(ctx, 1, 1);
    for (int i = 0; i < b; ++i)
      for (int c = 0; c < C; ++c)
        dz[i * C + c] =
            seed * (prob[i * C + c] - (labels[i] == c ? 1.0f : 0.0f)) / b;
    pipec_rt_op_end(ctx, 1, 1);
    pipec_rt_op_begin(ctx, 0, 1);
    for (int i = 0; i < b; ++i)
      for (int c = 0; c < C; ++c) {
        gBias[c] += dz[i * C + c];
        for (int k = 0; k < D; ++k)
          gW[k * C + c] += h[i * D + k] * dz[i * C + c];
      }
    for (int i = 0; i < b; ++i)
      for (int k = 0; k < D; ++k) {
        float s = 0;
        for (int c = 0; c < C; ++c)
          s += dz[i * C + c] * w[k * C + c];
        dh[i * D + k] = s;
      }
    pipec_rt_op_end(ctx, 0, 1);
    pipec_rt_send(ctx, 0, 1, mb, dh, b * D * sizeof(float));
  }
  pipec_rt_lr(ctx, arena + kLr);
  const float lr = *at(arena, kLr);
  pipec_rt_op_begin(ctx, 0, 2);
  for (int i = 0; i < D * C; ++i) {
    w[i] -= lr * gW[i];
    gW[i] = 0;
  }
  for (int c = 0; c < C; ++c) {
    bias[c] -= lr * gBias[c];
    gBias[c] = 0;
  }
  pipec_rt_op_end(ctx, 0, 2);
}

#endif

} // namespace

int main(int argc, char **argv) {
  std::string meta = stageDescription();
  return pipec_rt_main(argc, argv, meta.c_str(), program);
}
