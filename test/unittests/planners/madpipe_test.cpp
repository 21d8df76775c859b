//===- madpipe_test.cpp - MadPipe: ⊕, 1F1B*, MadPipe-DP, Algorithm 1 ------===//
//
// The worked examples of papers/madpipe.md §6 (⊕, the 1F1B* groups
// (3,2,1,1)/(2,1,1,1), the 2P-1 case, the special processor of §4), the
// 1F1B* pattern unrolled and checked, MadPipe-DP against a brute force over
// every allocation of its own model (written here, independently of the
// library) on random integer instances whose grids are exact, the binary
// search's invariants, and the planner's plans.
//
//===----------------------------------------------------------------------===//

#include "pipec/Planners.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>

using namespace pipec;

namespace {

const double kInf = std::numeric_limits<double>::infinity();

//===----------------------------------------------------------------------===//
// ⊕ (madpipe.md §3.2, §6.1)
//===----------------------------------------------------------------------===//

TEST(MadPipeOplus, DigestExamples) {
  // T̂ = 10: 3⊕4 = 7; 7⊕5 = 15 (a new group starts at 10); 15⊕2 = 17.
  EXPECT_DOUBLE_EQ(madPipeOplus(3, 4, 10), 7);
  EXPECT_DOUBLE_EQ(madPipeOplus(7, 5, 10), 15);
  EXPECT_DOUBLE_EQ(madPipeOplus(15, 2, 10), 17);
  // Filling a group exactly stays in it.
  EXPECT_DOUBLE_EQ(madPipeOplus(4, 6, 10), 10);
  // A full group: the next one starts right at 10.
  EXPECT_DOUBLE_EQ(madPipeOplus(10, 1, 10), 11);
  EXPECT_DOUBLE_EQ(madPipeOplus(12, 9, 10), 29);
}

TEST(MadPipeOplus, Properties) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> value(0, 50), period(0.5, 20);
  for (int i = 0; i < 2000; ++i) {
    double x = value(rng), y = value(rng), t = period(rng);
    double r = madPipeOplus(x, y, t);
    EXPECT_GE(r, x + y - 1e-9);                    // x ⊕ y >= x + y
    EXPECT_LE(r, t * std::ceil(x / t) + y + 1e-9); // <= T̂⌈x/T̂⌉ + y
    EXPECT_GE(std::ceil(r / t - 1e-9), std::ceil(x / t - 1e-9)); // group
    EXPECT_DOUBLE_EQ(madPipeOplus(0, y, t), y);                  // 0 ⊕ y = y
  }
}

//===----------------------------------------------------------------------===//
// 1F1B* groups and patterns (madpipe.md §2.1, §3.1, §6.2)
//===----------------------------------------------------------------------===//

TEST(MadPipeGroups, FourStagesDigest) {
  // U = (3, 2, 2, 1): T = 4 gives (3, 2, 1, 1), T = 5 gives (2, 1, 1, 1).
  EXPECT_EQ(oneFOneBStarGroups({3, 2, 2, 1}, 4),
            (std::vector<int>{3, 2, 1, 1}));
  EXPECT_EQ(oneFOneBStarGroups({3, 2, 2, 1}, 5),
            (std::vector<int>{2, 1, 1, 1}));
  // T >= the total load: one group.
  EXPECT_EQ(oneFOneBStarGroups({3, 2, 2, 1}, 8),
            (std::vector<int>{1, 1, 1, 1}));
  // Two stages, U = 2 each, T = 2: (2, 1).
  EXPECT_EQ(oneFOneBStarGroups({2, 2}, 2), (std::vector<int>{2, 1}));
}

TEST(MadPipeGroups, TwoPMinusOneWithCommunication) {
  // P = 3 stages with U = T = 2 and links of ε > 0 between them: the chain
  // of 2P - 1 = 5 items has groups (5, 4, 3, 2, 1), so the first GPU stores
  // 5 activations where PipeDream assumes P = 3.
  const double eps = 0.01;
  std::vector<int> groups = oneFOneBStarGroups({2, eps, 2, eps, 2}, 2);
  EXPECT_EQ(groups, (std::vector<int>{5, 4, 3, 2, 1}));
  EXPECT_EQ(groups.front(), 2 * 3 - 1);
  // Without communication the same stages store (3, 2, 1).
  EXPECT_EQ(oneFOneBStarGroups({2, 2, 2}, 2), (std::vector<int>{3, 2, 1}));
}

