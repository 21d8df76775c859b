//===- services.cpp - Data, loss, learning-rate and profiler services -----===//
//
// Part of pipec's runtime core. Implements pipec_rt_feed, pipec_rt_loss,
// pipec_rt_loss_seed, pipec_rt_lr, pipec_rt_run and pipec_rt_op_begin / _end.
//
//===----------------------------------------------------------------------===//

#include "core/context.h"
#include "core/error.h"
#include "core/watchdog.h"
#include "pipec_rt.h"

using namespace pipec::rt;

namespace {

void checkMicrobatch(const pipec_ctx &c, const char *fn, int64_t mb) {
  if (mb < 0 || mb >= c.desc.microbatches)
    throw RtError(std::string(fn) + ": microbatch " + std::to_string(mb) +
                  " is outside [0, " + std::to_string(c.desc.microbatches) +
                  ")");
}

void checkPointer(const void *p, const char *fn) {
  if (!p)
    throw RtError(std::string(fn) + ": null buffer");
}

} // namespace

extern "C" void pipec_rt_feed(pipec_ctx *ctx, int64_t feed, int64_t mb,
                              void *dst) {
  guarded([&] {
    pipec_ctx &c = checkedContext(ctx, "pipec_rt_feed");
    if (feed < 0 || size_t(feed) >= c.feeds.size())
      throw RtError("pipec_rt_feed: feed " + std::to_string(feed) +
                    " is not in the stage description's " +
                    std::to_string(c.feeds.size()) + " feeds");
    checkMicrobatch(c, "pipec_rt_feed", mb);
    checkPointer(dst, "pipec_rt_feed");
    if (c.feedPrefetch)
      return c.feedPrefetch->feed(size_t(feed), c.step, mb, dst);
    fillWhenAsked(*c.device, c.feeds[size_t(feed)], c.step, mb, dst,
                  c.feedStaging);
  });
}

namespace {
/// Stores a scalar in the stage's float type (float32, or float64).
void writeReal(const pipec_ctx &c, void *dst, double v) {
  if (c.desc.isF64()) {
    c.device->toDevice(dst, &v, 8);
  } else {
    float f = float(v);
    c.device->toDevice(dst, &f, 4);
  }
}
} // namespace

extern "C" void pipec_rt_loss(pipec_ctx *ctx, int64_t mb, const void *loss) {
  guarded([&] {
    pipec_ctx &c = checkedContext(ctx, "pipec_rt_loss");
    if (!c.desc.loss)
      throw RtError("pipec_rt_loss called on stage " +
                    std::to_string(c.desc.stage) +
                    ", whose description does not say \"loss\": true");
    checkMicrobatch(c, "pipec_rt_loss", mb);
    checkPointer(loss, "pipec_rt_loss");
    if (c.lossRecorded[size_t(mb)])
      throw RtError("pipec_rt_loss: the loss of microbatch " +
                    std::to_string(mb) + " was recorded twice in one step");
    if (c.lossBuffer.get()) {
      // Read at the step's end (stepLoss), with the other microbatches'.
      c.device->copy(c.lossBuffer.get() + mb * c.desc.realBytes, loss,
                     c.desc.realBytes);
    } else if (c.desc.isF64()) {
      double v = 0;
      c.device->toHost(&v, loss, 8);
      c.losses[size_t(mb)] = v;
    } else {
      float v = 0;
      c.device->toHost(&v, loss, 4);
      c.losses[size_t(mb)] = double(v);
    }
    c.lossRecorded[size_t(mb)] = true;
  });
}

extern "C" void pipec_rt_loss_seed(pipec_ctx *ctx, void *dst) {
  guarded([&] {
    pipec_ctx &c = checkedContext(ctx, "pipec_rt_loss_seed");
    checkPointer(dst, "pipec_rt_loss_seed");
    // The step loss is the mean of the microbatch losses, except for
    // PipeDream (1f1b), where every microbatch is a minibatch with its own
    // update.
    // Split replicas: a replica's loss is the mean over its slice, so its
    // seed is scaled by the slice's share; the replicas' gradients then sum
    // to the microbatch's.
    double seed =
        c.desc.policy.update == pipec::formats::UpdateRule::PerMicrobatch
            ? 1.0
            : 1.0 / double(c.desc.microbatches);
    if (c.desc.replicaSplit)
      seed *= double(c.desc.sliceSize) / double(c.desc.microbatch);
    writeReal(c, dst, seed);
  });
}

extern "C" void pipec_rt_lr(pipec_ctx *ctx, void *dst) {
  guarded([&] {
    pipec_ctx &c = checkedContext(ctx, "pipec_rt_lr");
    checkPointer(dst, "pipec_rt_lr");
    writeReal(c, dst, c.options.lr);
  });
}

extern "C" void pipec_rt_rng(pipec_ctx *ctx, int64_t mb, void *dst) {
  guarded([&] {
    pipec_ctx &c = checkedContext(ctx, "pipec_rt_rng");
    checkPointer(dst, "pipec_rt_rng");
    int64_t out[2] = {int64_t(c.options.seed), c.step * c.desc.globalBatch +
                                                   mb * c.desc.microbatch +
                                                   c.desc.sliceFirst};
    c.device->toDevice(dst, out, sizeof(out));
  });
}

extern "C" void pipec_rt_step(pipec_ctx *ctx, void *dst) {
  guarded([&] {
    pipec_ctx &c = checkedContext(ctx, "pipec_rt_step");
    checkPointer(dst, "pipec_rt_step");
    int64_t updates = c.versions.updates() - 1;
    c.device->toDevice(dst, &updates, 8);
  });
}

