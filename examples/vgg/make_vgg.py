#!/usr/bin/python3
"""Writes a small VGG-style CNN (32x32x3 input, 10 classes) as ONNX.

    /usr/bin/python3 examples/vgg/make_vgg.py [-o examples/vgg/vgg.onnx]
        [--batch 16] [--config 16,16,M,32,32,M,64,M] [--data-steps 4]

What torch.onnx.export emits for a torchvision-style VGG in eval-dropout
form: Conv(bias) -> Relu stacks with MaxPool(2x2, stride 2), Flatten,
Gemm -> Relu -> Dropout -> Gemm; the Dropout is in inference form (an
identity) unless --dropout-training exports it in training mode (p = 0.5,
ratio and training_mode as Constant inputs). Deterministic weights
(Kaiming uniform, fixed seed).
"""
import argparse
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def build(batch, config, seed=0, dropout_training=False):
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    x, cin, size, n = "input", 3, 32, 0
    for item in config:
        n += 1
        if item == "M":
            nodes.append(helper.make_node("MaxPool", [x], [f"/pool{n}"], name=f"/features/{n}/MaxPool",
                                          kernel_shape=[2, 2], strides=[2, 2], pads=[0, 0, 0, 0]))
            x, size = f"/pool{n}", size // 2
            continue
        cout = int(item)
        bound = np.sqrt(6.0 / (cin * 9))
        w, b = f"features.{n}.weight", f"features.{n}.bias"
        inits += [numpy_helper.from_array(rng.uniform(-bound, bound, (cout, cin, 3, 3)).astype(np.float32), w),
                  numpy_helper.from_array(np.zeros(cout, np.float32), b)]
        nodes.append(helper.make_node("Conv", [x, w, b], [f"/conv{n}"], name=f"/features/{n}/Conv",
                                      kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1]))
        nodes.append(helper.make_node("Relu", [f"/conv{n}"], [f"/relu{n}"], name=f"/features/{n}/Relu"))
        x, cin = f"/relu{n}", cout
    nodes.append(helper.make_node("Flatten", [x], ["/flat"], name="/Flatten", axis=1))
    feat = cin * size * size
    dims = [feat, 128, 10]
    x = "/flat"
    for i in range(2):
        bound = 1.0 / np.sqrt(dims[i])
        w, b = f"classifier.{i}.weight", f"classifier.{i}.bias"
        inits += [numpy_helper.from_array(rng.uniform(-bound, bound, (dims[i + 1], dims[i])).astype(np.float32), w),
                  numpy_helper.from_array(rng.uniform(-bound, bound, (dims[i + 1],)).astype(np.float32), b)]
        out = "logits" if i == 1 else f"/fc{i}"
        nodes.append(helper.make_node("Gemm", [x, w, b], [out], name=f"/classifier/{i}/Gemm", transB=1))
        x = out
        if i == 0:
            nodes.append(helper.make_node("Relu", [x], ["/fc_relu"], name="/classifier/Relu"))
            drop_inputs = ["/fc_relu"]
            if dropout_training:
                # torch.onnx.export(training=TrainingMode.TRAINING): ratio and
                # training_mode are Constant inputs.
                nodes.append(helper.make_node("Constant", [], ["/drop_ratio"], name="/classifier/ratio",
                                              value=numpy_helper.from_array(np.array(0.5, np.float32))))
                nodes.append(helper.make_node("Constant", [], ["/drop_train"], name="/classifier/train",
                                              value=numpy_helper.from_array(np.array(True))))
                drop_inputs += ["/drop_ratio", "/drop_train"]
            nodes.append(helper.make_node("Dropout", drop_inputs, ["/fc_drop"], name="/classifier/Dropout"))
            x = "/fc_drop"
    graph = helper.make_graph(
        nodes, "vgg",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, 3, 32, 32])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, 10])], inits)
    model = helper.make_model(graph, producer_name="pipec-examples",
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("-o", "--output", default=os.path.join(here, "vgg.onnx"))
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--config", default="16,16,M,32,32,M,64,M")
    ap.add_argument("--data-steps", type=int, default=0)
    ap.add_argument("--dropout-training", action="store_true",
                    help="export the Dropout in training mode (p = 0.5)")
    args = ap.parse_args()
    onnx.save(build(args.batch, args.config.split(","),
                    dropout_training=args.dropout_training), args.output)
    print(f"wrote {args.output}")
    if args.data_steps:
        rng = np.random.default_rng(1)
        n = args.data_steps * args.batch
        x = rng.standard_normal((n, 3, 32, 32)).astype(np.float32)
        y = (x[:, 0, :16].mean(axis=(1, 2)) > 0).astype(np.int64) + 2 * (x[:, 2].mean(axis=(1, 2)) > 0)
        d = os.path.dirname(os.path.abspath(args.output))
        np.save(os.path.join(d, "x.npy"), x)
        np.save(os.path.join(d, "y.npy"), y.astype(np.int64))
        print(f"wrote {d}/x.npy {x.shape} and {d}/y.npy {y.shape}")


if __name__ == "__main__":
    main()