TEST(MadPipeGroups, MaximalGreedyAndMonotoneInPeriod) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> load(0.1, 3);
  for (int it = 0; it < 300; ++it) {
    int n = 1 + static_cast<int>(rng() % 8);
    std::vector<double> loads(n);
    for (double &l : loads)
      l = load(rng);
    double maxLoad = *std::max_element(loads.begin(), loads.end());
    double period = maxLoad + load(rng);
    std::vector<int> g = oneFOneBStarGroups(loads, period);
    EXPECT_EQ(g.back(), 1);
    for (int i = 0; i + 1 < n; ++i) { // contiguous runs, counting back
      EXPECT_TRUE(g[i] == g[i + 1] || g[i] == g[i + 1] + 1);
    }
    for (int grp = 1; grp <= g.front(); ++grp) {
      double sum = 0;
      int first = n;
      for (int i = 0; i < n; ++i)
        if (g[i] == grp) {
          sum += loads[i];
          first = std::min(first, i);
        }
      EXPECT_LE(sum, period * (1 + 1e-9));
      if (first > 0) { // maximal: the next earlier stage would not fit
        EXPECT_GT(sum + loads[first - 1], period);
      }
    }
    // Fewer (or as many) groups with a larger period.
    std::vector<int> g2 = oneFOneBStarGroups(loads, period * 1.5);
    EXPECT_LE(g2.front(), g.front());
  }
}

/// Unrolls a 1F1B* pattern over many batches, checks the chain
/// dependencies and the one-op-at-a-time resources, and returns each
/// item's peak number of active batches (forward started, backward not
/// finished).
std::vector<int> unrollPattern(const std::vector<double> &fwd,
                               const std::vector<double> &bwd, double period,
                               const std::vector<OneFOneBStarItem> &items) {
  const int n = static_cast<int>(fwd.size());
  const int batches = 40;
  const double eps = 1e-9;
  auto fStart = [&](int i, int b) {
    return (b + items[i].forwardShift) * period + items[i].forwardStart;
  };
  auto bStart = [&](int i, int b) {
    return (b + items[i].backwardShift) * period + items[i].backwardStart;
  };
  for (int i = 0; i < n; ++i) {
    EXPECT_GE(items[i].forwardStart, 0);
    EXPECT_LT(items[i].forwardStart, period);
    EXPECT_GE(items[i].backwardStart, 0);
    EXPECT_LT(items[i].backwardStart, period);
    // Forward and backward of one resource do not overlap modulo T.
    double f0 = items[i].forwardStart, b0 = items[i].backwardStart;
    for (int shift = -1; shift <= 1; ++shift) {
      double b = b0 + shift * period;
      EXPECT_TRUE(b + bwd[i] <= f0 + eps || f0 + fwd[i] <= b + eps)
          << "item " << i << " overlaps itself";
    }
    for (int b = 0; b < batches; ++b) {
      EXPECT_LE(fStart(i, b) + fwd[i], bStart(i, b) + eps)
          << "F before B, item " << i;
      if (i + 1 < n) {
        EXPECT_LE(fStart(i, b) + fwd[i], fStart(i + 1, b) + eps)
            << "F chain, item " << i;
        EXPECT_LE(bStart(i + 1, b) + bwd[i + 1], bStart(i, b) + eps)
            << "B chain, item " << i;
      }
    }
  }
  EXPECT_EQ(items[0].forwardShift, 0);
  std::vector<int> active(n, 0);
  for (int i = 0; i < n; ++i)
    for (int b = batches / 4; b < 3 * batches / 4; ++b) {
      double t = fStart(i, b);
      int count = 0;
      for (int c = 0; c < batches; ++c)
        if (fStart(i, c) <= t + eps && bStart(i, c) + bwd[i] > t + eps)
          ++count;
      active[i] = std::max(active[i], count);
    }
  return active;
}