extern "C" int64_t pipec_rt_global_mb(pipec_ctx *ctx, int64_t rel) {
  int64_t out = -1;
  guarded([&] {
    pipec_ctx &c = checkedContext(ctx, "pipec_rt_global_mb");
    // A window reaches back at most window_reach microbatches before its
    // first (p - 1 for a straight pipeline).
    int64_t m = c.desc.microbatches, back = c.desc.windowReach;
    if (rel < -back || rel >= m)
      throw RtError("pipec_rt_global_mb: relative microbatch " +
                    std::to_string(rel) + " is outside [-" +
                    std::to_string(back) + ", " + std::to_string(m) + ")");
    int64_t global = c.step * m + rel;
    out = global >= 0 && global < c.steps * m ? global : -1;
  });
  return out;
}

extern "C" void *pipec_rt_weights(pipec_ctx *ctx, int64_t mb, int64_t phase,
                                  char *arena) {
  void *out = arena;
  guarded([&] {
    pipec_ctx &c = checkedContext(ctx, "pipec_rt_weights");
    checkPointer(arena, "pipec_rt_weights");
    out = c.versions.acquire(mb, int(phase), arena);
  });
  return out;
}

extern "C" void pipec_rt_update(pipec_ctx *ctx) {
  guarded([&] {
    pipec_ctx &c = checkedContext(ctx, "pipec_rt_update");
    if (!c.arena)
      throw RtError("pipec_rt_update: no arena");
    c.versions.beforeUpdate(c.arena);
  });
}

extern "C" void pipec_rt_release(pipec_ctx *ctx, int64_t mb) {
  guarded([&] { checkedContext(ctx, "pipec_rt_release").versions.release(mb); });
}

namespace {
/// Where the device's queue is now, for the profiler and the timeline: a
/// mark of its queue clock, or -1 once the device has caught up (then the
/// host's clock, read by the caller, is the time).
int64_t queueMark(pipec_ctx *ctx) {
  if (QueueClock *clock = ctx->device->queueClock())
    return clock->mark();
  ctx->device->synchronize();
  return -1;
}
} // namespace

extern "C" void pipec_rt_span_begin(pipec_ctx *ctx, int64_t kind,
                                    int64_t mb) {
  watchdogProgress(); // a forward, backward or update starts
  if (!ctx || !ctx->timeline.enabled())
    return;
  guarded([&] {
    // Synchronous programs index microbatches within the step.
    int64_t global = mb < 0 || ctx->continuous
                         ? mb
                         : ctx->step * ctx->desc.microbatches + mb;
    // Spans show when the device ran them.
    ctx->timeline.begin(int(kind), global, ctx->step, queueMark(ctx));
  });
}

extern "C" void pipec_rt_span_end(pipec_ctx *ctx, int64_t kind) {
  watchdogProgress();
  if (!ctx || !ctx->timeline.enabled())
    return;
  guarded([&] { ctx->timeline.end(int(kind), queueMark(ctx)); });
}

extern "C" void pipec_rt_run(pipec_ctx *ctx, pipec_stage_fn fn, void *arena,
                             int64_t slot, void *wbase) {
  guarded([&] {
    pipec_ctx &c = checkedContext(ctx, "pipec_rt_run");
    if (!fn)
      throw RtError("pipec_rt_run: null stage function");
    c.device->runStageFunction(reinterpret_cast<const void *>(fn), arena, slot,
                               wbase, [&] { fn(ctx, arena, slot, wbase); });
  });
}

extern "C" void pipec_rt_op_begin(pipec_ctx *ctx, int64_t op, int64_t phase) {
  watchdogProgress(); // every layer op: only one op longer than the
                      // watchdog's limit looks like a hang
  if (!ctx)
    return;
  // Messages in flight move between ops, not only when this rank next
  // waits for one (see Communicator::progress).
  guarded([&] { progressMessages(*ctx); });
  if (!ctx->profiler.enabled())
    return;
  guarded([&] {
    ctx->profiler.begin(op, phase, queueMark(ctx)); // the op, not its launch
  });
}

extern "C" void pipec_rt_op_end(pipec_ctx *ctx, int64_t op, int64_t phase) {
  if (!ctx || !ctx->profiler.enabled())
    return;
  guarded([&] { ctx->profiler.end(op, phase, queueMark(ctx)); });
}

extern "C" const void *pipec_rt_constant(pipec_ctx *ctx, const void *host,
                                         int64_t bytes) {
  const void *out = host;
  guarded([&] {
    pipec_ctx &c = checkedContext(ctx, "pipec_rt_constant");
    checkPointer(host, "pipec_rt_constant");
    out = c.device->constant(host, bytes);
  });
  return out;
}

extern "C" pipec_kctx *pipec_rt_kernel_context(pipec_ctx *ctx) {
  pipec_kctx *out = nullptr;
  guarded([&] {
    pipec_ctx &c = checkedContext(ctx, "pipec_rt_kernel_context");
    if (!c.device)
      throw RtError("pipec_rt_kernel_context: the stage has no device yet");
    out = c.device->kernelContext();
  });
  return out;
}

void pipec::rt::collectQueueMarks(pipec_ctx &ctx) {
  QueueClock *clock = ctx.device ? ctx.device->queueClock() : nullptr;
  if (!clock || (!ctx.profiler.enabled() && !ctx.timeline.enabled()))
    return;
  std::vector<double> seconds = clock->collect();
  ctx.profiler.resolve(seconds);
  ctx.timeline.resolve(seconds);
}
