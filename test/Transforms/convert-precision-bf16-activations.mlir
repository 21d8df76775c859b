// RUN: pipec-opt %s --nn-convert-precision="precision=bf16 activations=bf16-casts" | FileCheck %s
// RUN: pipec-opt %s --nn-convert-precision="precision=bf16 activations=bf16" | FileCheck %s --check-prefix=KERN
// RUN: not pipec-opt %s --nn-convert-precision="precision=f32 activations=bf16" 2>&1 | FileCheck %s --check-prefix=BAD
// RUN: not pipec-opt %s --nn-convert-precision="precision=bf16 activations=f16" 2>&1 | FileCheck %s --check-prefix=BAD

// --activations bf16-casts (the reference form): every float tensor an op
// produces is rounded to bf16 by a cast after it and widened before each
// reader; weights, the
// weight gradient's partial sum, batch-norm statistics and running
// statistics, feeds and the loss stay f32. Boundaries follow their values:
// the message and its gradient, the stash, the pipeline's send/recv.

// CHECK: module attributes {pipec.activations = "bf16-casts", pipec.precision = "bf16"}
// CHECK-LABEL: func.func @s0_fwd
// CHECK-SAME: (%[[X:.*]]: tensor<2x4xf32> {pipe.feed = 0 : i64}) -> (tensor<2x4xbf16>, tensor<2x4xbf16> {pipe.saved})
// A view of a weight is a weight: f32, no casts.
// CHECK: ml_program.global_load @w : tensor<4x4xf32>
// CHECK-NEXT: nn.reshape %{{.*}} : tensor<4x4xf32> -> tensor<16xf32>
// CHECK-NEXT: %[[W:.*]] = nn.reshape %{{.*}} : tensor<16xf32> -> tensor<4x4xf32>
// CHECK-NEXT: %[[Y:.*]] = nn.gemm %[[X]], %[[W]]
// CHECK-NEXT: %[[YB:.*]] = nn.cast %[[Y]] : tensor<2x4xf32> -> tensor<2x4xbf16>
// CHECK-NEXT: %[[YW:.*]] = nn.cast %[[YB]] : tensor<2x4xbf16> -> tensor<2x4xf32>
// CHECK-NEXT: %[[R:.*]] = nn.relu %[[YW]]
// CHECK-NEXT: %[[RB:.*]] = nn.cast %[[R]] : tensor<2x4xf32> -> tensor<2x4xbf16>
// A view of a bf16 value is one (it moves bytes: no casts).
// CHECK-NEXT: %[[V:.*]] = nn.reshape %[[RB]] : tensor<2x4xbf16> -> tensor<8xbf16>
// CHECK-NEXT: %[[VV:.*]] = nn.reshape %[[V]] : tensor<8xbf16> -> tensor<2x4xbf16>
// CHECK-NEXT: %[[ID:.*]] = nn.identity %[[VV]] : tensor<2x4xbf16>
// CHECK-NEXT: return %[[ID]], %[[YB]]

