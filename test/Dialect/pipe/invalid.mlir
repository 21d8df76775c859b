// RUN: pipec-opt %s --split-input-file --verify-diagnostics

// A send nobody receives.
module {
  func.func @f(%x: tensor<2xf32>) -> tensor<2xf32> { return %x : tensor<2xf32> }
  // expected-error @+2 {{invalid pipeline communication}}
  // expected-note @+1 {{never received}}
  pipe.pipeline microbatches 1 schedule "gpipe" {
    pipe.program "rank0" stage 0 slots 1 {
      %c0 = arith.constant 0 : index
      pipe.forward @f mb %c0
      pipe.send %c0 to 1 channel 0 from @f[0] : tensor<2xf32>
      pipe.backward @f mb %c0
    }
    pipe.program "rank1" stage 1 slots 1 {
      %c0 = arith.constant 0 : index
      pipe.forward @f mb %c0
      pipe.backward @f mb %c0
    }
  }
}

// -----

// Both ranks receive first: a deadlock, reported with the cycle.
module {
  func.func @f(%x: tensor<2xf32>) -> tensor<2xf32> { return %x : tensor<2xf32> }
  // expected-error @+2 {{invalid pipeline communication}}
  // expected-note @+1 {{deadlock}}
  pipe.pipeline microbatches 1 schedule "gpipe" {
    pipe.program "rank0" stage 0 slots 1 {
      %c0 = arith.constant 0 : index
      pipe.recv %c0 from 1 channel 1 into @f[0] : tensor<2xf32>
      pipe.forward @f mb %c0
      pipe.send %c0 to 1 channel 0 from @f[0] : tensor<2xf32>
      pipe.backward @f mb %c0
    }
    pipe.program "rank1" stage 1 slots 1 {
      %c0 = arith.constant 0 : index
      pipe.recv %c0 from 0 channel 0 into @f[0] : tensor<2xf32>
      pipe.forward @f mb %c0
      pipe.send %c0 to 0 channel 1 from @f[0] : tensor<2xf32>
      pipe.backward @f mb %c0
    }
  }
}

// -----

// The communicated type must be the function's.
module {
  func.func @f(%x: tensor<2xf32>) -> tensor<2xf32> { return %x : tensor<2xf32> }
  pipe.pipeline microbatches 1 schedule "gpipe" {
    pipe.program "rank0" stage 0 slots 1 {
      %c0 = arith.constant 0 : index
      // expected-error @+1 {{type 'tensor<3xf32>' differs from f result 0 of type 'tensor<2xf32>'}}
      pipe.send %c0 to 1 channel 0 from @f[0] : tensor<3xf32>
    }
  }
}

// -----

// Result index out of range.
module {
  func.func @f(%x: tensor<2xf32>) -> tensor<2xf32> { return %x : tensor<2xf32> }
  pipe.pipeline microbatches 1 schedule "gpipe" {
    pipe.program "rank0" stage 0 slots 1 {
      %c0 = arith.constant 0 : index
      // expected-error @+1 {{index 3 is out of range: f has 1 results}}
      pipe.send %c0 to 1 channel 0 from @f[3] : tensor<2xf32>
    }
  }
}

// -----

// Unknown stage function.
module {
  pipe.pipeline microbatches 1 schedule "gpipe" {
    pipe.program "rank0" stage 0 slots 1 {
      %c0 = arith.constant 0 : index
      // expected-error @+1 {{references unknown stage function @nope}}
      pipe.forward @nope mb %c0
    }
  }
}

// -----

// Every microbatch needs one forward and one backward.
module {
  func.func @f(%x: tensor<2xf32>) -> tensor<2xf32> { return %x : tensor<2xf32> }
  pipe.pipeline microbatches 2 schedule "gpipe" {
    // expected-error @+1 {{must run exactly one forward and one backward of microbatch 1 (found 0 and 0)}}
    pipe.program "rank0" stage 0 slots 1 {
      %c0 = arith.constant 0 : index
      pipe.forward @f mb %c0
      pipe.backward @f mb %c0
    }
  }
}

// -----

