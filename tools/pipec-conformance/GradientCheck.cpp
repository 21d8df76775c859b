//===- GradientCheck.cpp - VJPs against finite differences ----------------===//
//
// Part of pipec-conformance (--gradients). For an imported case: the module
// in float64 mode (--nn-convert-precision), the gradient function of @main
// built from the ops' VJPs (pipec::buildGradientFunction), and a check of
//
//   <w, J v>  (central difference of @main along a random direction v)
//   against <J^T w, v>  (the gradient function, cotangent w)
//
// on the case's own inputs, with random w over the float outputs and v over
// the float inputs. The error is measured against ||J^T w|| ||v|| (the
// Cauchy-Schwarz bound of both sides), so a gradient that is wrong in any
// direction the data excites shows, and a correct one passes at 1e-6
// (float64 central differences with h = 1e-6: truncation ~1e-12, rounding
// ~1e-10). A kink of the function inside [x - hv, x + hv] (ReLU at 0, a Max
// tie, a Clip bound that the data sits on) is told apart from a wrong
// gradient by the one-sided slopes, a jump (Sign at 0) by a central
// difference that changes with h: the function is then not differentiable
// there and the case is reported as such, not as a pass.
//
//===----------------------------------------------------------------------===//
#include "GradientCheck.h"

#include "passes/Passes.h"
#include "pipec/Exec.h"

#include "mlir/Pass/PassManager.h"

#include <cmath>
#include <cstring>
#include <random>

using namespace mlir;

namespace {

/// Float64 copy of a float32 tensor (int64 tensors unchanged).
pipec::HostTensor widen(const pipec::HostTensor &t) {
  if (!t.isFloat || t.bytes.size() == size_t(t.numel()) * 8)
    return t;
  pipec::HostTensor out = t;
  out.bytes.resize(size_t(t.numel()) * 8);
  for (int64_t i = 0; i < t.numel(); ++i) {
    float f;
    std::memcpy(&f, t.bytes.data() + 4 * i, 4);
    double d = f;
    std::memcpy(out.bytes.data() + 8 * i, &d, 8);
  }
  return out;
}

double *reals(pipec::HostTensor &t) {
  return reinterpret_cast<double *>(t.bytes.data());
}
const double *reals(const pipec::HostTensor &t) {
  return reinterpret_cast<const double *>(t.bytes.data());
}

pipec::HostTensor randomLike(const pipec::HostTensor &t, std::mt19937_64 &rng) {
  pipec::HostTensor out = t;
  out.isFloat = true;
  out.bytes.assign(size_t(t.numel()) * 8, 0);
  std::normal_distribution<double> normal;
  for (int64_t i = 0; i < t.numel(); ++i)
    reals(out)[i] = normal(rng);
  return out;
}

double dot(const pipec::HostTensor &a, const pipec::HostTensor &b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    s += reals(a)[i] * reals(b)[i];
  return s;
}

} // namespace

