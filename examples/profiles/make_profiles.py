#!/usr/bin/python3
"""Builds the paper-scale layer profiles of examples/profiles/.

Every file is a `pipec.profile/1` profile (DESIGN.md §7) built from layer
shapes with the analytic roofline model of lib/Cost/CostModel.cpp, not
measured:

    t(kernel) = max(FLOPs / peak, bytes / bandwidth) + launch overhead

and fwd_s / bwd_s of a layer are the sums over its kernels. Run with
Debian's /usr/bin/python3 (stdlib only):

    /usr/bin/python3 examples/profiles/make_profiles.py          # rewrite
    /usr/bin/python3 examples/profiles/make_profiles.py --check  # compare
    /usr/bin/python3 examples/profiles/make_profiles.py --measured FIT.json \
        --only gpt3-175b-tp8.json -o OUT.json  # measured efficiencies
                                                # (MeasuredDevice below)

The output is deterministic: rerunning reproduces the checked-in files byte
for byte (--check says which file differs).

Conventions (the same for every model)
--------------------------------------
* Ops are whole layers (or, for ResNet and the AmoebaNet-like net, the
  branches and joins of a block, so that skip connections appear as
  `inputs`). Ops are listed in topological order; `inputs` is written only
  where an op does not consume just the previous op.
* FLOPs count 2 x multiply-accumulates of convolutions and matrix products
  only (Megatron's and PipeDream's convention); element-wise work (ReLU,
  batch/layer norm, softmax, dropout, pooling, adds) is costed by the bytes
  it moves and counts no FLOPs. Backward = 2 x forward FLOPs (input and
  weight gradients).
* Kernel bytes: a matrix product/convolution reads both operands and writes
  its result once; an element-wise kernel reads and writes its tensors once
  forward and reads one tensor more backward (the saved input or output).
* out_bytes: the op's output at the microbatch, in the activation dtype.
* param_bytes: 4 bytes per parameter: fp32 weights, or under mixed
  precision the fp32 master copy, so that the simulator's weights +
  gradients + 2 x Adam state is the usual 16 bytes per parameter (ZeRO;
  DAPPLE Table VIII).
* saved_bytes: what the op keeps for its backward at the microbatch, as
  PyTorch does: convolution/linear inputs, batch/layer-norm inputs, ReLU
  outputs, max-pool inputs and int64 indices, 1-byte dropout masks,
  softmax outputs. For transformers this reproduces Korthikanti et al.'s
  34sbh + 5as^2b bytes per layer in fp16.
* Extra fields (allowed by DESIGN.md §7: "extend only by adding fields"):
  top level `model`, `precision`, `note`, `device_model` (the roofline
  parameters used; a unit test checks them against CostModel.cpp); per op
  `params` (unique parameters held), `fwd_flops`, `bwd_flops`, and on the
  tied GPT-3 output layer `tied_params`.

Models, microbatches and sources
--------------------------------
  vgg16.json            PipeDream (pipedream.md §6.2): fp32 V100, 224x224,
                        per-GPU minibatch 64.
  vgg19.json            DAPPLE (dapple.md §5, Table II): fp32 V100, batch 32.
  resnet50.json         PipeDream and DAPPLE: fp32 V100, 224x224, batch 128.
  resnet50-1000px.json  MadPipe (madpipe.md §5.1): 1000x1000 images,
  resnet101-1000px.json mini-batch 8; fp32 V100 (the paper names no GPU).
  gnmt16.json           PipeDream / DAPPLE: fp32 V100, batch 64; 8+8 LSTM
                        layers of 1024, sequence length 50, vocabulary 32320.
  bert48.json           DAPPLE: fp32 V100, batch 2 (Table II), h = 1024,
                        16 heads, sequence 512, 48 layers.
  bert-large.json       DAPPLE Table VII: 24 layers; the paper gives no
                        microbatch, we use BERT-48's 2.
  amoebanet36.json      DAPPLE: fp32 V100, batch 1; an AmoebaNet-like
                        cell-based CNN (see amoebanet() below).
  gpt3-175b.json        Megatron PTD-P (thesis.md §4.6, §6.3): mixed
                        precision on A100 80 GB (312 TFLOP/s fp16),
                        microbatch 1, l = 96, h = 12288, 96 heads,
                        s = 2048, V = 51200; no tensor parallelism (t = 1).
  gpt3-175b-tp8.json    The same model with Megatron's 8-way tensor
                        parallelism inside a DGX A100 node: every number is
                        per GPU (GEMMs / 8, the tensor-parallel allreduces
                        over NVSwitch included in the times, boundary
                        tensors / 8 as with scatter/gather, activations per
                        Korthikanti et al.'s sbh(10 + 24/t + 5as/(ht))).
                        Pair it with examples/topologies/selene-a100-tp8-*.

Where the result differs from the papers' own numbers (the unit tests in
test/unittests/cost pin the rest):
  * GNMT-16 has 278M parameters against DAPPLE's 291M (the papers do not
    give the vocabulary or attention details); its decoder boundary is
    DAPPLE's 26 MB and its encoder:decoder layer ratio 1:1.43 (DAPPLE 1:1.45).
  * BERT-48: DAPPLE's 11.4 GB profiling memory suggests shorter sequences
    than 512, its 8.8 MB boundary activation longer ones (4.2 MB here).
  * AmoebaNet-36-like: 934M parameters, 71% in the last third (DAPPLE 73%),
    an 11.7 MB boundary between cells (DAPPLE 11.2 MB); at 224x224 it needs
    less activation memory than DAPPLE's 20 GB at batch 1.
  * Times are roofline times at the datasheet peaks: an upper bound on
    speed (real kernels reach roughly 50-90% of peak).
"""

import argparse
import json
import os
import sys

#===----------------------------------------------------------------------===#
# Devices: a copy of lib/Cost/CostModel.cpp's table (see the reasons there).
#===----------------------------------------------------------------------===#

GIB = 1 << 30