// The two partial sums of one weight's gradient (one through a
// transpose) and the bias gradient through its views stay f32, however far
// from the accumulation; the activation gradient their products read is
// stored in bf16 (even in the first layer, which needs no input gradient).
// CHECK-LABEL: func.func @s0_bwd
// CHECK-SAME: (%[[G:.*]]: tensor<2x4xbf16> {pipe.grad_from = array<i64: 1, 0>}, %[[SY:.*]]: tensor<2x4xbf16> {pipe.fwd_result = 1 : i64}, %[[SX:.*]]: tensor<2x4xf32> {pipe.fwd_arg = 0 : i64})
// CHECK-DAG: nn.cast %[[SY]] : tensor<2x4xbf16> -> tensor<2x4xf32>
// CHECK-DAG: nn.cast %[[G]] : tensor<2x4xbf16> -> tensor<2x4xf32>
// CHECK: %[[D0:.*]] = nn.relu_grad
// CHECK-NEXT: %[[DB:.*]] = nn.cast %[[D0]] : tensor<2x4xf32> -> tensor<2x4xbf16>
// CHECK-NEXT: %[[D:.*]] = nn.cast %[[DB]] : tensor<2x4xbf16> -> tensor<2x4xf32>
// CHECK-NEXT: %[[P:.*]] = nn.gemm %[[D]], %[[SX]] {{.*}} -> tensor<4x4xf32>
// CHECK-NEXT: %[[DX:.*]] = nn.cast %[[DB]] : tensor<2x4xbf16> -> tensor<2x4xf32>
// CHECK-NEXT: %[[P2:.*]] = nn.gemm %[[SX]], %[[DX]] {{.*}} -> tensor<4x4xf32>
// CHECK-NEXT: %[[P2T:.*]] = nn.transpose %[[P2]] {{.*}} -> tensor<4x4xf32>
// CHECK-NEXT: %[[TWO:.*]] = nn.add %[[P]], %[[P2T]] : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<4x4xf32>
// CHECK-NEXT: ml_program.global_load @w.grad
// CHECK-NEXT: %[[S:.*]] = nn.add {{.*}}, %[[TWO]] : tensor<4x4xf32>
// CHECK-NEXT: ml_program.global_store @w.grad = %[[S]] : tensor<4x4xf32>
// CHECK-NEXT: %[[DS:.*]] = nn.cast %[[DB]] : tensor<2x4xbf16> -> tensor<2x4xf32>
// CHECK-NEXT: nn.sum_to_shape %[[DS]] : tensor<2x4xf32> -> tensor<4xf32>
// CHECK-NEXT: nn.reshape %{{.*}} : tensor<4xf32> -> tensor<1x4xf32>
// CHECK-NEXT: nn.reshape %{{.*}} : tensor<1x4xf32> -> tensor<4xf32>
// CHECK-NEXT: ml_program.global_load @bias.grad
// CHECK-NEXT: nn.add {{.*}} : tensor<4xf32>, tensor<4xf32> -> tensor<4xf32>
// CHECK-NEXT: ml_program.global_store @bias.grad

// Batch norm: the output is stored in bf16; its statistics (stashed) and
// the running statistics stay f32. The loss is f32.
// CHECK-LABEL: func.func @s1_fwd
// CHECK-SAME: (%[[A:.*]]: tensor<2x4xbf16> {pipe.from = array<i64: 0, 0>}, %{{.*}}: tensor<2xi64> {pipe.feed = -1 : i64}) -> (tensor<f32> {pipe.loss}, tensor<2x4xbf16> {pipe.saved}, tensor<4xf32> {pipe.saved})
// CHECK: %[[OUT:[^,]*]], %[[SM:[^,]*]], %{{[^,]*}}, %[[NM:[^,]*]], %{{[^,]*}} = nn.batch_norm
// CHECK-NEXT: nn.cast %[[OUT]] : tensor<2x4xf32> -> tensor<2x4xbf16>
// CHECK-NOT: nn.cast %[[SM]]
// CHECK: ml_program.global_store @rm = %[[NM]] : tensor<4xf32>
// CHECK: %[[L:.*]] = nn.softmax_cross_entropy_loss {{.*}} -> tensor<f32>
// CHECK: return %[[L]], %{{.*}}, %[[SM]] : tensor<f32>, tensor<2x4xbf16>, tensor<4xf32>

// The gradient of a bf16 argument is returned in bf16.
// CHECK-LABEL: func.func @s1_bwd
// CHECK-SAME: -> (tensor<2x4xbf16> {pipe.grad_of_arg = 0 : i64})
// CHECK: %[[T:.*]] = nn.tanh_grad
// CHECK-NEXT: %[[TB:.*]] = nn.cast %[[T]] : tensor<2x4xf32> -> tensor<2x4xbf16>
// CHECK-NEXT: return %[[TB]] : tensor<2x4xbf16>

// CHECK: pipe.send %{{.*}} to 1 channel 0 from @s0_fwd[0] : tensor<2x4xbf16>
// CHECK: pipe.recv %{{.*}} from 1 channel 1 into @s0_bwd[0] : tensor<2x4xbf16>
// CHECK: pipe.recv %{{.*}} from 0 channel 0 into @s1_fwd[0] : tensor<2x4xbf16>
// CHECK: pipe.send %{{.*}} to 0 channel 1 from @s1_bwd[0] : tensor<2x4xbf16>