pipec::GradientCheck pipec::checkGradients(ModuleOp original,
                                    const std::vector<HostTensor> &inputs) {
  GradientCheck result;
  OwningOpRef<ModuleOp> module = original.clone();
  PassManager pm(module->getContext());
  pm.addPass(createNNConvertPrecisionPass());
  if (failed(pm.run(*module))) {
    result.error = "--nn-convert-precision failed";
    return result;
  }
  auto main = module->lookupSymbol<func::FuncOp>("main");
  if (!main) {
    result.error = "no @main";
    return result;
  }
  bool update = false;
  main.walk([&](Operation *op) {
    update |= isa<nn::SgdUpdateOp, nn::MomentumOp, nn::AdamOp, nn::AdagradOp>(op);
  });
  if (update) {
    result.skipped = "a training operator (an update, not differentiated)";
    return result;
  }
  auto grad = buildGradientFunction(main, "main_grad");
  if (failed(grad)) {
    result.error = "no gradient function (an op without a VJP)";
    return result;
  }

  std::vector<HostTensor> x;
  for (const HostTensor &t : inputs)
    x.push_back(widen(t));
  std::vector<HostTensor> y;
  std::string why;
  if (!executeFunction(main, x, y, why)) {
    result.error = "forward: " + why;
    return result;
  }
  // Cotangents: random on float outputs, zero on those pipec does not
  // differentiate through (statistics outputs, log_prob: their VJPs refuse
  // a gradient, so no model can depend on them silently).
  auto ret = cast<func::ReturnOp>(main.getBody().front().getTerminator());
  std::mt19937_64 rng(12345);
  std::vector<HostTensor> w;
  for (auto [i, out] : llvm::enumerate(y)) {
    if (!out.isFloat)
      continue;
    HostTensor c = randomLike(out, rng);
    if (isUndifferentiatedResult(ret.getOperand(i)))
      std::fill(c.bytes.begin(), c.bytes.end(), 0);
    w.push_back(std::move(c));
  }
  // Directions: random on float inputs, zero on the class weights of a
  // SoftmaxCrossEntropyLoss (constants of the loss, as in every framework).
  std::vector<HostTensor> v;
  for (auto [i, t] : llvm::enumerate(x)) {
    if (!t.isFloat)
      continue;
    HostTensor d = randomLike(t, rng);
    BlockArgument arg = main.getArgument(i);
    if (!arg.use_empty() && llvm::all_of(arg.getUses(), [](OpOperand &use) {
          return isa<nn::SoftmaxCrossEntropyLossOp>(use.getOwner()) &&
                 use.getOperandNumber() == 2;
        }))
      std::fill(d.bytes.begin(), d.bytes.end(), 0);
    v.push_back(std::move(d));
  }
  if (w.empty() || v.empty()) {
    result.skipped = "no float input or output";
    return result;
  }

  std::vector<HostTensor> gradInputs = x, g;
  gradInputs.insert(gradInputs.end(), w.begin(), w.end());
  if (!executeFunction(*grad, gradInputs, g, why)) {
    result.error = "gradient: " + why;
    return result;
  }
  double analytic = 0, gNorm = 0, vNorm = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    analytic += dot(g[i], v[i]);
    gNorm += dot(g[i], g[i]);
    vNorm += dot(v[i], v[i]);
  }
  const double bound = std::sqrt(gNorm * vNorm);

  // <w, f(x + t v)> for t in {-h, 0, h}.
  auto along = [&](double t, double &out) {
    std::vector<HostTensor> xs = x, ys;
    size_t k = 0;
    for (HostTensor &u : xs)
      if (u.isFloat) {
        for (int64_t i = 0; i < u.numel(); ++i)
          reals(u)[i] += t * reals(v[k])[i];
        ++k;
      }
    if (!executeFunction(main, xs, ys, why))
      return false;
    out = 0;
    size_t j = 0;
    for (const HostTensor &u : ys)
      if (u.isFloat)
        out += dot(w[j++], u);
    return true;
  };
  const double h = 1e-6;
  double plus = 0, zero = 0, minus = 0, plus4 = 0, minus4 = 0;
  if (!along(h, plus) || !along(0, zero) || !along(-h, minus) ||
      !along(h / 4, plus4) || !along(-h / 4, minus4)) {
    result.error = "forward at x + hv: " + why;
    return result;
  }
  const double fd = (plus - minus) / (2 * h);
  const double scale = std::max({bound, std::fabs(fd), 1e-300});
  result.error64 = std::fabs(analytic - fd) / scale;
  // One-sided slopes differ by O(h) where f is smooth; by O(1) at a kink
  // (ReLU at 0, a tie of Max, a Clip bound the data sits on).
  // A jump (Sign at 0) shows as a central difference that grows as h
  // shrinks.
  const double jump =
      std::fabs((plus4 - minus4) / (h / 2) - fd) / std::max(scale, std::fabs(fd));
  const double kink =
      std::max(std::fabs((plus - zero) - (zero - minus)) / h / scale, jump);
  if (kink > 1e-4) {
    result.skipped = "not differentiable at the test data (one-sided slopes "
                     "differ by " +
                     std::to_string(kink) + ")";
    return result;
  }
  if (result.error64 > 1e-6)
    result.error = "VJP differs from finite differences: <J^T w, v> = " +
                   std::to_string(analytic) + ", central difference " +
                   std::to_string(fd) + " (relative " +
                   std::to_string(result.error64) + ")";
  return result;
}