#            peak FLOP/s  bytes/s    memory     launch overhead (s)
DEVICES = {
    "cpu":            (5.0e10,   2.0e10,   0,         1.0e-6),
    "v100":           (15.7e12,  9.0e11,   16 * GIB,  5.0e-6),
    "v100-32gb":      (15.7e12,  9.0e11,   32 * GIB,  5.0e-6),
    "v100-fp16":      (125.0e12, 9.0e11,   16 * GIB,  5.0e-6),
    "v100-32gb-fp16": (125.0e12, 9.0e11,   32 * GIB,  5.0e-6),
    "a100":           (156.0e12, 1.555e12, 40 * GIB,  5.0e-6),
    "a100-80gb":      (156.0e12, 2.039e12, 80 * GIB,  5.0e-6),
    "a100-fp16":      (312.0e12, 1.555e12, 40 * GIB,  5.0e-6),
    "a100-80gb-fp16": (312.0e12, 2.039e12, 80 * GIB,  5.0e-6),
    "h100":           (494.0e12, 3.35e12,  80 * GIB,  4.0e-6),
    "h100-bf16":      (989.0e12, 3.35e12,  80 * GIB,  4.0e-6),
    "h200":           (494.0e12, 4.8e12,   141 * GIB, 4.0e-6),
    "h200-bf16":      (989.0e12, 4.8e12,   141 * GIB, 4.0e-6),
}

PARAM_BYTES = 4  # fp32 weights, or the fp32 master copy (see above)


class Device:
    def __init__(self, name):
        self.name = name
        self.peak, self.bandwidth, self.memory, self.overhead = DEVICES[name]

    def seconds(self, flops, nbytes, kind=None):
        """t = max(FLOPs / peak, bytes / bandwidth) + overhead (the kernel's
        kind plays no part in the datasheet model)."""
        return max(flops / self.peak, nbytes / self.bandwidth) + self.overhead

    def as_json(self):
        return {"name": self.name, "peak_flops": self.peak,
                "bandwidth": self.bandwidth, "memory_bytes": self.memory,
                "op_overhead_s": self.overhead}


class MeasuredDevice:
    """A device model calibrated on a measured profile (`pipec calibrate`
    writes it: `pipec.device/1`), with DeviceModel::seconds' rule
    (lib/Cost/CostModel.cpp): a kernel of a kind the file has a line for,
    whose roofline lies in the line's [from, up_to], takes roofline /
    efficiency + overhead; any other kernel max(FLOPs / (peak x compute
    efficiency), bytes / (bandwidth x bandwidth efficiency)) + overhead.

    `as_row` moves the efficiencies to another datasheet row (peak,
    bandwidth, memory and launch overhead of DEVICES[as_row]): a kernel
    keeps the share of the peak, or of the bandwidth, it reached where it
    was measured, and a kind's fitted overhead; which line applies is
    decided by its roofline on the measured device. That share is a
    property of the kernel on the measured GPU, not of the other row's: an
    assumption, said in each profile this writes.
    """

    def __init__(self, path, as_row=None):
        with open(path) as f:
            d = json.load(f)
        if d.get("format") != "pipec.device/1":
            raise ValueError("%s: not a pipec.device/1 file" % path)
        self.path = path
        self.measured_peak = float(d["peak_flops"])
        self.measured_bandwidth = float(d["bandwidth"])
        self.compute_efficiency = float(d["compute_efficiency"])
        self.bandwidth_efficiency = float(d["bandwidth_efficiency"])
        self.kinds = d.get("kinds", {})
        if as_row:
            self.name = as_row
            self.peak, self.bandwidth, self.memory, self.overhead = \
                DEVICES[as_row]
        else:
            self.name = d["name"]
            self.peak, self.bandwidth = self.measured_peak, \
                self.measured_bandwidth
            self.memory, self.overhead = int(d["memory_bytes"]), \
                float(d["op_overhead"])
        self.measured_name = d["name"]

    def seconds(self, flops, nbytes, kind=None):
        line = self.kinds.get("matmul" if kind == "gemm" else kind)
        if line and line.get("efficiency", 0) > 0:
            measured = max(flops / self.measured_peak,
                           nbytes / self.measured_bandwidth)
            if measured >= line.get("from", 0) and (
                    line.get("up_to", 0) <= 0 or measured <= line["up_to"]):
                roofline = max(flops / self.peak, nbytes / self.bandwidth)
                return roofline / line["efficiency"] + line.get("overhead", 0)
        return max(flops / (self.peak * self.compute_efficiency),
                   nbytes / (self.bandwidth * self.bandwidth_efficiency)) + \
            self.overhead

    def as_json(self):
        return {"name": self.name, "peak_flops": self.peak,
                "bandwidth": self.bandwidth, "memory_bytes": self.memory,
                "op_overhead_s": self.overhead,
                "kernel_efficiencies_from": self.measured_name}


def ring_allreduce_seconds(nbytes, n, bandwidth, latency):
    """Topology::allreduceSeconds: 2(n-1)/n * bytes / B + 2(n-1) * latency."""
    return 2.0 * (n - 1) / n * nbytes / bandwidth + 2.0 * (n - 1) * latency


#===----------------------------------------------------------------------===#
# Layers: lists of kernels plus byte counts
#===----------------------------------------------------------------------===#