// --activations bf16: the same numbers, but the ops whose kernels have
// bf16 variants (relu, relu_grad, tanh, tanh_grad, batch_norm) read and
// write bf16 themselves, without casts; the others (gemm, the loss,
// sum_to_shape) stay between casts.
// KERN: module attributes {pipec.activations = "bf16", pipec.precision = "bf16"}
// KERN-LABEL: func.func @s0_fwd
// KERN: %[[Y:.*]] = nn.gemm
// KERN-NEXT: %[[YB:.*]] = nn.cast %[[Y]] : tensor<2x4xf32> -> tensor<2x4xbf16>
// KERN-NEXT: %[[R:.*]] = nn.relu %[[YB]] : tensor<2x4xbf16>
// KERN-NEXT: nn.reshape %[[R]] : tensor<2x4xbf16> -> tensor<8xbf16>
// KERN-LABEL: func.func @s0_bwd
// KERN-SAME: (%[[G:.*]]: tensor<2x4xbf16> {pipe.grad_from = array<i64: 1, 0>}, %[[SY:.*]]: tensor<2x4xbf16> {pipe.fwd_result = 1 : i64}
// KERN-NEXT: %[[D:.*]] = nn.relu_grad %[[SY]], %[[G]] : tensor<2x4xbf16>
// KERN-NEXT: nn.cast %[[D]] : tensor<2x4xbf16> -> tensor<2x4xf32>
// KERN-NEXT: nn.gemm
// KERN-LABEL: func.func @s1_fwd
// KERN-SAME: (%[[A:.*]]: tensor<2x4xbf16> {pipe.from = array<i64: 0, 0>}
// KERN: %[[OUT:[^,]*]], %[[SM:[^,]*]], %{{.*}} = nn.batch_norm %[[A]], {{.*}} : tensor<2x4xbf16>, tensor<4xf32>
// KERN: %[[T:.*]] = nn.tanh %[[OUT]] : tensor<2x4xbf16>
// KERN-NEXT: %[[TW:.*]] = nn.cast %[[T]] : tensor<2x4xbf16> -> tensor<2x4xf32>
// KERN-NEXT: nn.softmax_cross_entropy_loss %[[TW]]
// KERN: return %{{.*}}, %[[T]], %[[SM]] : tensor<f32>, tensor<2x4xbf16>, tensor<4xf32>
// KERN-LABEL: func.func @s1_bwd
// KERN: %[[LG:.*]] = nn.softmax_cross_entropy_loss_grad
// KERN-NEXT: %[[LB:.*]] = nn.cast %[[LG]] : tensor<2x4xf32> -> tensor<2x4xbf16>
// KERN-NEXT: %[[TG:.*]] = nn.tanh_grad %{{.*}}, %[[LB]] : tensor<2x4xbf16>
// KERN-NEXT: return %[[TG]] : tensor<2x4xbf16>
// KERN-NOT: nn.cast

// BAD: activations '{{.*}}' (f32, or bf16 or bf16-casts with precision bf16)

