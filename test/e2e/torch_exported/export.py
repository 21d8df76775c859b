#!/usr/bin/python3
"""Exports small models with PyTorch's own exporter and records what PyTorch
computes when it trains them, so that pipec can be checked against both
without PyTorch (the tests never import torch).

    /usr/bin/python3 test/e2e/torch_exported/export.py [--models resnet,...] [--out DIR]

Needs Debian's python3-torch and python3-torchvision (1.13 / 0.14); run it by
hand when a model changes and commit what it writes. For each model NAME it
writes DIR/NAME/:

  model.onnx      torch.onnx.export(..., training=TrainingMode.TRAINING,
                  do_constant_folding=False, dynamic batch axis), the form
                  a training export has: Dropout with its mask output,
                  BatchNormalization with its statistics outputs, buffers
                  (masks) as initializers, the shape subgraphs of .view /
                  .size / arange written out as Shape/Gather/Range nodes
  x.npy, y.npy    STEPS global batches of inputs and integer labels
  reference.json  the global batch, microbatches, learning rate and opset,
                  PyTorch's loss per step, the ONNX initializers that hold
                  parameters and buffers, and the tolerances: 1e-4
                  relative, widened to ten times the float32-vs-float64
                  difference of PyTorch's own run where float32 does not
                  determine a result better (tensors whose gradient is zero
                  up to rounding; later steps of a chaotic model)
  reference.npz   every initializer after each of the STEPS steps of
                  PyTorch training, keyed "step<k>/<ONNX name>" (state_dict
                  names in a training export)
  reference64.npz the same after each step of PyTorch's float64 run (the
                  losses are reference.json's "losses64"): the oracle of
                  pipec's float64 mode, `--precision f64`, to 1e-9

PyTorch's run is what pipec's synchronous schedules compute: per step, the
global batch is cut into `microbatches` equal microbatches, each one's
softmax cross-entropy (mean over its rows) is divided by the microbatch
count and back-propagated, gradients accumulate, and plain SGD updates once.
Batch normalization takes its statistics per microbatch and updates its
running statistics once per microbatch, in microbatch order; the reference
running variance is the one ONNX's BatchNormalization defines (population
variance of the batch), not the unbiased one PyTorch's module keeps. The
inputs are large enough that no BatchNorm normalises fewer than 8 values
per channel (fewer makes its gradient noise). Dropout layers
have p = 0 so that both sides compute the same masks.

The models use torchvision's building blocks where they are small enough:
BasicBlock (ResNet), make_layers (VGG) and mobilenet_v2 (width 0.25), plus a
model of the pieces MobileNetV3 and DenseNet add (Hardswish, Hardsigmoid
gating, padding with a value and a cropping pad, ceil_mode pooling), a
small U-Net (ConvTranspose2d with stride, output_padding and groups,
nearest Upsample, bilinear interpolation, a concatenated skip, per-pixel
classes), an MLP through
ELU/SELU/CELU/Softplus/Softsign, Sign, tril and repeat, a
GPT written as nanoGPT writes it (.view/.transpose attention, masked_fill
with a causal buffer, erf GELU; gpt_tied also ties the output projection
to the token embedding, as nanoGPT does) and a BERT-style encoder from
nn.TransformerEncoderLayer (nn.MultiheadAttention's packed in-projection,
sliced per head).
"""
import argparse
import copy
import json
import os

import numpy as np
import onnx
from onnx import numpy_helper
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from torchvision.models.resnet import BasicBlock

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 3
TOL = 1e-4


class TinyResNet(nn.Module):
    """torchvision's BasicBlock at widths 8 and 16."""

    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)
        down = nn.Sequential(nn.Conv2d(8, 16, 1, stride=2, bias=False), nn.BatchNorm2d(16))
        self.layer1 = nn.Sequential(BasicBlock(8, 8), BasicBlock(8, 16, stride=2, downsample=down))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(16, classes)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer1(x)
        return self.fc(torch.flatten(self.avgpool(x), 1))