class Layer:
    """One op of a profile, built from the kernels it launches.

    `e` is the activation dtype size in bytes. Every primitive appends its
    forward and backward kernels (flops, bytes) and adds what it saves for
    the backward and the parameters it owns.
    """

    def __init__(self, name, op, e, inputs=None):
        self.name = name
        self.op = op
        self.e = e
        self.inputs = inputs
        self.fwd = []
        self.bwd = []
        self.fwd_comm_s = 0.0
        self.bwd_comm_s = 0.0
        self.params = 0
        self.param_bytes = None  # None: PARAM_BYTES * params
        self.tied_params = 0
        self.saved = 0
        self.out_bytes = 0

    # Matrix products -------------------------------------------------------

    def gemm(self, m, n, k, bias=True):
        """Y[m,n] = X[m,k] W[k,n] (+ b): a linear layer on m rows."""
        e = self.e
        flops = 2.0 * m * n * k
        traffic = e * (m * k + k * n + m * n)
        self.fwd.append((flops, traffic, "matmul"))
        self.bwd.append((flops, traffic, "matmul"))  # dX = dY W^T
        self.bwd.append((flops, traffic, "matmul"))  # dW = X^T dY
        self.params += k * n + (n if bias else 0)
        self.saved += e * m * k

    def bmm(self, batch, m, n, k):
        """A batch of products of two activations (attention)."""
        e = self.e
        flops = 2.0 * batch * m * n * k
        traffic = e * batch * (m * k + k * n + m * n)
        self.fwd.append((flops, traffic, "matmul"))
        self.bwd.append((flops, traffic, "matmul"))
        self.bwd.append((flops, traffic, "matmul"))
        self.saved += e * batch * (m * k + k * n)

    def conv(self, b, c, h, w, cout, k, stride=1, pad=None, groups=1,
             bias=False):
        """2-D convolution, NCHW; returns the output (h, w)."""
        if pad is None:
            pad = k // 2
        ho = (h + 2 * pad - k) // stride + 1
        wo = (w + 2 * pad - k) // stride + 1
        e = self.e
        weights = cout * (c // groups) * k * k
        flops = 2.0 * b * ho * wo * cout * (c // groups) * k * k
        traffic = e * (b * c * h * w + weights + b * cout * ho * wo)
        self.fwd.append((flops, traffic, "conv"))
        self.bwd.append((flops, traffic, "conv"))  # data gradient
        self.bwd.append((flops, traffic, "conv"))  # weight gradient
        self.params += weights + (cout if bias else 0)
        self.saved += e * b * c * h * w
        return ho, wo

    # Element-wise and memory-bound kernels --------------------------------

    def elementwise(self, n, reads=1, writes=1, saved=0, e=None, kind=None):
        """A memory-bound kernel over n elements (no counted FLOPs); `kind`
        is pipec's op kind where a measured device model has a line for it
        (MeasuredDevice), None for the model's memory-bound class."""
        e = self.e if e is None else e
        self.fwd.append((0.0, e * n * (reads + writes), kind))
        self.bwd.append((0.0, e * n * (reads + writes + 1), kind))
        self.saved += saved

    def relu(self, n, keep=False):
        """ReLU. Its output is what its backward needs; it is counted once,
        by the consumer that saves it as its input (a convolution, linear
        layer or max pool, in this op or the next), unless `keep` says the
        consumer saves nothing (dropout, average pool)."""
        self.elementwise(n, saved=self.e * n if keep else 0, kind="relu")

    def batchnorm(self, n, channels):
        # Statistics pass + normalise pass; saves its input.
        self.elementwise(n, reads=2, writes=1, saved=self.e * n,
                         kind="batch_norm")
        self.params += 2 * channels

    def layernorm(self, n, width):
        self.elementwise(n, reads=2, writes=1, saved=self.e * n,
                         kind="layer_norm")
        self.params += 2 * width

    def dropout(self, n):
        self.elementwise(n, reads=1, writes=1, saved=n,  # 1-byte mask
                         kind="dropout")

    def add(self, n, operands=2):
        self.elementwise(n, reads=operands, writes=1, kind="add")

    def maxpool(self, b, c, h, w, k, stride, pad=None):
        if pad is None:
            pad = k // 2
        ho = (h + 2 * pad - k) // stride + 1
        wo = (w + 2 * pad - k) // stride + 1
        n_in, n_out = b * c * h * w, b * c * ho * wo
        self.fwd.append((0.0, self.e * (n_in + n_out), "max_pool"))
        self.bwd.append((0.0, self.e * (n_in + n_out) + 8 * n_out,
                         "max_pool"))
        self.saved += self.e * n_in + 8 * n_out  # input + int64 indices
        return ho, wo

    def avgpool(self, b, c, h, w, k, stride, pad=None):
        if pad is None:
            pad = k // 2
        ho = (h + 2 * pad - k) // stride + 1
        wo = (w + 2 * pad - k) // stride + 1
        n_in, n_out = b * c * h * w, b * c * ho * wo
        self.fwd.append((0.0, self.e * (n_in + n_out), "average_pool"))
        self.bwd.append((0.0, self.e * (n_in + n_out), "average_pool"))
        return ho, wo

    def embedding(self, rows, vocab, width):
        """Gather `rows` rows of a vocab x width table; scatter-add back."""
        self.fwd.append((0.0, self.e * rows * width * 2, "gather"))
        self.bwd.append((0.0, self.e * rows * width * 3, "gather"))
        self.params += vocab * width

    def softmax_cross_entropy(self, rows, classes, e=None):
        e = self.e if e is None else e
        self.elementwise(rows * classes, reads=1, writes=1,
                         saved=e * rows * classes, e=e,
                         kind="softmax_cross_entropy_loss")

    def lstm(self, b, t, n_in, hidden, directions=1):
        """cuDNN-style LSTM layer over t steps (PyTorch's two bias vectors).

        Forward: one input-projection GEMM over all steps, then per step a
        recurrent GEMM and a fused gate kernel. Backward mirrors it, with
        one weight-gradient GEMM for the recurrent weights over all steps.
        """
        e = self.e
        for _ in range(directions):
            rows = b * t
            x_proj = (2.0 * rows * 4 * hidden * n_in,
                      e * (rows * n_in + n_in * 4 * hidden +
                           rows * 4 * hidden), "matmul")
            rec = (2.0 * b * 4 * hidden * hidden,
                   e * (b * hidden + hidden * 4 * hidden + b * 4 * hidden),
                   "matmul")
            # 8H gate inputs, c, -> h, c
            gates = (0.0, e * b * hidden * 11, "lstm_gates")
            self.fwd.append(x_proj)
            for _ in range(t):
                self.fwd.append(rec)
                self.fwd.append(gates)
            for _ in range(t):
                self.bwd.append((0.0, 2 * gates[1], "lstm_gates"))
                self.bwd.append(rec)  # dh_{t-1} = dgates W_hh^T
            self.bwd.append((rec[0] * t, e * (rows * hidden + hidden * 4 *
                                                hidden + rows * 4 * hidden),
                             "matmul"))
            self.bwd.append(x_proj)  # dX
            self.bwd.append(x_proj)  # dW_ih
            self.params += 4 * hidden * (n_in + hidden) + 8 * hidden
            # Input sequence, gates, cell states and outputs.
            self.saved += e * rows * (n_in + 6 * hidden)

    def comm(self, fwd_s, bwd_s):
        """Communication inside the op (tensor-parallel allreduces)."""
        self.fwd_comm_s += fwd_s
        self.bwd_comm_s += bwd_s

    # Results ---------------------------------------------------------------

    def fwd_flops(self):
        return sum(k[0] for k in self.fwd)

    def bwd_flops(self):
        return sum(k[0] for k in self.bwd)

    def to_json(self, device, previous):
        fwd_s = (sum(device.seconds(*k) for k in self.fwd) +
                 self.fwd_comm_s)
        bwd_s = (sum(device.seconds(*k) for k in self.bwd) +
                 self.bwd_comm_s)
        param_bytes = (PARAM_BYTES * self.params if self.param_bytes is None
                       else self.param_bytes)
        op = {"name": self.name, "op": self.op,
              "fwd_s": sig(fwd_s), "bwd_s": sig(bwd_s),
              "out_bytes": int(self.out_bytes),
              "param_bytes": int(param_bytes),
              "saved_bytes": int(self.saved)}
        if self.inputs is not None and self.inputs != [previous]:
            op["inputs"] = list(self.inputs)
        op["params"] = int(self.params)
        if self.tied_params:
            op["tied_params"] = int(self.tied_params)
        op["fwd_flops"] = self.fwd_flops()
        op["bwd_flops"] = self.bwd_flops()
        return op


def sig(x):
    """Six significant digits: keeps files short and output stable."""
    return float("%.6g" % x)


#===----------------------------------------------------------------------===#
# CNNs: VGG, ResNet, AmoebaNet-like
#===----------------------------------------------------------------------===#

VGG_CONFIGS = {
    16: [64, 64, "M", 128, 128, "M", 256, 256, 256, "M",
         512, 512, 512, "M", 512, 512, 512, "M"],
    19: [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M",
         512, 512, 512, 512, "M", 512, 512, 512, 512, "M"],
}


def vgg(depth, b, image=224, classes=1000):
    """VGG-16/19 (Simonyan & Zisserman, configurations D/E): conv+ReLU
    layers, max pools, fc6/fc7 (+ReLU, dropout), fc8, softmax loss."""
    e = 4
    layers = []
    c, h, w = 3, image, image
    block, index = 1, 1
    for item in VGG_CONFIGS[depth]:
        if item == "M":
            L = Layer("pool%d" % block, "maxpool", e)
            h, w = L.maxpool(b, c, h, w, 2, 2, pad=0)
            block, index = block + 1, 1
        else:
            L = Layer("conv%d_%d" % (block, index), "conv", e)
            h, w = L.conv(b, c, h, w, item, 3, bias=True)
            c = item
            L.relu(b * c * h * w)
            index += 1
        L.out_bytes = e * b * c * h * w
        layers.append(L)
    features = c * h * w
    for name, n_in, n_out, last in (("fc6", features, 4096, False),
                                    ("fc7", 4096, 4096, False),
                                    ("fc8", 4096, classes, True)):
        L = Layer(name, "linear", e)
        L.gemm(b, n_out, n_in)
        if not last:
            L.relu(b * n_out, keep=True)
            L.dropout(b * n_out)
        L.out_bytes = e * b * n_out
        layers.append(L)
    L = Layer("loss", "softmax_cross_entropy", e)
    L.softmax_cross_entropy(b, classes)
    L.out_bytes = 4
    layers.append(L)
    return layers


def conv_bn(L, b, c, h, w, cout, k, stride=1, relu=True):
    """Convolution, batch norm and (in-place) ReLU, as torchvision builds
    them: the batch norm saves the convolution's output, the ReLU output is
    saved by the next convolution."""
    h, w = L.conv(b, c, h, w, cout, k, stride)
    L.batchnorm(b * cout * h * w, cout)
    if relu:
        L.relu(b * cout * h * w)
    return h, w


def resnet(blocks, b, image=224, classes=1000):
    """ResNet v1.5 (torchvision: stride on the 3x3 conv) with bottleneck
    blocks, Caffe-style names: resNx_branch1 (projection), _branch2a/b/c,
    and the join resNx (add + ReLU) whose inputs are the two branches."""
    e = 4
    layers = []
    L = Layer("conv1", "conv", e)
    h, w = conv_bn(L, b, 3, image, image, 64, 7, 2)
    L.out_bytes = e * b * 64 * h * w
    layers.append(L)
    L = Layer("pool1", "maxpool", e)
    h, w = L.maxpool(b, 64, h, w, 3, 2)
    L.out_bytes = e * b * 64 * h * w
    layers.append(L)
    c, previous = 64, "pool1"
    for stage, (count, width) in enumerate(zip(blocks, (64, 128, 256, 512))):
        for i in range(count):
            if count <= 6:  # res2a, res2b, ...
                suffix = chr(ord("a") + i)
            else:  # ResNet-101's res4a, res4b1..res4b22, as in Caffe
                suffix = "a" if i == 0 else "b%d" % i
            name = "res%d%s" % (stage + 2, suffix)
            stride = 2 if (i == 0 and stage > 0) else 1
            cout = 4 * width
            shortcut = previous
            if i == 0:
                L = Layer(name + "_branch1", "conv", e, [previous])
                ho, wo = conv_bn(L, b, c, h, w, cout, 1, stride, relu=False)
                L.out_bytes = e * b * cout * ho * wo
                layers.append(L)
                shortcut = L.name
            L = Layer(name + "_branch2a", "conv", e, [previous])
            h2, w2 = conv_bn(L, b, c, h, w, width, 1)
            L.out_bytes = e * b * width * h2 * w2
            layers.append(L)
            L = Layer(name + "_branch2b", "conv", e)
            h2, w2 = conv_bn(L, b, width, h2, w2, width, 3, stride)
            L.out_bytes = e * b * width * h2 * w2
            layers.append(L)
            L = Layer(name + "_branch2c", "conv", e)
            h2, w2 = conv_bn(L, b, width, h2, w2, cout, 1, relu=False)
            L.out_bytes = e * b * cout * h2 * w2
            layers.append(L)
            L = Layer(name, "add_relu", e, [name + "_branch2c", shortcut])
            L.add(b * cout * h2 * w2)
            last = stage == len(blocks) - 1 and i == count - 1
            L.relu(b * cout * h2 * w2, keep=last)  # last: avg pool is next
            L.out_bytes = e * b * cout * h2 * w2
            layers.append(L)
            c, h, w, previous = cout, h2, w2, name
    L = Layer("pool5", "avgpool", e)
    L.avgpool(b, c, h, w, h, 1, pad=0)
    L.out_bytes = e * b * c
    layers.append(L)
    L = Layer("fc1000", "linear", e)
    L.gemm(b, classes, c)
    L.out_bytes = e * b * classes
    layers.append(L)
    L = Layer("loss", "softmax_cross_entropy", e)
    L.softmax_cross_entropy(b, classes)
    L.out_bytes = 4
    layers.append(L)
    return layers


def sep_conv_stack(L, b, c, h, w, f, k, stride):
    """NASNet/AmoebaNet separable-conv op: (ReLU, depthwise kxk, pointwise
    1x1, BN) twice, the first depthwise carrying the stride."""
    for i in range(2):
        L.relu(b * c * h * w)
        h, w = L.conv(b, c, h, w, c, k, stride if i == 0 else 1, groups=c)
        h, w = L.conv(b, c, h, w, f, 1)
        L.batchnorm(b * f * h * w, f)
        c = f
    return h, w


def amoeba_cell(name, b, f, stride, prev, prevprev, layers):
    """An AmoebaNet-like cell as three ops: a left branch on h_{i-1}, a
    right branch on h_{i-2}, and the join (pairwise adds, concatenation).

    Each branch first maps its input to f channels (ReLU-1x1 conv-BN, or a
    factorised stride-2 reduction when h_{i-2} is twice as large), then
    runs three of AmoebaNet's operations at the cell's stride:
      left:  sep 3x3, sep 5x5, avg-pool 3x3
      right: sep 7x7, sep 3x3, max-pool 3x3
    The join adds them pairwise (c1..c3), adds c4 = c1 + c2, and
    concatenates c1..c4: 4f output channels. Reduction cells (stride 2)
    have the same shape. `prev`/`prevprev` are (op name, c, h, w).
    """
    e = 4
    p_name, pc, ph, pw = prev
    q_name, qc, qh, qw = prevprev
    outs = []
    for side, (src, c, h, w), ops in (
            ("left", prev, (("sep", 3), ("sep", 5), ("avg", 3))),
            ("right", prevprev, (("sep", 7), ("sep", 3), ("max", 3)))):
        L = Layer("%s_%s" % (name, side), "cell_branch", e, [src])
        L.relu(b * c * h * w)
        if h == 2 * ph:  # factorised reduction of h_{i-2} to prev's size
            for _ in range(2):
                L.conv(b, c, h, w, f // 2, 1, 2)
            h, w = ph, pw
            L.batchnorm(b * f * h * w, f)
        else:
            h, w = L.conv(b, c, h, w, f, 1)
            L.batchnorm(b * f * h * w, f)
        ho, wo = h, w
        for kind, k in ops:
            if kind == "sep":
                ho, wo = sep_conv_stack(L, b, f, h, w, f, k, stride)
            elif kind == "avg":
                ho, wo = L.avgpool(b, f, h, w, k, stride)
            else:
                ho, wo = L.maxpool(b, f, h, w, k, stride)
        L.out_bytes = e * b * 3 * f * ho * wo
        layers.append(L)
        outs.append((L.name, ho, wo))
    (left, ho, wo), (right, _, _) = outs
    L = Layer(name, "cell_join", e, [left, right])
    n = b * f * ho * wo
    for _ in range(4):
        L.add(n)
    L.elementwise(4 * n, reads=1, writes=1, kind="concat")
    L.out_bytes = e * b * 4 * f * ho * wo
    layers.append(L)
    return (name, 4 * f, ho, wo)


AMOEBA_FILTERS = 466


def amoebanet(b, cells_per_group=12, f=AMOEBA_FILTERS, image=224,
              classes=1000):
    """An AmoebaNet-36-like network (DAPPLE's AmoebaNet-36: 933M
    parameters, dapple.md §5).

    Stem: 3x3/2 conv-BN to 112x112, two stem reduction cells (f/4, f/2
    filters) to 28x28; then three groups of `cells_per_group` normal cells
    at 28x28 (f), 14x14 (2f) and 7x7 (4f) separated by two reduction cells;
    head: ReLU, global average pool, fc, softmax loss. Every cell reads the
    two previous cells' outputs, which the profile states as `inputs`.

    Doubling the filters while halving the resolution keeps the FLOPs per
    cell nearly flat and puts ~3/4 of the parameters into the last group,
    the shape DAPPLE describes (the last third holds 73% of the parameters;
    per-layer compute varies by at most 40%). f = 466 makes the parameter
    count land near DAPPLE's 933M (934M).
    """
    e = 4
    layers = []
    L = Layer("stem", "conv", e)
    h, w = conv_bn(L, b, 3, image, image, 64, 3, 2, relu=False)
    L.out_bytes = e * b * 64 * h * w
    layers.append(L)
    stem = ("stem", 64, h, w)
    r1 = amoeba_cell("stem_reduce1", b, f // 4, 2, stem, stem, layers)
    prevprev, prev = r1, amoeba_cell("stem_reduce2", b, f // 2, 2, r1, stem,
                                     layers)
    cell = 1
    for group in range(3):
        filters = f * (2 ** group)
        if group > 0:
            reduced = amoeba_cell("reduce%d" % group, b, filters, 2, prev,
                                  prevprev, layers)
            prevprev, prev = prev, reduced
        for _ in range(cells_per_group):
            out = amoeba_cell("cell%d" % cell, b, filters, 1, prev, prevprev,
                              layers)
            prevprev, prev = prev, out
            cell += 1
    name, c, h, w = prev
    L = Layer("classifier", "linear", e)
    L.relu(b * c * h * w, keep=True)
    L.avgpool(b, c, h, w, h, 1, pad=0)
    L.gemm(b, classes, c)
    L.out_bytes = e * b * classes
    layers.append(L)
    L = Layer("loss", "softmax_cross_entropy", e)
    L.softmax_cross_entropy(b, classes)
    L.out_bytes = 4
    layers.append(L)
    return layers


#===----------------------------------------------------------------------===#
# GNMT-16
#===----------------------------------------------------------------------===#

def gnmt(b, layers_per_side=8, hidden=1024, seq=50, vocab=32320):
    """GNMT (Wu et al.; the MLPerf/PipeDream PyTorch model) with 8 encoder
    and 8 decoder LSTM layers (GNMT-16).

    Encoder: bidirectional first layer, then unidirectional layers with
    residual connections from the third on. Decoder: the first layer
    computes Bahdanau attention over the encoder outputs; every later layer
    reads [previous output, attention context], and passes the context on,
    so a cut inside the decoder carries 2 x b x seq x hidden fp32 values
    (26 MB at b = 64: DAPPLE Table I's GNMT-16 boundary activation).
    `data` holds the token ids (source, target, labels) so the decoder and
    the loss can name their real producer.
    """
    e = 4
    T = b * seq
    layers = []
    L = Layer("data", "input", e)
    L.elementwise(3 * T, reads=0, writes=1, e=8)
    L.out_bytes = 8 * 3 * T
    layers.append(L)

    L = Layer("encoder_embedding", "embedding", e, ["data"])
    L.embedding(T, vocab, hidden)
    L.dropout(T * hidden)
    L.out_bytes = e * T * hidden
    layers.append(L)
    for i in range(1, layers_per_side + 1):
        L = Layer("encoder%d" % i, "lstm", e)
        if i == 1:
            L.lstm(b, seq, hidden, hidden, directions=2)
            width = 2 * hidden
        else:
            L.lstm(b, seq, 2 * hidden if i == 2 else hidden, hidden)
            width = hidden
            if i >= 3:
                L.add(T * hidden)
        L.dropout(T * width)
        L.out_bytes = e * T * width
        layers.append(L)
    encoder_out = layers[-1].name

    L = Layer("decoder_embedding", "embedding", e, ["data"])
    L.embedding(T, vocab, hidden)
    L.dropout(T * hidden)
    L.out_bytes = e * T * hidden
    layers.append(L)
    for i in range(1, layers_per_side + 1):
        if i == 1:
            L = Layer("decoder1_attention", "lstm_attention", e,
                      ["decoder_embedding", encoder_out])
            L.lstm(b, seq, hidden, hidden)
            # Normalised Bahdanau attention: project keys and queries,
            # score tanh(q + k) . v over (target x source x hidden),
            # softmax, context = scores x values.
            L.gemm(T, hidden, hidden, bias=False)  # keys
            L.gemm(T, hidden, hidden)  # queries
            L.elementwise(b * seq * seq * hidden, reads=2,  # tanh(q + k),
                          writes=1, kind="tanh")  # saved by the next bmm
            L.bmm(b * seq, 1, seq, hidden)  # . v
            L.params += hidden + 1  # v and the normalisation scalar
            L.softmax_cross_entropy(b * seq, seq)  # softmax over sources
            L.bmm(b, seq, hidden, seq)  # context
        else:
            L = Layer("decoder%d" % i, "lstm", e)
            L.lstm(b, seq, 2 * hidden, hidden)
            if i >= 3:
                L.add(T * hidden)
        L.dropout(T * hidden)
        last = i == layers_per_side
        L.out_bytes = e * T * hidden * (1 if last else 2)
        layers.append(L)

    L = Layer("classifier", "linear_loss", e, [layers[-1].name, "data"])
    L.gemm(T, vocab, hidden)
    L.softmax_cross_entropy(T, vocab)
    L.out_bytes = 4
    layers.append(L)
    return layers


#===----------------------------------------------------------------------===#
# Transformers: BERT, GPT-3
#===----------------------------------------------------------------------===#

def transformer_layer(L, b, s, h, heads, tp=1, intra_bw=None, intra_lat=None):
    """One transformer layer (attention + 4h MLP) on b x s tokens, split
    t-ways by Megatron tensor parallelism when tp > 1.

    FLOPs: 24bsh^2 + 4bs^2h forward (thesis.md §4.6), / t per GPU.
    Saved: sbh(16e + 2) + as^2b(2e + 1) bytes for t = 1 (34sbh + 5as^2b
    in fp16, Korthikanti et al.), sbh(10 + 24/t + 5as/(ht)) in fp16 for t.
    Tensor parallelism adds two allreduces of b x s x h forward and two
    backward (thesis.md §7: 8bsh(t-1)/t bytes per layer).
    """
    e = L.e
    T = b * s
    a = heads // tp
    L.layernorm(T * h, h)
    L.gemm(T, 3 * h // tp, h)  # QKV (column parallel)
    L.bmm(b * a, s, s, h // heads)  # Q K^T
    L.elementwise(b * a * s * s, reads=1, writes=1,
                  saved=e * b * a * s * s, kind="softmax")  # scale, mask
    L.dropout(b * a * s * s)
    L.bmm(b * a, s, h // heads, s)  # attention x V
    L.gemm(T, h, h // tp, bias=False)  # output projection (row parallel)
    L.params += h  # its bias, replicated
    L.add(T * h, operands=3)  # bias + dropout + residual
    L.saved += T * h  # dropout mask
    L.layernorm(T * h, h)
    L.gemm(T, 4 * h // tp, h)  # fc1 (column parallel)
    L.elementwise(T * 4 * h // tp, reads=1, writes=1,
                  saved=e * T * 4 * h // tp, kind="gelu")
    L.gemm(T, h, 4 * h // tp, bias=False)  # fc2 (row parallel)
    L.params += h
    L.add(T * h, operands=3)
    L.saved += T * h
    if tp > 1:
        ar = ring_allreduce_seconds(e * T * h, tp, intra_bw, intra_lat)
        L.comm(2 * ar, 2 * ar)


def bert(layers_count, b, seq=512, h=1024, heads=16, vocab=30522):
    """BERT (Devlin et al.) fine-tuned on SQuAD as in DAPPLE: embeddings
    (word, position, segment; LayerNorm, dropout), post-LN transformer
    layers, and the span-prediction head (h -> 2, loss)."""
    e = 4
    T = b * seq
    layers = []
    L = Layer("embeddings", "embedding", e)
    L.embedding(T, vocab, h)
    L.embedding(T, seq, h)
    L.embedding(T, 2, h)
    L.add(T * h, operands=3)
    L.layernorm(T * h, h)
    L.dropout(T * h)
    L.out_bytes = e * T * h
    layers.append(L)
    for i in range(1, layers_count + 1):
        L = Layer("layer%d" % i, "transformer", e)
        transformer_layer(L, b, seq, h, heads)
        L.out_bytes = e * T * h
        layers.append(L)
    L = Layer("qa_head", "linear_loss", e)
    L.gemm(T, 2, h)
    L.softmax_cross_entropy(2 * b, seq)
    L.out_bytes = 4
    layers.append(L)
    return layers


# DGX A100 NVSwitch: 600 GB/s bidirectional = 300 GB/s each way per GPU;
# the same link numbers as examples/topologies/selene-a100-*.json.
NVSWITCH_A100_BW = 3.0e11
NVSWITCH_LATENCY = 5.0e-6


def gpt3(b, tp=1, l=96, h=12288, heads=96, s=2048, vocab=51200):
    """GPT-3 175B as trained by Megatron (thesis.md §4.6): word and
    position embeddings, l pre-LN transformer layers, final LayerNorm and
    the output layer tied to the word embeddings, fp32 cross-entropy.

    Mixed precision: fp16 activations (e = 2); param_bytes = 4 bytes per
    parameter (fp32 master weights). Unique parameters:
        P = 12lh^2 (1 + 13/(12h) + (V + s)/(12lh))        (4.3)
    plus the final LayerNorm's 2h. The last stage keeps a copy of the
    word embedding for the tied output layer (Megatron does the same and
    allreduces its gradient with the first stage): its param_bytes include
    the copy, `params` does not, `tied_params` counts it.

    FLOPs per microbatch (checked by test/unittests/cost):
        forward            24bslh^2 (1 + s/(6h) + V/(12lh))
        forward+backward   72bslh^2 (1 + s/(6h) + V/(12lh))
        + recomputation    96bslh^2 (1 + s/(6h) + V/(16lh))   (4.2)
    With tp > 1 every number is per GPU of a t-way tensor-parallel group
    (vocabulary-parallel embedding and output layer).
    """
    e = 2
    T = b * s
    bw, lat = NVSWITCH_A100_BW, NVSWITCH_LATENCY
    ar = ring_allreduce_seconds(e * T * h, tp, bw, lat) if tp > 1 else 0.0
    layers = []
    L = Layer("embedding", "embedding", e)
    L.embedding(T, vocab // tp, h)
    L.embedding(T, s, h)
    L.add(T * h)
    L.dropout(T * h)
    L.comm(ar, 0.0)  # vocabulary-parallel lookup: allreduce the rows
    L.out_bytes = e * T * h // tp  # scatter/gather across the stage link
    layers.append(L)
    for i in range(1, l + 1):
        L = Layer("layer%d" % i, "transformer", e)
        transformer_layer(L, b, s, h, heads, tp, bw, lat)
        L.out_bytes = e * T * h // tp
        layers.append(L)
    L = Layer("head", "linear_loss", e)
    L.layernorm(T * h, h)
    L.gemm(T, vocab // tp, h, bias=False)
    L.params -= h * (vocab // tp)  # tied: the weights belong to `embedding`
    L.tied_params = h * (vocab // tp)
    L.param_bytes = PARAM_BYTES * (L.params + L.tied_params)
    L.softmax_cross_entropy(T, vocab // tp, e=4)
    L.comm(0.0, ar)  # column-parallel output layer: input-gradient allreduce
    L.out_bytes = 4
    layers.append(L)
    return layers


#===----------------------------------------------------------------------===#
# Output
#===----------------------------------------------------------------------===#

PROFILES = [
    # file, model, device, microbatch, precision, builder, note
    ("vgg16.json", "VGG-16", "v100", 64, "fp32",
     lambda: vgg(16, 64),
     "PipeDream (SOSP'19) Table 1 / pipedream.md sec. 6.2: fp32 on V100, "
     "224x224 ImageNet, per-GPU minibatch 64."),
    ("vgg19.json", "VGG-19", "v100", 32, "fp32",
     lambda: vgg(19, 32),
     "DAPPLE Table II / dapple.md sec. 5: fp32 on V100, profiling batch 32."),
    ("resnet50.json", "ResNet-50", "v100", 128, "fp32",
     lambda: resnet((3, 4, 6, 3), 128),
     "PipeDream and DAPPLE: fp32 on V100, 224x224 ImageNet, batch 128. "
     "Skip connections are the join ops' inputs."),
    ("resnet50-1000px.json", "ResNet-50", "v100", 8, "fp32",
     lambda: resnet((3, 4, 6, 3), 8, image=1000),
     "MadPipe sec. 5.1 / madpipe.md: 1000x1000 images, mini-batch 8 (the "
     "paper names no GPU; fp32 V100 assumed)."),
    ("resnet101-1000px.json", "ResNet-101", "v100", 8, "fp32",
     lambda: resnet((3, 4, 23, 3), 8, image=1000),
     "MadPipe sec. 5.1 / madpipe.md: 1000x1000 images, mini-batch 8 (the "
     "paper names no GPU; fp32 V100 assumed)."),
    ("gnmt16.json", "GNMT-16", "v100", 64, "fp32",
     lambda: gnmt(64),
     "PipeDream / DAPPLE: 8 encoder + 8 decoder LSTM layers of 1024, fp32 "
     "on V100, batch 64; sequence length 50 and vocabulary 32320 (MLPerf "
     "GNMT) are our assumptions."),
    ("bert48.json", "BERT-48", "v100", 2, "fp32",
     lambda: bert(48, 2),
     "DAPPLE Table II: 48 layers, h = 1024, 16 heads, fp32 on V100, "
     "batch 2; sequence length 512 assumed (DAPPLE fine-tunes on SQuAD "
     "2.0)."),
    ("bert-large.json", "BERT-Large", "v100", 2, "fp32",
     lambda: bert(24, 2),
     "DAPPLE Table VII: 24 layers, h = 1024, 16 heads, fp32 on V100; "
     "microbatch not given, BERT-48's 2 used; sequence length 512."),
    ("amoebanet36.json", "AmoebaNet-36-like", "v100", 1, "fp32",
     lambda: amoebanet(1),
     "DAPPLE: AmoebaNet-36 (933M parameters), fp32 on V100, batch 1, "
     "224x224. A cell-based stand-in: 36 normal cells in three groups of "
     "12 (f = %d, 2f, 4f filters), two reduction cells, each cell a left "
     "branch, a right branch and a join." % AMOEBA_FILTERS),
    ("gpt3-175b.json", "GPT-3 175B", "a100-80gb-fp16", 1, "mixed fp16",
     lambda: gpt3(1),
     "Megatron PTD-P (thesis.md sec. 4.6, sec. 6.3, Table 4.2): l = 96, "
     "h = 12288, 96 heads, s = 2048, V = 51200, microbatch 1, mixed "
     "precision on A100 80 GB; one GPU per layer (no tensor parallelism)."),
    ("gpt3-175b-tp8.json", "GPT-3 175B (t = 8)", "a100-80gb-fp16", 1,
     "mixed fp16",
     lambda: gpt3(1, tp=8),
     "As gpt3-175b.json with Megatron's 8-way tensor parallelism inside a "
     "DGX A100 node: every number is per GPU; the NVSwitch allreduces "
     "(300 GB/s, 5 us, ring) are in fwd_s/bwd_s; out_bytes are per GPU "
     "(scatter/gather). Use with examples/topologies/selene-a100-tp8-*."),
]


def render(model, device_name, microbatch, precision, note, layers,
           device=None):
    device = device or Device(device_name)
    names = set()
    ops = []
    previous = None
    for layer in layers:
        assert layer.name not in names, layer.name
        names.add(layer.name)
        for producer in layer.inputs or []:
            assert producer in names, (layer.name, producer)
        ops.append(layer.to_json(device, previous))
        previous = layer.name
    head = [("format", "pipec.profile/1"), ("model", model),
            ("device", device_name), ("microbatch", microbatch),
            ("precision", precision), ("note", note),
            ("generator", "examples/profiles/make_profiles.py"),
            ("device_model", device.as_json())]
    lines = ["{"]
    for key, value in head:
        lines.append("  %s: %s," % (json.dumps(key), json.dumps(value)))
    lines.append('  "ops": [')
    for i, op in enumerate(ops):
        comma = "," if i + 1 < len(ops) else ""
        lines.append("    " + json.dumps(op) + comma)
    lines.append("  ]")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.dirname(
        os.path.abspath(__file__)), help="output folder")
    parser.add_argument("--check", action="store_true",
                        help="compare with the files instead of writing")
    parser.add_argument("--measured", metavar="DEVICE.json",
                        help="write one profile (--only) with the kernel "
                        "efficiencies of this pipec.device/1 file (pipec "
                        "calibrate) instead of the datasheet's")
    parser.add_argument("--as-row", metavar="ROW",
                        help="with --measured: the datasheet row the "
                        "efficiencies move to (default: the profile's own)")
    parser.add_argument("--only", metavar="FILE",
                        help="with --measured: the profile to write "
                        "(e.g. gpt3-175b-tp8.json)")
    parser.add_argument("-o", dest="output", metavar="PATH",
                        help="with --measured: where to write it")
    args = parser.parse_args()
    if args.measured:
        return write_measured(args)
    stale = []
    for filename, model, device, microbatch, precision, build, note in \
            PROFILES:
        text = render(model, device, microbatch, precision, note, build())
        path = os.path.join(args.out, filename)
        if args.check:
            try:
                with open(path) as f:
                    if f.read() != text:
                        stale.append(filename)
            except OSError:
                stale.append(filename)
        else:
            with open(path, "w") as f:
                f.write(text)
    if stale:
        print("out of date: " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


def write_measured(args):
    """One profile of PROFILES with a MeasuredDevice's times."""
    entry = next((p for p in PROFILES if p[0] == args.only), None)
    if entry is None or not args.output:
        print("--measured needs --only FILE (one of %s) and -o PATH" %
              ", ".join(p[0] for p in PROFILES), file=sys.stderr)
        return 2
    filename, model, row, microbatch, precision, build, note = entry
    row = args.as_row or row
    if row not in DEVICES:
        print("--as-row: unknown row %r (known: %s)" %
              (row, ", ".join(DEVICES)), file=sys.stderr)
        return 2
    device = MeasuredDevice(args.measured, as_row=row)
    note += (" Kernel times from the efficiencies of %s (%s), measured on "
             "that device, moved to %s's datasheet peak and bandwidth "
             "(each kernel keeps the share it reached there)." %
             (os.path.basename(args.measured), device.measured_name, row))
    text = render(model, row, microbatch, precision, note, build(), device)
    with open(args.output, "w") as f:
        f.write(text)
    print("wrote %s (%s with %s's efficiencies)" %
          (args.output, row, device.measured_name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