TEST(MadPipePattern, TwoStagesDigest) {
  // U_F = U_B = 1, T = 2: F_s1 (0, 0), B_s1 (1, 1), F_s2 (1, 0), B_s2 (0, 1).
  std::vector<OneFOneBStarItem> items = oneFOneBStarPattern({1, 1}, {1, 1}, 2);
  ASSERT_EQ(items.size(), 2u);
  EXPECT_DOUBLE_EQ(items[0].forwardStart, 0);
  EXPECT_EQ(items[0].forwardShift, 0);
  EXPECT_DOUBLE_EQ(items[0].backwardStart, 1);
  EXPECT_EQ(items[0].backwardShift, 1);
  EXPECT_DOUBLE_EQ(items[1].forwardStart, 1);
  EXPECT_EQ(items[1].forwardShift, 0);
  EXPECT_DOUBLE_EQ(items[1].backwardStart, 0);
  EXPECT_EQ(items[1].backwardShift, 1);
  EXPECT_EQ(unrollPattern({1, 1}, {1, 1}, 2, items), (std::vector<int>{2, 1}));
}

TEST(MadPipePattern, SimulatedActivationsEqualGroups) {
  // (3, 2, 2, 1) with U_F = U_B at T = 4 and 5, then random chains.
  std::vector<double> half = {1.5, 1, 1, 0.5};
  for (double period : {4.0, 5.0}) {
    auto items = oneFOneBStarPattern(half, half, period);
    ASSERT_EQ(items.size(), 4u);
    std::vector<int> groups = oneFOneBStarGroups({3, 2, 2, 1}, period);
    EXPECT_EQ(unrollPattern(half, half, period, items), groups);
  }
  // The 2P - 1 chain: 5 active batches on the first GPU.
  const double eps = 0.01;
  std::vector<double> f = {1, eps / 2, 1, eps / 2, 1};
  auto items = oneFOneBStarPattern(f, f, 2);
  ASSERT_EQ(items.size(), 5u);
  EXPECT_EQ(unrollPattern(f, f, 2, items), (std::vector<int>{5, 4, 3, 2, 1}));

  std::mt19937 rng(3);
  std::uniform_int_distribution<int> tick(1, 6);
  for (int it = 0; it < 100; ++it) {
    int n = 1 + static_cast<int>(rng() % 6);
    std::vector<double> fw(n), bw(n);
    double maxLoad = 0;
    for (int i = 0; i < n; ++i) {
      fw[i] = tick(rng) * 0.25;
      bw[i] = tick(rng) * 0.25;
      maxLoad = std::max(maxLoad, fw[i] + bw[i]);
    }
    double period = maxLoad + tick(rng) * 0.5;
    auto pattern = oneFOneBStarPattern(fw, bw, period);
    ASSERT_EQ(static_cast<int>(pattern.size()), n);
    std::vector<double> loads(n);
    for (int i = 0; i < n; ++i)
      loads[i] = fw[i] + bw[i];
    std::vector<int> active = unrollPattern(fw, bw, period, pattern);
    EXPECT_EQ(active, oneFOneBStarGroups(loads, period));
    for (int i = 0; i + 1 < n; ++i) { // non-increasing along the chain
      EXPECT_GE(active[i], active[i + 1]);
    }
  }
  // Precondition: an item longer than T has no pattern.
  EXPECT_TRUE(oneFOneBStarPattern({2}, {2}, 3).empty());
}

//===----------------------------------------------------------------------===//
// Oracle: every allocation of MadPipe-DP's model, evaluated from the end.
//===----------------------------------------------------------------------===//

/// ⌈x/T⌉ with the model's 1e-9 tolerance.
double oracleCeil(double x, double t) {
  return x <= 0 ? 0 : std::ceil(x / t - 1e-9);
}

double oracleOplus(double x, double y, double t) {
  if (oracleCeil(x, t) == oracleCeil(x + y, t))
    return x + y;
  return t * oracleCeil(x, t) + y;
}

