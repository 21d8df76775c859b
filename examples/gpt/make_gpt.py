#!/usr/bin/python3
"""Writes a tiny GPT (decoder-only transformer) as ONNX, deterministically.

    /usr/bin/python3 examples/gpt/make_gpt.py [-o examples/gpt/gpt.onnx]
        [--batch 8] [--seq 64] [--layers 4] [--dim 128] [--heads 4]
        [--vocab 256] [--data-steps 4]

The graph follows what torch.onnx.export (opset 17) emits for a GPT-2 style
model: token and position embeddings (Gather), pre-norm blocks with
LayerNormalization, fused QKV projection (MatMul + Add) split into q, k, v,
head reshapes whose target shapes are computed by Shape -> Gather ->
Unsqueeze -> Concat subgraphs, attention scores scaled by a Sqrt of a Cast
of a Shape entry, an additive causal mask, Softmax, the erf form of GELU
(Div, Erf, Add, Mul, Mul), residual Adds, a final LayerNorm and an untied
LM head. The logits are flattened to [B*T, vocab], as training scripts do
before the cross-entropy, so the labels are [B, T] next-token ids.
With --data-steps it writes x.npy (token ids [N, T]) and y.npy (the next
tokens, [N, T]) of a learnable synthetic sequence task.
"""
import argparse
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class Builder:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits = [], []
        self.n = 0

    def t(self, prefix):
        self.n += 1
        return f"/{prefix}/out_{self.n}"

    def node(self, op, inputs, name, outputs=1, **attrs):
        outs = [self.t(name) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=f"/{name}/{op}_{self.n}", **attrs))
        return outs[0] if outputs == 1 else outs

    def weight(self, name, shape, std=0.02):
        a = self.rng.standard_normal(shape).astype(np.float32) * std
        self.inits.append(numpy_helper.from_array(a, name))
        return name

    def const(self, name, array):
        """A literal: a Constant node, as exporters emit for Python values
        (initializers are parameters and would be trained)."""
        self.nodes.append(helper.make_node(
            "Constant", [], [name], name=f"/Constant_{name}",
            value=numpy_helper.from_array(np.asarray(array), name)))
        return name

    def param(self, name, array):
        self.inits.append(numpy_helper.from_array(np.asarray(array, np.float32), name))
        return name

    def layer_norm(self, x, prefix, dim):
        g = self.param(f"{prefix}.weight", np.ones(dim))
        b = self.param(f"{prefix}.bias", np.zeros(dim))
        return self.node("LayerNormalization", [x, g, b], prefix, axis=-1, epsilon=1e-5)

    def linear(self, x, prefix, din, dout):
        w = self.weight(f"{prefix}.weight", (din, dout))
        b = self.param(f"{prefix}.bias", np.zeros(dout))
        return self.node("Add", [self.node("MatMul", [x, w], prefix), b], prefix)

    def dim_of(self, x, index, prefix):
        """Shape(x)[index] as a 1-element tensor (the exporter's pattern)."""
        shape = self.node("Shape", [x], prefix)
        idx = self.const(f"{prefix}.idx{index}_{self.n}", np.array(index, np.int64))
        d = self.node("Gather", [shape, idx], prefix, axis=0)
        axes = self.const(f"{prefix}.axes{self.n}", np.array([0], np.int64))
        return self.node("Unsqueeze", [d, axes], prefix)


