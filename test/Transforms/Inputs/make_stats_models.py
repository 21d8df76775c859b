#!/usr/bin/python3
"""Writes models whose loss depends on an output pipec does not
differentiate (autodiff-refusals.test):

    make_stats_models.py OUTDIR

ln_mean.onnx      LayerNormalization's Mean output added to its Y
bn_running.onnx   training-mode BatchNormalization's running mean added to
                  the logits
bn_output.onnx    the same BatchNormalization with the running mean as a
                  second model output, outside the loss (compiles)
sce_logprob.onnx  a loss (for --loss model) that adds the mean of
                  SoftmaxCrossEntropyLoss's log_prob output to the loss
"""
import os
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper


def save(path, nodes, inputs, outputs, inits):
    g = helper.make_graph(nodes, "g", inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with open(path, "wb") as f:
        f.write(m.SerializeToString())


def tensor(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def init(name, a):
    return numpy_helper.from_array(np.asarray(a, np.float32), name)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(0)
    w = init("w", rng.standard_normal((4, 6)) * 0.3)
    save(os.path.join(out, "ln_mean.onnx"),
         [helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"),
          helper.make_node("LayerNormalization", ["h", "g", "b"], ["y", "mean"], name="ln", axis=-1),
          helper.make_node("Add", ["y", "mean"], ["logits"], name="add_mean")],
         [tensor("x", [4, 4])], [tensor("logits", [4, 6])],
         [w, init("g", np.ones(6)), init("b", np.zeros(6))])
    save(os.path.join(out, "bn_running.onnx"),
         [helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"),
          helper.make_node("BatchNormalization", ["h", "g", "b", "rm", "rv"], ["y", "rm_out", "rv_out"],
                           name="bn", training_mode=1),
          helper.make_node("Add", ["y", "rm_out"], ["logits"], name="add_running_mean")],
         [tensor("x", [4, 4])], [tensor("logits", [4, 6])],
         [w, init("g", np.ones(6)), init("b", np.zeros(6)), init("rm", np.zeros(6)), init("rv", np.ones(6))])
    save(os.path.join(out, "bn_output.onnx"),
         [helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"),
          helper.make_node("BatchNormalization", ["h", "g", "b", "rm", "rv"], ["logits", "rm_out", "rv_out"],
                           name="bn", training_mode=1)],
         [tensor("x", [4, 4])], [tensor("logits", [4, 6]), tensor("rm_out", [6])],
         [w, init("g", np.ones(6)), init("b", np.zeros(6)), init("rm", np.zeros(6)), init("rv", np.ones(6))])
    save(os.path.join(out, "sce_logprob.onnx"),
         [helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"),
          helper.make_node("SoftmaxCrossEntropyLoss", ["h", "labels"], ["sce", "log_prob"], name="sce"),
          helper.make_node("ReduceMean", ["log_prob"], ["lp_mean"], name="lp_mean", keepdims=0),
          helper.make_node("Add", ["sce", "lp_mean"], ["loss"], name="total")],
         [tensor("x", [4, 4]), tensor("labels", [4], TensorProto.INT64)], [tensor("loss", [])],
         [w])


if __name__ == "__main__":
    main()