/// 𝓜(k, l, g) by direct sums, 0-based items first..last.
double oracleMemory(const MadPipeChain &c, int first, int last, int g) {
  double m = 0;
  for (int i = first; i <= last; ++i)
    m += c.weightFactor * c.weights[i] + g * c.stored[i];
  if (first > 0)
    m += 2 * c.cut[first - 1];
  if (last + 1 < c.size())
    m += 2 * c.cut[last];
  return m;
}

/// The smallest period over all allocations the DP may return: stages
/// labelled normal/special, at most P-1 normal ones; once the P-1 normal
/// processors are used (counting from the end), the remaining layers are
/// one special stage (the base case T(l, 0, ...)). V is capped at `vmax`
/// like the DP's grid.
double oracleBest(const MadPipeChain &c, double target, double vmax) {
  const int n = c.size();
  const int normals = c.processors - 1;
  double best = kInf;
  for (int mask = 0; mask < (1 << (n - 1)); ++mask) {
    std::vector<std::pair<int, int>> stages;
    int first = 0;
    for (int i = 0; i < n; ++i)
      if (i == n - 1 || (mask >> i & 1)) {
        stages.push_back({first, i});
        first = i + 1;
      }
    const int numStages = static_cast<int>(stages.size());
    for (int labels = 0; labels < (1 << numStages); ++labels) {
      int p = normals;
      double V = 0, special = 0, specialMemory = 0, value = 0;
      bool valid = true;
      for (int s = numStages - 1; s >= 0 && valid; --s) {
        auto [k, l] = stages[s];
        bool isSpecial = labels >> s & 1;
        if (p == 0 && (s != 0 || !isSpecial)) {
          valid = false;
          break;
        }
        double u = 0;
        for (int i = k; i <= l; ++i)
          u += c.forward[i] + c.backward[i];
        double ck = k > 0 ? c.comm[k - 1] : 0;
        int g = std::max(1, static_cast<int>(oracleCeil(V + u, target)));
        if (!isSpecial) {
          double mem = oracleMemory(c, k, l, g);
          if (c.memory > 0 && mem > c.memory)
            valid = false;
          value = std::max({value, u, ck});
          --p;
        } else {
          specialMemory += oracleMemory(c, k, l, g - 1);
          if (c.memory > 0 && specialMemory > c.memory)
            valid = false;
          special += u;
          value = std::max(value, ck);
        }
        V = std::min(oracleOplus(oracleOplus(V, u, target), ck, target), vmax);
      }
      if (valid)
        best = std::min(best, std::max(value, special));
    }
  }
  return best;
}

/// A random integer chain; with `memory` the grids below are exact.
MadPipeChain randomChain(std::mt19937 &rng, int maxLayers, int maxP) {
  MadPipeChain c;
  int n = 1 + static_cast<int>(rng() % maxLayers);
  c.processors = 1 + static_cast<int>(rng() % maxP);
  auto pick = [&](int hi) { return static_cast<double>(rng() % (hi + 1)); };
  for (int i = 0; i < n; ++i) {
    c.forward.push_back(pick(2));
    c.backward.push_back(pick(3));
    c.weights.push_back(pick(3));
    c.stored.push_back(pick(3));
    c.cut.push_back(i + 1 < n ? pick(3) : 0);
    c.comm.push_back(i + 1 < n ? pick(2) : 0);
  }
  c.memory = rng() % 3 == 0 ? 0 : 6 + static_cast<double>(rng() % 30);
  return c;
}

/// Grids with one point per integer: the DP's rounding is then exact.
MadPipeGrid exactGrid(const MadPipeChain &c, double target, double &vmax) {
  double total = 0, sumC = 0;
  for (int i = 0; i < c.size(); ++i) {
    total += c.forward[i] + c.backward[i];
    if (i + 1 < c.size())
      sumC += c.comm[i];
  }
  vmax = 2 * (total + sumC) + target;
  MadPipeGrid grid;
  grid.period = static_cast<int>(total) + 1;
  grid.memory = static_cast<int>(c.memory) + 1;
  grid.delay = static_cast<int>(vmax) + 1;
  return grid;
}

