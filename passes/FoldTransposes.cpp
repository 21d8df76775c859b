//===- FoldTransposes.cpp - transposed operands of matrix products -------===//
//
// Part of pipec. Implements --nn-fold-transposes (Passes.td).
//
//===----------------------------------------------------------------------===//
///
/// \file
/// For every nn.matmul, an operand defined by an nn.transpose whose
/// permutation is the identity but for the last two dimensions is replaced
/// by the transpose's input and the operand's trans flag is toggled (a
/// flag already set means the two transposes cancel; chains peel one
/// transpose at a time). The batch dimensions
/// are untouched, so broadcasting and the kernel's batch strides stay the
/// same. Transposes left without users are erased. The result is the same
/// matrix product: on the CPU OpenBLAS and on the GPU cuBLAS read the
/// operand through the transpose flag of their GEMM.
///
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"

#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/SetVector.h"

namespace pipec {
#define GEN_PASS_DEF_NNFOLDTRANSPOSESPASS
#include "passes/Passes.h.inc"
} // namespace pipec

using namespace mlir;

namespace {

/// The input of `v`'s defining transpose when it swaps only the last two
/// dimensions; null otherwise.
Value lastTwoSwapped(Value v) {
  auto t = v.getDefiningOp<pipec::nn::TransposeOp>();
  if (!t)
    return {};
  ArrayRef<int64_t> perm = t.getPerm();
  const int64_t rank = int64_t(perm.size());
  if (rank < 2 || perm[rank - 1] != rank - 2 || perm[rank - 2] != rank - 1)
    return {};
  for (int64_t i = 0; i + 2 < rank; ++i)
    if (perm[i] != i)
      return {};
  return t.getInput();
}

struct NNFoldTransposesPass
    : public pipec::impl::NNFoldTransposesPassBase<NNFoldTransposesPass> {
  using Base::Base;

  void runOnOperation() override {
    llvm::SetVector<Operation *> maybeDead;
    // Reads `operand` past its chain of such transposes (one peeled at a
    // time, two cancel); returns whether it is now read transposed.
    auto peel = [&](OpOperand &operand, bool trans) {
      while (Value in = lastTwoSwapped(operand.get())) {
        maybeDead.insert(operand.get().getDefiningOp());
        operand.set(in);
        trans = !trans;
      }
      return trans;
    };
    // Then an operand that a transpose keeping the innermost dimension in
    // one of the last two places produced (attention's [B, S, H, D] ->
    // [B, H, S, D] heads, and [B, S, H, D] -> [B, H, D, S] keys) is read
    // through a permutation instead (perm_a / perm_b): the matrix rows
    // stay contiguous, the kernel steps over them by strides. A transpose
    // putting it second to last is the one that keeps it last with the
    // last two swapped: the trans flag toggles.
    auto view = [&](OpOperand &operand, bool trans,
                    std::optional<ArrayRef<int64_t>> have,
                    SmallVectorImpl<int64_t> &perm) {
      auto t = operand.get().getDefiningOp<pipec::nn::TransposeOp>();
      if (!t || have)
        return trans;
      ArrayRef<int64_t> p = t.getPerm();
      const int64_t rank = int64_t(p.size());
      if (rank < 2)
        return trans;
      perm.assign(p.begin(), p.end());
      if (p[rank - 2] == rank - 1) {
        std::swap(perm[rank - 2], perm[rank - 1]);
        trans = !trans;
      } else if (p[rank - 1] != rank - 1) {
        perm.clear();
        return trans;
      }
      maybeDead.insert(t);
      operand.set(t.getInput());
      return trans;
    };
    getOperation().walk([&](pipec::nn::MatMulOp mm) {
      Builder b(mm.getContext());
      if (bool ta = peel(mm.getAMutable(), mm.getTransA());
          ta != mm.getTransA())
        mm.setTransA(ta);
      if (bool tb = peel(mm.getBMutable(), mm.getTransB());
          tb != mm.getTransB())
        mm.setTransB(tb);
      SmallVector<int64_t> perm;
      if (bool ta = view(mm.getAMutable(), mm.getTransA(), mm.getPermA(), perm);
          !perm.empty()) {
        mm.setTransA(ta);
        mm.setPermAAttr(b.getDenseI64ArrayAttr(perm));
      }
      perm.clear();
      if (bool tb = view(mm.getBMutable(), mm.getTransB(), mm.getPermB(), perm);
          !perm.empty()) {
        mm.setTransB(tb);
        mm.setPermBAttr(b.getDenseI64ArrayAttr(perm));
      }
    });
    // Until none is left to erase: a transpose of a transpose dies only
    // after its reader.
    SmallVector<Operation *> pending(maybeDead.begin(), maybeDead.end());
    for (bool erased = true; erased;) {
      erased = false;
      for (Operation *&op : pending)
        if (op && op->use_empty()) {
          op->erase();
          op = nullptr;
          erased = true;
        }
    }
  }
};

} // namespace
