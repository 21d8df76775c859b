#!/usr/bin/python3
"""Writes the example MLP classifier as ONNX, deterministically.

    /usr/bin/python3 examples/mlp/make_mlp.py [-o examples/mlp/mlp.onnx]
        [--batch 64] [--hidden 256,128,64] [--data-steps 4] [--data-seed 1]
        [--smooth]

The graph is what torch.onnx.export emits for nn.Sequential(Flatten, Linear,
ReLU, Linear, ReLU, Linear, Tanh, Linear): Flatten then Gemm(transB=1) with
ReLU/Tanh between, 28x28 inputs, 10 classes. Weights use PyTorch's default
Linear initialisation (uniform +-1/sqrt(fan_in)) from a fixed seed.
With --data-steps N it also writes x.npy / y.npy (N global batches of
synthetic, learnable data) beside the model. --smooth uses Tanh for every
hidden layer: float32 training runs that sum gradients in different orders
then stay within rounding of each other, while a ReLU input a few ulps from
zero may land on either side of the kink (see test/e2e/mlp_equivalence.py).
"""
import argparse
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def build(batch, hidden, seed=0, smooth=False):
    rng = np.random.default_rng(seed)
    sizes = [28 * 28] + hidden + [10]
    inits, nodes = [], []
    nodes.append(helper.make_node("Flatten", ["input"], ["/Flatten_output_0"],
                                  name="/Flatten", axis=1))
    prev = "/Flatten_output_0"
    acts = ["Tanh" if smooth else "Relu"] * (len(hidden) - 1) + ["Tanh"]
    for i in range(len(sizes) - 1):
        fan_in, fan_out = sizes[i], sizes[i + 1]
        bound = 1.0 / np.sqrt(fan_in)
        w = rng.uniform(-bound, bound, (fan_out, fan_in)).astype(np.float32)
        b = rng.uniform(-bound, bound, (fan_out,)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"fc{i + 1}.weight"),
                  numpy_helper.from_array(b, f"fc{i + 1}.bias")]
        out = f"/fc{i + 1}/Gemm_output_0" if i < len(sizes) - 2 else "logits"
        nodes.append(helper.make_node(
            "Gemm", [prev, f"fc{i + 1}.weight", f"fc{i + 1}.bias"], [out],
            name=f"/fc{i + 1}/Gemm", alpha=1.0, beta=1.0, transB=1))
        prev = out
        if i < len(sizes) - 2:
            act_out = f"/act{i + 1}/{acts[i]}_output_0"
            nodes.append(helper.make_node(acts[i], [prev], [act_out],
                                          name=f"/act{i + 1}/{acts[i]}"))
            prev = act_out
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                       [batch, 1, 28, 28])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT,
                                       [batch, 10])],
        inits)
    model = helper.make_model(graph, producer_name="pipec-examples",
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def make_data(batch, steps, seed=1):
    """Synthetic but learnable: the label is the argmax of a fixed random
    linear function of the image."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (steps * batch, 1, 28, 28)).astype(np.float32)
    proj = rng.standard_normal((28 * 28, 10)).astype(np.float32)
    y = np.argmax(x.reshape(len(x), -1) @ proj, axis=1).astype(np.int64)
    return x, y


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("-o", "--output", default=os.path.join(here, "mlp.onnx"))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--hidden", default="256,128,64")
    ap.add_argument("--data-steps", type=int, default=0)
    ap.add_argument("--smooth", action="store_true",
                    help="Tanh for every hidden activation (no ReLU kinks)")
    ap.add_argument("--data-seed", type=int, default=1,
                    help="seed of the synthetic data (default 1)")
    args = ap.parse_args()
    hidden = [int(h) for h in args.hidden.split(",")]
    onnx.save(build(args.batch, hidden, smooth=args.smooth), args.output)
    print(f"wrote {args.output}")
    if args.data_steps:
        x, y = make_data(args.batch, args.data_steps, args.data_seed)
        d = os.path.dirname(os.path.abspath(args.output))
        np.save(os.path.join(d, "x.npy"), x)
        np.save(os.path.join(d, "y.npy"), y)
        print(f"wrote {d}/x.npy {x.shape} and {d}/y.npy {y.shape}")


if __name__ == "__main__":
    main()