TEST(MadPipeDP, EqualsBruteForceOfItsModel) {
  std::mt19937 rng(2024);
  int feasible = 0, infeasible = 0, withSpecial = 0;
  for (int it = 0; it < 3000; ++it) {
    MadPipeChain c = randomChain(rng, 6, 4);
    double total = 0, sumC = 0;
    for (int i = 0; i < c.size(); ++i) {
      total += c.forward[i] + c.backward[i];
      if (i + 1 < c.size())
        sumC += c.comm[i];
    }
    double target =
        1 + static_cast<double>(rng() %
                                static_cast<int>(std::max(1.0, total + sumC)));
    double vmax = 0;
    MadPipeGrid grid = exactGrid(c, target, vmax);
    double expected = oracleBest(c, target, vmax);
    MadPipeAllocation a = madPipeDP(c, target, grid);
    SCOPED_TRACE("instance " + std::to_string(it));
    if (expected == kInf) {
      EXPECT_FALSE(a.feasible);
      ++infeasible;
      continue;
    }
    ++feasible;
    ASSERT_TRUE(a.feasible);
    EXPECT_DOUBLE_EQ(a.value, expected);
    // The backtracked allocation: covers the chain in order, at most P-1
    // normal stages, memory within M, and its recomputed period is the DP
    // value (exact grids).
    ASSERT_FALSE(a.stages.empty());
    EXPECT_EQ(a.stages.front().first, 0);
    EXPECT_EQ(a.stages.back().last, c.size() - 1);
    int normals = 0;
    double specialMemory = 0;
    for (size_t s = 0; s < a.stages.size(); ++s) {
      const MadPipeStage &st = a.stages[s];
      EXPECT_LE(st.first, st.last);
      if (s > 0) {
        EXPECT_EQ(st.first, a.stages[s - 1].last + 1);
      }
      if (st.special) {
        specialMemory += st.memoryBytes;
      } else {
        ++normals;
        if (c.memory > 0) {
          EXPECT_LE(st.memoryBytes, c.memory);
        }
      }
      EXPECT_DOUBLE_EQ(st.memoryBytes,
                       oracleMemory(c, st.first, st.last,
                                    st.activations - (st.special ? 1 : 0)));
    }
    if (normals < static_cast<int>(a.stages.size()))
      ++withSpecial;
    EXPECT_LE(normals, c.processors - 1);
    if (c.memory > 0) {
      EXPECT_LE(specialMemory, c.memory);
    }
    EXPECT_DOUBLE_EQ(a.period, a.value);
    // The period is at least U(1,L)/P and the largest layer.
    EXPECT_GE(a.value * (1 + 1e-12), total / c.processors);
  }
  EXPECT_GT(feasible, 1000);
  EXPECT_GT(infeasible, 100);
  EXPECT_GT(withSpecial, 400);
}

TEST(MadPipeDP, SpecialProcessorBeatsContiguous) {
  // madpipe.md §4: loads (2, 4, 2) on P = 2, no communication, unlimited
  // memory: the best contiguous period is 6; MadPipe puts layers 1 and 3 on
  // the special processor and layer 2 on the normal one, period 4.
  MadPipeChain c;
  c.forward = {1, 2, 1};
  c.backward = {1, 2, 1};
  c.weights = c.stored = c.cut = c.comm = {0, 0, 0};
  c.processors = 2;
  MadPipeAllocation a = madPipeDP(c, 4);
  ASSERT_TRUE(a.feasible);
  EXPECT_DOUBLE_EQ(a.value, 4);
  ASSERT_EQ(a.stages.size(), 3u);
  EXPECT_TRUE(a.stages[0].special);
  EXPECT_FALSE(a.stages[1].special);
  EXPECT_TRUE(a.stages[2].special);
  // M = ∞: the result does not depend on T̂ (§6.3, 12).
  for (double target : {2.0, 3.0, 5.0, 8.0}) {
    EXPECT_DOUBLE_EQ(madPipeDP(c, target).value, 4);
  }
  // The contiguous variant cannot beat it (§6.3, 17).
  c.contiguous = true;
  MadPipeAllocation contiguous = madPipeDP(c, 4);
  ASSERT_TRUE(contiguous.feasible);
  EXPECT_DOUBLE_EQ(contiguous.value, 6);
  for (const MadPipeStage &s : contiguous.stages) {
    EXPECT_FALSE(s.special);
  }
}