module {
  ml_program.global private mutable @w(dense<0.5> : tensor<4x4xf32>) : tensor<4x4xf32>
  ml_program.global private mutable @w.grad(dense<0.0> : tensor<4x4xf32>) : tensor<4x4xf32> {pipe.grad_of = @w}
  ml_program.global private mutable @scale(dense<1.0> : tensor<4xf32>) : tensor<4xf32>
  ml_program.global private mutable @bias(dense<0.0> : tensor<4xf32>) : tensor<4xf32>
  ml_program.global private mutable @bias.grad(dense<0.0> : tensor<4xf32>) : tensor<4xf32> {pipe.grad_of = @bias}
  ml_program.global private mutable @rm(dense<0.0> : tensor<4xf32>) : tensor<4xf32>
  ml_program.global private mutable @rv(dense<1.0> : tensor<4xf32>) : tensor<4xf32>
  func.func @s0_fwd(%x: tensor<2x4xf32> {pipe.feed = 0 : i64}) -> (tensor<2x4xf32>, tensor<2x4xf32> {pipe.saved}) attributes {pipe.stage = 0 : i64} {
    %w0 = ml_program.global_load @w : tensor<4x4xf32>
    %wv = nn.reshape %w0 : tensor<4x4xf32> -> tensor<16xf32>
    %w = nn.reshape %wv : tensor<16xf32> -> tensor<4x4xf32>
    %y = nn.gemm %x, %w {trans_b = true} : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
    %r = nn.relu %y : tensor<2x4xf32>
    %v = nn.reshape %r : tensor<2x4xf32> -> tensor<8xf32>
    %vv = nn.reshape %v : tensor<8xf32> -> tensor<2x4xf32>
    %id = nn.identity %vv : tensor<2x4xf32>
    return %id, %y : tensor<2x4xf32>, tensor<2x4xf32>
  }
  func.func @s0_bwd(%g: tensor<2x4xf32> {pipe.grad_from = array<i64: 1, 0>}, %y: tensor<2x4xf32> {pipe.fwd_result = 1 : i64}, %x: tensor<2x4xf32> {pipe.fwd_arg = 0 : i64}) attributes {pipe.stage = 0 : i64} {
    %d = nn.relu_grad %y, %g : tensor<2x4xf32>
    %dw = nn.gemm %d, %x {beta = 0.0 : f32, trans_a = true} : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<4x4xf32>
    %dx = nn.gemm %x, %d {beta = 0.0 : f32, trans_a = true} : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<4x4xf32>
    %dxt = nn.transpose %dx {perm = array<i64: 1, 0>} : tensor<4x4xf32> -> tensor<4x4xf32>
    %two = nn.add %dw, %dxt : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<4x4xf32>
    %acc = ml_program.global_load @w.grad : tensor<4x4xf32>
    %s = nn.add %acc, %two : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<4x4xf32>
    ml_program.global_store @w.grad = %s : tensor<4x4xf32>
    %db = nn.sum_to_shape %d : tensor<2x4xf32> -> tensor<4xf32>
    %dbv = nn.reshape %db : tensor<4xf32> -> tensor<1x4xf32>
    %dbw = nn.reshape %dbv : tensor<1x4xf32> -> tensor<4xf32>
    %bacc = ml_program.global_load @bias.grad : tensor<4xf32>
    %bs = nn.add %bacc, %dbw : tensor<4xf32>, tensor<4xf32> -> tensor<4xf32>
    ml_program.global_store @bias.grad = %bs : tensor<4xf32>
    return
  }
  func.func @s1_fwd(%a: tensor<2x4xf32> {pipe.from = array<i64: 0, 0>}, %l: tensor<2xi64> {pipe.feed = -1 : i64}) -> (tensor<f32> {pipe.loss}, tensor<2x4xf32> {pipe.saved}, tensor<4xf32> {pipe.saved}) attributes {pipe.stage = 1 : i64} {
    %scale = ml_program.global_load @scale : tensor<4xf32>
    %bias = ml_program.global_load @bias : tensor<4xf32>
    %mean = ml_program.global_load @rm : tensor<4xf32>
    %var = ml_program.global_load @rv : tensor<4xf32>
    %n, %sm, %si, %nm, %nv = nn.batch_norm %a, %scale, %bias, %mean, %var {epsilon = 1.0e-5 : f32, momentum = 0.9 : f32} : tensor<2x4xf32>, tensor<4xf32>
    ml_program.global_store @rm = %nm : tensor<4xf32>
    ml_program.global_store @rv = %nv : tensor<4xf32>
    %t = nn.tanh %n : tensor<2x4xf32>
    %loss = nn.softmax_cross_entropy_loss %t, %l : (tensor<2x4xf32>, tensor<2xi64>) -> tensor<f32>
    return %loss, %t, %sm : tensor<f32>, tensor<2x4xf32>, tensor<4xf32>
  }
  func.func @s1_bwd(%seed: tensor<f32> {pipe.loss_seed}, %l: tensor<2xi64> {pipe.fwd_arg = 1 : i64}, %t: tensor<2x4xf32> {pipe.fwd_result = 1 : i64}) -> (tensor<2x4xf32> {pipe.grad_of_arg = 0 : i64}) attributes {pipe.stage = 1 : i64} {
    %0 = nn.softmax_cross_entropy_loss_grad %t, %l, %seed : (tensor<2x4xf32>, tensor<2xi64>, tensor<f32>) -> tensor<2x4xf32>
    %1 = nn.tanh_grad %t, %0 : tensor<2x4xf32>
    return %1 : tensor<2x4xf32>
  }
  pipe.pipeline microbatches 1 schedule "gpipe" {
    pipe.program "rank0" stage 0 slots 1 {
      %c0 = arith.constant 0 : index
      pipe.forward @s0_fwd mb %c0
      pipe.send %c0 to 1 channel 0 from @s0_fwd[0] : tensor<2x4xf32>
      pipe.recv %c0 from 1 channel 1 into @s0_bwd[0] : tensor<2x4xf32>
      pipe.backward @s0_bwd mb %c0
      pipe.flush
    }
    pipe.program "rank1" stage 1 slots 1 {
      %c0 = arith.constant 0 : index
      pipe.recv %c0 from 0 channel 0 into @s1_fwd[0] : tensor<2x4xf32>
      pipe.forward @s1_fwd mb %c0
      pipe.backward @s1_bwd mb %c0
      pipe.send %c0 to 0 channel 1 from @s1_bwd[0] : tensor<2x4xf32>
      pipe.flush
    }
  }
}
