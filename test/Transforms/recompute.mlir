// Activation recomputation after autodiff. Stage 1 of the tiny MLP is
// relu -> gemm -> loss; without recomputation its forward also returns the
// relu output (the gemm's input, for the weight gradient) and the logits
// (for the loss gradient), stashed per microbatch.
//
// RUN: pipec-opt %S/Inputs/differentiated.mlir --pipe-recompute=mode=full | FileCheck %s --check-prefix=FULL
// Full: the forward returns its loss only; the backward re-runs relu and
// gemm on the stashed input (no global write repeated, no cost attributes).
// FULL: func.func @s0_fwd({{.*}}) -> tensor<4x5xf32> attributes {pipe.recompute_saved = []
// FULL: func.func @s1_fwd({{.*}}) -> (tensor<f32> {pipe.loss}) attributes {pipe.recompute = "full", pipe.recompute_saved = [tensor<4x3xf32>, tensor<4x5xf32>]
// FULL: func.func @s1_bwd(%[[SEED:.*]]: tensor<f32> {pipe.loss_seed}, %[[LABELS:.*]]: tensor<4xi64> {pipe.fwd_arg = 1 : i64}, %[[IN:.*]]: tensor<4x5xf32> {pipe.fwd_arg = 0 : i64}) -> (tensor<4x5xf32> {pipe.grad_of_arg = 0 : i64})
// FULL-NEXT:   %[[R:.*]] = nn.relu %[[IN]] : tensor<4x5xf32>
// FULL:        %[[LOGITS:.*]] = nn.gemm %[[R]], {{.*}}trans_b = true
// FULL-NOT:    nn.cost
// FULL:        nn.softmax_cross_entropy_loss_grad %[[LOGITS]], %[[LABELS]], %[[SEED]]
// FULL-NOT:    nn.softmax_cross_entropy_loss %
// FULL:        return

// RUN: pipec-opt %S/Inputs/differentiated.mlir --pipe-recompute=mode=selective | FileCheck %s --check-prefix=SEL
// Selective: the gemm's output (the logits) stays stashed; the relu output
// is recomputed from the stage input.
// SEL: func.func @s1_fwd({{.*}}) -> (tensor<f32> {pipe.loss}, tensor<4x3xf32> {pipe.saved}) attributes {pipe.recompute = "selective"
// SEL: return %loss, %1
// SEL: func.func @s1_bwd(%[[SEED:.*]]: tensor<f32> {pipe.loss_seed}, %[[LABELS:.*]]: tensor<4xi64> {pipe.fwd_arg = 1 : i64}, %[[IN:.*]]: tensor<4x5xf32> {pipe.fwd_arg = 0 : i64}, %[[LOGITS:.*]]: tensor<4x3xf32> {pipe.fwd_result = 1 : i64})
// SEL-NEXT:   nn.relu %[[IN]]
// SEL-NEXT:   nn.softmax_cross_entropy_loss_grad %[[LOGITS]], %[[LABELS]], %[[SEED]]

// Per stage: stage 0 none, stage 1 full.
// RUN: pipec-opt %S/Inputs/differentiated.mlir --pipe-recompute=mode=none,full | FileCheck %s --check-prefix=PER
// PER: func.func @s1_fwd({{.*}}) -> (tensor<f32> {pipe.loss}) attributes {pipe.recompute = "full"

// The arena report says what the slots would hold without it.
// RUN: pipec-opt %S/Inputs/differentiated.mlir --pipe-recompute=mode=full --pipe-build-schedule=microbatches=4 --pipe-verify-schedule --pipe-plan-memory=report 2>&1 | FileCheck %s --check-prefix=MEM
// MEM: remark: rank0 (stage 0): arena {{[0-9]+}} bytes = weights {{.*}}scratch {{[0-9]+$}}
// MEM: remark: rank1 (stage 1): arena {{[0-9]+}} bytes = weights 256 + 1 slots x 256 + io 256 + scratch {{[0-9]+}}; recompute full: without it 1 slots x 384 (128 bytes more, before the backward's larger scratch)

// Then zero bubble splits the recomputing backward; values the weight half
// needs are carried.
// RUN: pipec-opt %S/Inputs/differentiated.mlir --pipe-recompute=mode=full --pipe-build-schedule="schedule=zb-h1 microbatches=2" --pipe-verify-schedule | FileCheck %s --check-prefix=ZB
// ZB: func.func @s1_bwdw(

// RUN: not pipec-opt %S/Inputs/differentiated.mlir --pipe-recompute=mode=bogus 2>&1 | FileCheck %s --check-prefix=BAD
// BAD: error: unknown recomputation mode 'bogus' for stage 0 (none, full, selective)
// RUN: not pipec-opt %S/Inputs/differentiated.mlir --pipe-recompute=mode=full,full,full 2>&1 | FileCheck %s --check-prefix=COUNT
// COUNT: error: mode lists 3 modes for 2 stages (give one for every stage, or one per stage)
// RUN: not pipec-opt %S/Inputs/differentiated.mlir --pipe-build-schedule="schedule=zb-h1 microbatches=2" --pipe-recompute=mode=full 2>&1 | FileCheck %s --check-prefix=SPLIT
// SPLIT: error: recomputation runs before the backward is split (zb-h1 splits it in --pipe-build-schedule)
// RUN: not pipec-opt %S/Inputs/tiny_mlp.mlir --pipe-recompute=mode=full 2>&1 | FileCheck %s --check-prefix=NOSTAGES
// NOSTAGES: error: expected @sK_fwd and @sK_bwd for every stage; run --pipe-split-stages and --nn-autodiff first