TEST(MadPipeDP, ContiguousNeverBetter) {
  std::mt19937 rng(99);
  for (int it = 0; it < 200; ++it) {
    MadPipeChain c = randomChain(rng, 6, 4);
    c.memory = 0; // the variants differ in memory accounting, not here
    double target = 1 + static_cast<double>(rng() % 10);
    MadPipeAllocation full = madPipeDP(c, target);
    c.contiguous = true;
    MadPipeAllocation contiguous = madPipeDP(c, target);
    ASSERT_TRUE(full.feasible);
    if (contiguous.feasible) {
      EXPECT_LE(full.value, contiguous.value + 1e-9);
    }
  }
}

TEST(MadPipeDP, SingleProcessorIsTheBaseCase) {
  // P = 1 (§6.3, 11): T(L, 0, 0, 0, 0) = U(1,L) iff 𝓜(1, L, g - 1) <= M.
  MadPipeChain c;
  c.forward = {1, 1, 1};
  c.backward = {2, 2, 2};
  c.weights = {1, 1, 1};
  c.stored = {4, 4, 4};
  c.cut = {1, 1, 0};
  c.comm = {0, 0, 0};
  c.processors = 1;
  // T̂ = 3: g = ⌈9/3⌉ = 3, the special processor is charged g - 1 = 2:
  // 3·3 + 2·12 = 33 bytes.
  EXPECT_DOUBLE_EQ(madPipeStageMemory(c, 0, 2, 2), 33);
  c.memory = 33;
  MadPipeAllocation a = madPipeDP(c, 3);
  ASSERT_TRUE(a.feasible);
  EXPECT_DOUBLE_EQ(a.value, 9);
  ASSERT_EQ(a.stages.size(), 1u);
  EXPECT_TRUE(a.stages[0].special);
  EXPECT_EQ(a.stages[0].activations, 3);
  c.memory = 32;
  EXPECT_FALSE(madPipeDP(c, 3).feasible);
}

TEST(MadPipeDP, StageMemoryFormula) {
  // 𝓜(k,l,g) = Σ (3W_i + g·a_{i-1}) + 2(a_{k-1} + a_l), buffers dropped at
  // the chain's ends, g·a_0 kept for the first stage.
  MadPipeChain c;
  c.forward = c.backward = {1, 1, 1, 1};
  c.weights = {10, 20, 30, 40};
  c.stored = {1, 2, 3, 4};
  c.cut = {5, 6, 7, 0};
  c.comm = {0, 0, 0, 0};
  EXPECT_DOUBLE_EQ(madPipeStageMemory(c, 1, 2, 2),
                   3 * 50 + 2 * 5 + 2 * (5 + 7));
  EXPECT_DOUBLE_EQ(madPipeStageMemory(c, 0, 1, 3), 3 * 30 + 3 * 3 + 2 * 6);
  EXPECT_DOUBLE_EQ(madPipeStageMemory(c, 3, 3, 1), 3 * 40 + 4 + 2 * 7);
  for (int g = 0; g < 5; ++g) { // non-decreasing in g
    EXPECT_LE(madPipeStageMemory(c, 1, 3, g),
              madPipeStageMemory(c, 1, 3, g + 1));
  }
  // Recompute: g copies of the stage input and one microbatch of the rest.
  c.recompute = true;
  EXPECT_DOUBLE_EQ(madPipeStageMemory(c, 1, 2, 2),
                   3 * 50 + 2 * 5 + 5 + 2 * (5 + 7));
}

//===----------------------------------------------------------------------===//
// Algorithm 1 (madpipe.md §3.3, §6.4)
//===----------------------------------------------------------------------===//