// Microbatch index out of range.
module {
  func.func @f(%x: tensor<2xf32>) -> tensor<2xf32> { return %x : tensor<2xf32> }
  pipe.pipeline microbatches 1 schedule "gpipe" {
    pipe.program "rank0" stage 0 slots 1 {
      %c5 = arith.constant 5 : index
      // expected-error @+1 {{microbatch 5 is out of range [0, 1)}}
      pipe.forward @f mb %c5
    }
  }
}

// -----

// Non-contiguous plan.
// expected-error @+1 {{plan: stage 1 does not start where stage 0 ends}}
module attributes {pipe.plan = #pipe.plan<algorithm = "x", first = [0, 3], last = [1, 4], replicas = [1, 1], predicted_iteration_s = 0.0>} {
}

// -----

// 2BW with one microbatch per batch on three stages (m < p - 1): on stage 0,
// microbatch 2 would need weight version 1, which the stage creates only
// after the backward of microbatch 0. The schedule rules (lib/Schedule/
// Rules.cpp) refuse the pipeline before its programs are replayed.
module {
  func.func @f(%x: tensor<2xf32>) -> tensor<2xf32> { return %x : tensor<2xf32> }
  // expected-error @+1 {{schedule '2bw' needs at least p - 1 = 2 microbatches per batch for 3 stages, got 1}}
  pipe.pipeline microbatches 1 schedule "2bw" {
    pipe.program "rank0" stage 0 slots 3 {
      %c0 = arith.constant 0 : index
      %cm2 = arith.constant -2 : index
      pipe.forward @f mb %c0
      pipe.backward @f mb %cm2
      pipe.step @f after %cm2
    }
    pipe.program "rank1" stage 1 slots 1 {
      %c0 = arith.constant 0 : index
      pipe.forward @f mb %c0
      pipe.backward @f mb %c0
      pipe.step @f after %c0
    }
    pipe.program "rank2" stage 2 slots 1 {
      %c0 = arith.constant 0 : index
      pipe.forward @f mb %c0
      pipe.backward @f mb %c0
      pipe.step @f after %c0
    }
  }
}

// -----

// PipeDream: the last of two stages may hold p - s = 1 weight version, but
// this program keeps two microbatches of different versions in flight.
module {
  func.func @f(%x: tensor<2xf32>) -> tensor<2xf32> { return %x : tensor<2xf32> }
  pipe.pipeline microbatches 1 schedule "1f1b" {
    pipe.program "rank0" stage 0 slots 1 {
      %c0 = arith.constant 0 : index
      pipe.forward @f mb %c0
      pipe.backward @f mb %c0
      pipe.step @f after %c0
    }
    pipe.program "rank1" stage 1 slots 2 {
      %c0 = arith.constant 0 : index
      %cm1 = arith.constant -1 : index
      // expected-error @+1 {{weight stashing: stage 1 would hold 2 weight versions, more than K_s = 1 (p - s without replicas)}}
      pipe.forward @f mb %c0
      pipe.backward @f mb %cm1
      pipe.step @f after %cm1
    }
  }
}

// -----

// A continuous schedule's update names the backward it follows.
module {
  func.func @f(%x: tensor<2xf32>) -> tensor<2xf32> { return %x : tensor<2xf32> }
  pipe.pipeline microbatches 1 schedule "1f1b" {
    pipe.program "rank0" stage 0 slots 1 {
      %c0 = arith.constant 0 : index
      pipe.forward @f mb %c0
      pipe.backward @f mb %c0
      // expected-error @+1 {{in a continuous schedule every op needs a microbatch}}
      pipe.step @f
    }
  }
}

// -----

// Two replicas of one stage must sum their gradients before updating.
module {
  func.func @f(%x: tensor<2xf32>) -> tensor<2xf32> { return %x : tensor<2xf32> }
  pipe.pipeline microbatches 2 schedule "gpipe" {
    pipe.program "rank0" stage 0 slots 1 {
      %c0 = arith.constant 0 : index
      pipe.forward @f mb %c0
      pipe.backward @f mb %c0
      pipe.flush
      pipe.allreduce
      pipe.step @f
    }
    pipe.program "rank1" stage 0 replica 1 slots 1 {
      %c1 = arith.constant 1 : index
      pipe.forward @f mb %c1
      pipe.backward @f mb %c1
      pipe.flush
      // expected-error @+1 {{stage 0 has 2 replicas but updates without a pipe.allreduce of its gradients first}}
      pipe.step @f
    }
  }
}