class TinyVGG(nn.Module):
    """torchvision's VGG feature extractor (make_layers) and a small head."""

    def __init__(self, classes=10):
        super().__init__()
        self.features = torchvision.models.vgg.make_layers([8, "M", 16, "M", 32, 32, "M"])
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.classifier = nn.Sequential(nn.Linear(32, 32), nn.ReLU(True), nn.Dropout(p=0.0),
                                        nn.Linear(32, classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


class GPT(nn.Module):
    """nanoGPT's structure: causal self-attention through .view/.transpose,
    masked_fill with a lower-triangular buffer, erf GELU, logits [B*T, V]."""

    def __init__(self, vocab=64, dim=32, heads=2, layers=2, seq=16, tied=False):
        super().__init__()
        self.heads = heads
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(
            nn.ModuleDict(dict(ln_1=nn.LayerNorm(dim), c_attn=nn.Linear(dim, 3 * dim),
                               c_proj=nn.Linear(dim, dim), ln_2=nn.LayerNorm(dim),
                               c_fc=nn.Linear(dim, 4 * dim), mlp_proj=nn.Linear(4 * dim, dim)))
            for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        if tied:  # nanoGPT's weight tying: one parameter, read by the first and last layer
            nn.init.normal_(self.wte.weight, std=0.02)
            self.lm_head.weight = self.wte.weight
        self.register_buffer("bias", torch.tril(torch.ones(seq, seq)).view(1, 1, seq, seq))

    def forward(self, idx):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long).unsqueeze(0)
        x = self.wte(idx) + self.wpe(pos)
        for blk in self.blocks:
            h = blk["ln_1"](x)
            c = x.size(-1)
            q, k, v = blk["c_attn"](h).split(c, dim=2)
            q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
            k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
            v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / (k.size(-1) ** 0.5))
            att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
            x = x + blk["c_proj"](y)
            x = x + blk["mlp_proj"](F.gelu(blk["c_fc"](blk["ln_2"](x))))
        return self.lm_head(self.ln_f(x)).view(b * t, -1)


class Bert(nn.Module):
    """nn.TransformerEncoder (post-norm, GELU, batch_first) on token and
    learned position embeddings; logits [B*T, V]."""

    def __init__(self, vocab=64, dim=32, heads=2, layers=2, seq=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(1, seq, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, activation="gelu",
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx):
        b, t = idx.shape
        return self.head(self.encoder(self.emb(idx) + self.pos)).view(b * t, -1)


class Mixed(nn.Module):
    """The pieces MobileNetV3, DenseNet and friends add: Hardswish,
    Hardsigmoid gating (squeeze-excitation), ReLU6, LeakyReLU, tanh-GELU,
    constant padding with a value and a negative (cropping) pad, and
    average pooling with ceil_mode."""

    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.act1 = nn.Hardswish()
        self.pad = nn.ConstantPad2d((1, 2, 0, 1), 0.5)
        self.conv2 = nn.Conv2d(8, 8, 3, groups=2)
        self.se_reduce = nn.Conv2d(8, 4, 1)
        self.se_expand = nn.Conv2d(4, 8, 1)
        self.gate = nn.Hardsigmoid()
        self.pool = nn.AvgPool2d(3, stride=2, ceil_mode=True, count_include_pad=False)
        self.fc1 = nn.Linear(8 * 7 * 8, 32)
        self.fc2 = nn.Linear(32, classes)

    def forward(self, x):
        x = self.act1(self.bn1(self.conv1(x)))
        x = F.relu6(self.conv2(self.pad(x)))
        x = F.pad(x, (-1, 0, 0, -1))  # crop one column left, one row at the bottom
        s = F.adaptive_avg_pool2d(x, 1)
        x = x * self.gate(self.se_expand(F.leaky_relu(self.se_reduce(s), 0.1)))
        x = self.pool(x)
        return self.fc2(F.gelu(self.fc1(torch.flatten(x, 1)), approximate="tanh"))


class Activations(nn.Module):
    """An MLP through the activations exporters write as their own ONNX
    operators (ELU, SELU, CELU, Softplus, Softsign), a sign-gated branch,
    a lower-triangular (tril) mixing matrix and a repeat (Tile)."""

    def __init__(self, classes=10):
        super().__init__()
        self.l1 = nn.Linear(12, 16)
        self.l2 = nn.Linear(16, 16)
        self.l3 = nn.Linear(16, 16)
        self.l4 = nn.Linear(16, 8)
        self.mix = nn.Parameter(torch.randn(16, 16) * 0.3)
        self.out = nn.Linear(16, classes)

    def forward(self, x):
        h = F.elu(self.l1(x), alpha=0.7)
        h = F.selu(self.l2(h)) + F.celu(self.l2(h), alpha=1.5)
        h = F.softplus(self.l3(h)) * torch.sign(h)
        h = h @ torch.tril(self.mix)
        h = F.softsign(self.l4(h)).repeat(1, 2)
        return self.out(h)


class TinyUNet(nn.Module):
    """An encoder-decoder with a skip connection: strided convolutions
    down, ConvTranspose2d (stride 2, output_padding, groups) and
    nearest Upsample back up, torch.cat of the skip, FCN-style side
    outputs upsampled bilinearly (align_corners False and True), per-pixel
    classes flattened to [B*H*W, classes] (segmentation)."""

    def __init__(self, classes=5):
        super().__init__()
        self.enc1 = nn.Conv2d(3, 8, 3, padding=1)
        self.enc2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.enc3 = nn.Conv2d(16, 16, 3, stride=2, padding=1)
        self.up1 = nn.ConvTranspose2d(16, 16, 3, stride=2, padding=1, output_padding=1, groups=2)
        self.up2 = nn.Upsample(scale_factor=2, mode="nearest")
        self.dec = nn.Conv2d(16 + 8, 8, 3, padding=1)
        self.side = nn.Conv2d(16, 8, 1)
        self.head = nn.Conv2d(8, classes, 1)

    def forward(self, x):
        e1 = F.relu(self.enc1(x))
        e2 = F.relu(self.enc2(e1))
        e3 = F.relu(self.enc3(e2))
        d = F.relu(self.up1(e3)) + e2
        d = torch.cat([self.up2(d), e1], dim=1)
        # FCN-style side outputs, bilinearly upsampled (both corner modes).
        side = self.side(e3)
        d = F.relu(self.dec(d)) + F.interpolate(side, scale_factor=4, mode="bilinear",
                                                align_corners=False)
        d = d + F.interpolate(side, size=(16, 16), mode="bilinear", align_corners=True)
        y = self.head(d)
        b, c, h, w = y.shape
        return y.permute(0, 2, 3, 1).reshape(b * h * w, c)


def image_data(rng, shape, classes):
    x = rng.standard_normal((STEPS,) + shape).astype(np.float32)
    y = rng.integers(0, classes, (STEPS, shape[0])).astype(np.int64)
    return x, y


def segmentation_data(rng, shape, classes):
    x = rng.standard_normal((STEPS,) + shape).astype(np.float32)
    y = rng.integers(0, classes, (STEPS, shape[0], shape[2], shape[3])).astype(np.int64)
    return x, y


def token_data(rng, batch, seq, vocab):
    x = rng.integers(0, vocab, (STEPS, batch, seq)).astype(np.int64)
    # Next-token labels of a learnable sequence: the id after each id.
    y = (x + 1) % vocab
    return x, y


# name: (constructor, opset, data, microbatches, learning rate)
MODELS = {
    "resnet": (TinyResNet, 13, lambda r: image_data(r, (8, 3, 16, 16), 10), 2, 0.05),
    "vgg": (TinyVGG, 15, lambda r: image_data(r, (8, 3, 16, 16), 10), 2, 0.05),
    "mobilenet": (lambda: torchvision.models.mobilenet_v2(width_mult=0.25, num_classes=10, dropout=0.0),
                  17, lambda r: image_data(r, (8, 3, 64, 64), 10), 2, 0.01),
    "mixed": (Mixed, 17, lambda r: image_data(r, (8, 3, 16, 16), 10), 2, 0.05),
    "activations": (Activations, 17, lambda r: image_data(r, (8, 12), 10), 2, 0.1),
    "unet": (TinyUNet, 17, lambda r: segmentation_data(r, (4, 3, 16, 16), 5), 2, 0.05),
    "gpt": (GPT, 13, lambda r: token_data(r, 4, 16, 64), 2, 0.1),
    "gpt_tied": (lambda: GPT(tied=True), 17, lambda r: token_data(r, 4, 16, 64), 2, 0.1),
    "bert": (Bert, 17, lambda r: token_data(r, 4, 16, 64), 2, 0.1),
    # The CNN structures whose float32 gradients disagreed with PyTorch's
    # beyond float32 noise at small sizes (issue 11), built from
    # torchvision's own classes at small widths; checked in float64 mode.
    "densenet": (lambda: torchvision.models.DenseNet(growth_rate=8, block_config=(2, 2),
                                                     num_init_features=16, bn_size=2,
                                                     num_classes=10),
                 17, lambda r: image_data(r, (8, 3, 32, 32), 10), 2, 0.01),
    "shufflenet": (lambda: torchvision.models.ShuffleNetV2([2, 2, 2], [8, 16, 32, 64, 128],
                                                           num_classes=10),
                   17, lambda r: image_data(r, (8, 3, 32, 32), 10), 2, 0.01),
    "regnet": (lambda: torchvision.models.RegNet(
                   torchvision.models.regnet.BlockParams.from_init_params(
                       depth=4, w_0=8, w_a=8.0, w_m=2.0, group_width=8, se_ratio=0.25),
                   num_classes=10),
               17, lambda r: image_data(r, (8, 3, 32, 32), 10), 2, 0.01),
}


def rel(a, b):
    n = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / (n if n > 0 else 1.0))


def train(model, xs, ys, microbatches, lr, dtype, names):
    """STEPS steps of SGD with gradient accumulation over the microbatches;
    returns the loss of every step and the named tensors after every step,
    with ONNX's running variances (see the module docstring)."""
    # ONNX's BatchNormalization updates the running variance with the
    # population variance of the batch; PyTorch's module (whose export
    # this is) uses the unbiased one: replay ONNX's.
    onnx_var = {}

    def track(module_name, bn):
        def hook(_, inputs):
            x = inputs[0].detach()
            dims = [0] + list(range(2, x.dim()))
            m = 1.0 - bn.momentum
            v = onnx_var.get(module_name, bn.running_var.detach().clone())
            onnx_var[module_name] = m * v + (1.0 - m) * x.var(dim=dims, unbiased=False)
        return hook

    for module_name, mod in model.named_modules():
        if isinstance(mod, nn.modules.batchnorm._BatchNorm):
            mod.register_forward_pre_hook(track(module_name, mod))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses, snapshots = [], []
    for step in range(STEPS):
        opt.zero_grad()
        xb, yb = torch.from_numpy(xs[step]), torch.from_numpy(ys[step])
        if xb.is_floating_point():
            xb = xb.to(dtype)
        total = 0.0
        for xm, ym in zip(xb.chunk(microbatches), yb.chunk(microbatches)):
            loss = F.cross_entropy(model(xm), ym.reshape(-1)) / microbatches
            loss.backward()
            total += float(loss)
        opt.step()
        losses.append(total)
        snap = {n: model.state_dict()[n].detach().numpy().copy() for n in names}
        for module_name, v in onnx_var.items():
            snap[module_name + ".running_var"] = v.numpy().copy()
        snapshots.append(snap)
    return losses, snapshots


def export(name, out):
    make, opset, data, microbatches, lr = MODELS[name]
    torch.manual_seed(0)
    model = make()
    model.train()
    rng = np.random.default_rng(0)
    xs, ys = data(rng)
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "model.onnx")
    sample = torch.from_numpy(xs[0])
    torch.onnx.export(model, (sample,), path, opset_version=opset,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                      input_names=["input"], output_names=["logits"],
                      dynamic_axes={"input": {0: "batch"}, "logits": {0: "rows"}})
    # The exporter ran the model in training mode (BatchNorm running
    # statistics moved): PyTorch trains from exactly what the file holds.
    onnx_model = onnx.load(path)
    state = model.state_dict()
    inits = [t.name for t in onnx_model.graph.initializer]
    unmapped = [n for n in inits if n not in state]
    if unmapped:
        raise SystemExit(f"{name}: initializers without a state_dict entry: {unmapped}")
    with torch.no_grad():
        for t in onnx_model.graph.initializer:
            a = numpy_helper.to_array(t)
            if a.shape != tuple(state[t.name].shape):
                raise SystemExit(f"{name}: initializer {t.name} has shape {a.shape}, "
                                 f"the module's {tuple(state[t.name].shape)}")
            state[t.name].copy_(torch.from_numpy(a.copy()))

    np.save(os.path.join(d, "x.npy"), xs.reshape((-1,) + xs.shape[2:]))
    np.save(os.path.join(d, "y.npy"), ys.reshape((-1,) + ys.shape[2:]))
    initial = copy.deepcopy(model)
    losses, snaps = train(model, xs, ys, microbatches, lr, torch.float32, inits)
    # The same run in float64 measures how well float32 determines each
    # result: where the two differ by more than TOL (a parameter whose
    # gradient is zero up to rounding, e.g. a BatchNorm bias whose shift
    # the next BatchNorm removes; steps after which a chaotic model has
    # amplified rounding), the test allows ten times that difference.
    losses64, snaps64 = train(initial.double(), xs, ys, microbatches, lr, torch.float64, inits)
    loss_tol = [max(TOL, 10 * abs(a - b) / abs(b)) for a, b in zip(losses, losses64)]
    tolerance = {}
    for k, (s32, s64) in enumerate(zip(snaps, snaps64), start=1):
        for n in inits:
            u = rel(s32[n], s64[n])
            if 10 * u > TOL:
                tolerance.setdefault(str(k), {})[n] = 10 * u
    np.savez(os.path.join(d, "reference.npz"),
             **{f"step{k}/{n}": v.astype(np.float32) for k, s32 in enumerate(snaps, start=1)
                for n, v in s32.items()})
    # The float64 run itself is the reference of pipec's float64 mode
    # (pipec compile --precision f64), checked to 1e-9.
    np.savez_compressed(os.path.join(d, "reference64.npz"),
                        **{f"step{k}/{n}": v.astype(np.float64)
                           for k, s64 in enumerate(snaps64, start=1) for n, v in s64.items()})
    params = {n for n, _ in model.named_parameters()}
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump({"format": "pipec.torch_reference/1", "torch": torch.__version__,
                   "opset": opset, "batch": int(xs.shape[1]), "microbatches": microbatches,
                   "lr": lr, "steps": STEPS, "losses": losses, "loss_tolerance": loss_tol,
                   "losses64": losses64,
                   "tolerance": tolerance,
                   "parameters": [n for n in inits if n in params],
                   "buffers": [n for n in inits if n not in params]}, f, indent=1)
    if tolerance or max(loss_tol) > TOL:
        print(f"{name}: tensors float32 determines only to more than {TOL}, after each step: "
              f"{', '.join(str(len(tolerance.get(str(k), {}))) for k in range(1, STEPS + 1))} "
              f"of {len(inits)}; loss tolerances {', '.join(f'{t:.1e}' for t in loss_tol)}")
    size = os.path.getsize(path)
    print(f"{name}: opset {opset}, {len(onnx_model.graph.node)} nodes, {len(inits)} initializers, "
          f"{size / 1024:.0f} KiB; losses {', '.join(f'{l:.6f}' for l in losses)}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--out", default=HERE)
    args = ap.parse_args()
    torch.set_num_threads(1)
    for name in args.models.split(","):
        export(name, args.out)


if __name__ == "__main__":
    main()