TEST(MadPipeSearch, Invariants) {
  std::mt19937 rng(5);
  for (int it = 0; it < 150; ++it) {
    MadPipeChain c = randomChain(rng, 6, 4);
    double total = 0, sumC = 0;
    for (int i = 0; i < c.size(); ++i) {
      total += c.forward[i] + c.backward[i];
      if (i + 1 < c.size())
        sumC += c.comm[i];
    }
    if (total <= 0)
      continue;
    MadPipeSearch s = madPipeSearch(c, {}, 10);
    ASSERT_GE(s.steps.size(), 10u);
    EXPECT_DOUBLE_EQ(s.steps[0].target, total / c.processors); // T̂_1 = lb
    double bestTilde = kInf;
    for (size_t i = 0; i < s.steps.size(); ++i) {
      const MadPipeStep &step = s.steps[i];
      EXPECT_GE(step.tilde, std::max(step.value, step.target));
      EXPECT_LE(step.upperBound, total + sumC + 1e-9);
      if (i + 1 < 10) { // the K regular steps (an 11th may run at ub)
        EXPECT_DOUBLE_EQ(s.steps[i + 1].target,
                         0.5 * (step.lowerBound + step.upperBound));
      }
      if (s.allocations[i].feasible)
        bestTilde = std::min(bestTilde, step.tilde);
    }
    if (s.best >= 0) {
      EXPECT_DOUBLE_EQ(s.steps[s.best].tilde, bestTilde);
      EXPECT_LE(bestTilde, total + sumC + 1e-9);
    } else {
      EXPECT_EQ(bestTilde, kInf);
    }
  }
}

TEST(MadPipeSearch, LargerTargetNeedsLessMemory) {
  // Two layers with heavy activations on two processors, contiguous: at
  // T̂ = U/P = 2 the first stage keeps two activations and does not fit;
  // only T̂ = ub = 4 lets every stage keep one.
  MadPipeChain c;
  c.forward = {1, 1};
  c.backward = {1, 1};
  c.weights = {0, 0};
  c.stored = {10, 10};
  c.cut = {0, 0};
  c.comm = {0, 0};
  c.processors = 2;
  c.memory = 15;
  c.contiguous = true;
  EXPECT_FALSE(madPipeDP(c, 2).feasible);
  EXPECT_FALSE(madPipeDP(c, 3.9).feasible);
  // Exact grids (V_max = 2·4 + 4 = 12): the default 51-point V grid would
  // round V = 2 up to 2.16 and charge the first stage two activations.
  MadPipeGrid grid;
  grid.period = 5;
  grid.memory = 16;
  grid.delay = 13;
  MadPipeSearch s = madPipeSearch(c, grid, 10);
  ASSERT_GE(s.best, 0);
  EXPECT_DOUBLE_EQ(s.steps[s.best].target, 4);
  EXPECT_DOUBLE_EQ(s.steps[s.best].tilde, 4);
  // The special processor's g - 1 under-estimate (§2.4) admits T̂ = 2.
  c.contiguous = false;
  MadPipeAllocation a = madPipeDP(c, 2);
  ASSERT_TRUE(a.feasible);
  EXPECT_DOUBLE_EQ(a.value, 2);
  EXPECT_TRUE(a.stages[0].special);
  EXPECT_EQ(a.stages[0].activations, 2);
}

//===----------------------------------------------------------------------===//
// The planner
//===----------------------------------------------------------------------===//

Profile chainProfile(const std::vector<double> &fwd, int64_t paramBytes,
                     int64_t outBytes, int64_t savedBytes) {
  Profile p;
  p.microbatch = 1;
  for (size_t i = 0; i < fwd.size(); ++i) {
    ProfileOp op;
    op.name = "l" + std::to_string(i);
    op.op = "Gemm";
    op.fwdSeconds = fwd[i];
    op.bwdSeconds = 2 * fwd[i];
    op.paramBytes = paramBytes;
    op.outBytes = outBytes;
    op.savedBytes = savedBytes;
    p.ops.push_back(op);
  }
  return p;
}

std::set<int> usedDevices(const Plan &plan) {
  std::set<int> devices;
  for (const StagePlan &s : plan.stages)
    devices.insert(s.devices.begin(), s.devices.end());
  return devices;
}