// -----

// An allreduce before the last backward leaves that backward's gradients
// unreduced.
module {
  func.func @f(%x: tensor<2xf32>) -> tensor<2xf32> { return %x : tensor<2xf32> }
  pipe.pipeline microbatches 2 schedule "gpipe" {
    pipe.program "rank0" stage 0 slots 1 {
      %c0 = arith.constant 0 : index
      pipe.forward @f mb %c0
      pipe.allreduce
      pipe.backward @f mb %c0
      pipe.flush
      // expected-error @+1 {{stage 0 has 2 replicas but updates without a pipe.allreduce of its gradients first}}
      pipe.step @f
    }
    pipe.program "rank1" stage 0 replica 1 slots 1 {
      %c1 = arith.constant 1 : index
      pipe.forward @f mb %c1
      pipe.backward @f mb %c1
      pipe.flush
      pipe.allreduce
      pipe.step @f
    }
  }
}

// -----

// Replica 1 owns the odd microbatches; replica 0 may not run microbatch 1.
module {
  func.func @f(%x: tensor<2xf32>) -> tensor<2xf32> { return %x : tensor<2xf32> }
  pipe.pipeline microbatches 2 schedule "gpipe" {
    // expected-error @+1 {{must run no forward or backward (another replica owns it) of microbatch 1}}
    pipe.program "rank0" stage 0 slots 2 {
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      pipe.forward @f mb %c0
      pipe.forward @f mb %c1
      pipe.backward @f mb %c0
      pipe.backward @f mb %c1
      pipe.allreduce
      pipe.step @f
    }
    pipe.program "rank1" stage 0 replica 1 slots 1 {
      %c1 = arith.constant 1 : index
      pipe.forward @f mb %c1
      pipe.backward @f mb %c1
      pipe.allreduce
      pipe.step @f
    }
  }
}

// -----

// Zero bubble: the weight half of a microbatch needs its input half first.
module {
  func.func @s0_fwd(%x: tensor<2xf32>) -> tensor<2xf32> { return %x : tensor<2xf32> }
  func.func @s0_bwd(%x: tensor<2xf32>) -> tensor<2xf32> { return %x : tensor<2xf32> }
  func.func @s0_bwdw(%x: tensor<2xf32>) { return }
  pipe.pipeline microbatches 1 schedule "zb-h1" {
    pipe.program "rank0" stage 0 slots 1 {
      %c0 = arith.constant 0 : index
      pipe.forward @s0_fwd mb %c0
      // expected-error @+1 {{weight-gradient half of microbatch 0 runs before its input-gradient half}}
      pipe.backward_weight @s0_bwdw mb %c0
      pipe.backward @s0_bwd mb %c0
      pipe.step @s0_fwd
    }
  }
}

// -----

// Split replicas: every replica runs every microbatch (on its slice).
module {
  func.func @f(%x: tensor<2xf32>) -> tensor<2xf32> { return %x : tensor<2xf32> }
  pipe.pipeline microbatches 2 schedule "gpipe" split_samples 4 {
    pipe.program "rank0" stage 0 slots 2 {
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      pipe.forward @f mb %c0
      pipe.forward @f mb %c1
      pipe.backward @f mb %c0
      pipe.backward @f mb %c1
      pipe.allreduce
      pipe.step @f
    }
    // expected-error @+1 {{must run exactly one forward and one backward of microbatch 1 (found 0 and 0)}}
    pipe.program "rank1" stage 0 replica 1 slots 1 {
      %c0 = arith.constant 0 : index
      pipe.forward @f mb %c0
      pipe.backward @f mb %c0
      pipe.allreduce
      pipe.step @f
    }
  }
}

// -----

module {
  func.func @f(%x: tensor<2xf32>) -> tensor<2xf32> { return %x : tensor<2xf32> }
  // expected-error @+1 {{stage 0 has 2 replicas; each replica needs at least one of the 1 samples of a microbatch}}
  pipe.pipeline microbatches 1 schedule "gpipe" split_samples 1 {
    pipe.program "rank0" stage 0 slots 1 {
    }
    pipe.program "rank1" stage 0 replica 1 slots 1 {
    }
  }
}