def build(batch, seq, layers, dim, heads, vocab, seed=0, padding_mask=False):
    bld = Builder(seed)
    dh = dim // heads
    wte = bld.weight("wte.weight", (vocab, dim))
    wpe = bld.weight("wpe.weight", (seq, dim))
    tok = bld.node("Gather", [wte, "input_ids"], "wte", axis=0)
    positions = bld.const("position_ids", np.arange(seq, dtype=np.int64))
    pos = bld.node("Gather", [wpe, positions], "wpe", axis=0)
    x = bld.node("Add", [tok, pos], "embed")
    mask = np.triu(np.full((seq, seq), -1e4, np.float32), k=1)
    causal = bld.const("causal_mask", mask)
    if padding_mask:
        # Key padding mask computed at run time from the ids (token 0 pads):
        # Equal -> Unsqueeze to [B, 1, 1, T] -> Where on the scores.
        pad_id = bld.const("pad_id", np.array(0, np.int64))
        is_pad = bld.node("Equal", ["input_ids", pad_id], "pad_mask")
        pad_axes = bld.const("pad_mask.axes", np.array([1, 2], np.int64))
        pad4 = bld.node("Unsqueeze", [is_pad, pad_axes], "pad_mask")
        masked_value = bld.const("pad_mask.value", np.array(-1e4, np.float32))
    for l in range(layers):
        p = f"h.{l}"
        h = bld.layer_norm(x, f"{p}.ln_1", dim)
        qkv = bld.linear(h, f"{p}.attn.c_attn", dim, 3 * dim)
        split = bld.const(f"{p}.split", np.array([dim, dim, dim], np.int64))
        q, k, v = bld.node("Split", [qkv, split], f"{p}.attn", outputs=3, axis=2)
        # [B, T, H, dh] with B taken from the tensor's shape at run time.
        bdim = bld.dim_of(h, 0, f"{p}.attn.shape")
        rest = bld.const(f"{p}.attn.rest", np.array([seq, heads, dh], np.int64))
        shape4 = bld.node("Concat", [bdim, rest], f"{p}.attn.shape", axis=0)
        heads_q = bld.node("Transpose", [bld.node("Reshape", [q, shape4], f"{p}.attn.q")], f"{p}.attn.q", perm=[0, 2, 1, 3])
        heads_k = bld.node("Transpose", [bld.node("Reshape", [k, shape4], f"{p}.attn.k")], f"{p}.attn.k", perm=[0, 2, 3, 1])
        heads_v = bld.node("Transpose", [bld.node("Reshape", [v, shape4], f"{p}.attn.v")], f"{p}.attn.v", perm=[0, 2, 1, 3])
        scores = bld.node("MatMul", [heads_q, heads_k], f"{p}.attn")
        # scale = sqrt(dh), computed from the shape as exporters do.
        dh_dim = bld.dim_of(heads_q, 3, f"{p}.attn.scale")
        scale = bld.node("Sqrt", [bld.node("Cast", [dh_dim], f"{p}.attn.scale", to=TensorProto.FLOAT)], f"{p}.attn.scale")
        scores = bld.node("Add", [bld.node("Div", [scores, scale], f"{p}.attn"), causal], f"{p}.attn")
        if padding_mask:
            scores = bld.node("Where", [pad4, masked_value, scores], f"{p}.attn.pad")
        probs = bld.node("Softmax", [scores], f"{p}.attn", axis=-1)
        ctx = bld.node("Transpose", [bld.node("MatMul", [probs, heads_v], f"{p}.attn")], f"{p}.attn", perm=[0, 2, 1, 3])
        flat_shape = bld.const(f"{p}.attn.merge", np.array([0, seq, dim], np.int64))
        ctx = bld.node("Reshape", [ctx, flat_shape], f"{p}.attn")
        x = bld.node("Add", [x, bld.linear(ctx, f"{p}.attn.c_proj", dim, dim)], f"{p}")
        h = bld.layer_norm(x, f"{p}.ln_2", dim)
        up = bld.linear(h, f"{p}.mlp.c_fc", dim, 4 * dim)
        # GELU, erf form: 0.5 x (1 + erf(x / sqrt 2)).
        sqrt2 = bld.const(f"{p}.mlp.sqrt2", np.array(1.4142135381698608, np.float32))
        one = bld.const(f"{p}.mlp.one", np.array(1.0, np.float32))
        half = bld.const(f"{p}.mlp.half", np.array(0.5, np.float32))
        erf = bld.node("Erf", [bld.node("Div", [up, sqrt2], f"{p}.mlp.act")], f"{p}.mlp.act")
        gelu = bld.node("Mul", [bld.node("Mul", [up, bld.node("Add", [erf, one], f"{p}.mlp.act")], f"{p}.mlp.act"), half], f"{p}.mlp.act")
        x = bld.node("Add", [x, bld.linear(gelu, f"{p}.mlp.c_proj", 4 * dim, dim)], f"{p}")
    x = bld.layer_norm(x, "ln_f", dim)
    head = bld.weight("lm_head.weight", (dim, vocab))
    logits = bld.node("MatMul", [x, head], "lm_head")
    flat = bld.const("logits_shape", np.array([-1, vocab], np.int64))
    bld.nodes.append(helper.make_node("Reshape", [logits, flat], ["logits"], name="/Reshape_logits"))
    graph = helper.make_graph(
        bld.nodes, "gpt",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [batch, seq])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch * seq, vocab])],
        bld.inits)
    model = helper.make_model(graph, producer_name="pipec-examples",
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def make_data(batch, steps, seq, vocab, seed=1):
    """Sequences of a noisy affine recurrence mod vocab: learnable, and the
    label of position t is the token at t+1."""
    rng = np.random.default_rng(seed)
    n = batch * steps
    start = rng.integers(0, vocab, n)
    stride = rng.integers(1, 8, n)
    t = np.arange(seq + 1)
    tokens = (start[:, None] + stride[:, None] * t[None, :]) % vocab
    return tokens[:, :-1].astype(np.int64), tokens[:, 1:].astype(np.int64)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("-o", "--output", default=os.path.join(here, "gpt.onnx"))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--data-steps", type=int, default=0)
    ap.add_argument("--padding-mask", action="store_true",
                    help="mask the keys whose token id is 0, computed at run time "
                         "(Equal, Unsqueeze, Where)")
    args = ap.parse_args()
    model = build(args.batch, args.seq, args.layers, args.dim, args.heads, args.vocab,
                  padding_mask=args.padding_mask)
    onnx.save(model, args.output)
    print(f"wrote {args.output}")
    if args.data_steps:
        x, y = make_data(args.batch, args.data_steps, args.seq, args.vocab)
        d = os.path.dirname(os.path.abspath(args.output))
        np.save(os.path.join(d, "x.npy"), x)
        np.save(os.path.join(d, "y.npy"), y)
        print(f"wrote {d}/x.npy {x.shape} and {d}/y.npy {y.shape}")


if __name__ == "__main__":
    main()