TEST(MadPipePlanner, RandomProfilesGiveValidSimulatedPlans) {
  std::mt19937 rng(17);
  std::uniform_real_distribution<double> time(1e-3, 5e-3);
  int planned = 0;
  for (int it = 0; it < 40; ++it) {
    int layers = 2 + static_cast<int>(rng() % 9);
    std::vector<double> fwd(layers);
    for (double &f : fwd)
      f = time(rng);
    Profile profile = chainProfile(fwd, 1 << 20, 1 << 16, 1 << 18);
    int devices = 1 + static_cast<int>(rng() % 4);
    int64_t memory = rng() % 2 ? 0 : (int64_t(1) << 20) * (4 + rng() % 12);
    Topology topology = Topology::flat(devices, 1e10, 1e-6, memory);
    PlannerOptions options;
    PlanResult r = planMadPipe(profile, topology, options);
    if (!r.ok) {
      EXPECT_NE(r.error.find("madpipe"), std::string::npos) << r.error;
      EXPECT_GT(memory, 0) << r.error; // unlimited memory always plans
      continue;
    }
    ++planned;
    const Plan &plan = r.plan;
    EXPECT_EQ(validatePlan(plan, layers), "");
    EXPECT_EQ(plan.algorithm, "madpipe");
    EXPECT_EQ(plan.schedule, "1f1b");
    EXPECT_LE(static_cast<int>(usedDevices(plan).size()), devices);
    EXPECT_GT(plan.predicted.iterationSeconds, 0);
    EXPECT_EQ(plan.predicted.stageMemoryBytes.size(), plan.stages.size());
    SimResult sim = simulatePlan(profile, topology, plan, options.sim);
    ASSERT_TRUE(sim.ok) << sim.error;
    EXPECT_TRUE(sim.fitsMemory);
  }
  EXPECT_GT(planned, 20);
}

TEST(MadPipePlanner, MemoryTooSmallSaysWhatTheBestNeeds) {
  Profile profile = chainProfile({1e-3, 1e-3, 1e-3, 1e-3}, 1 << 20, 1024, 1024);
  Topology topology = Topology::flat(2, 1e10, 1e-6, 1 << 20);
  PlanResult r = planMadPipe(profile, topology, {});
  ASSERT_FALSE(r.ok);
  EXPECT_NE(r.error.find("needs"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("MiB"), std::string::npos) << r.error;
}

TEST(MadPipePlanner, BadInput) {
  Profile profile = chainProfile({1e-3, 1e-3}, 0, 0, 0);
  Topology topology = Topology::flat(2, 1e10, 1e-6);
  PlannerOptions options;
  options.schedule = "gpipe";
  EXPECT_FALSE(planMadPipe(profile, topology, options).ok);
  options = {};
  options.stages = 3; // more processors than devices and layers
  EXPECT_FALSE(planMadPipe(profile, topology, options).ok);
  Profile empty;
  EXPECT_FALSE(planMadPipe(empty, topology, {}).ok);
  Profile negative = profile;
  negative.ops[1].fwdSeconds = -1;
  PlanResult r = planMadPipe(negative, topology, {});
  ASSERT_FALSE(r.ok);
  EXPECT_NE(r.error.find("negative"), std::string::npos);
}

TEST(MadPipePlanner, LargeChainStaysWithinBudget) {
  // 300 layers on 64 devices with a memory limit: the state space is
  // coarsened (blocks of layers, coarser grids) and the plan still covers
  // every layer.
  std::vector<double> fwd(300, 1e-3);
  for (int i = 0; i < 300; i += 7)
    fwd[i] = 3e-3;
  Profile profile = chainProfile(fwd, 1 << 20, 1 << 16, 1 << 18);
  Topology topology = Topology::flat(64, 1e10, 1e-6, int64_t(1) << 32);
  PlanResult r = planMadPipe(profile, topology, {});
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(validatePlan(r.plan, 300), "");
  EXPECT_LE(static_cast<int>(usedDevices(r.plan).size()), 64);
}

} // namespace
