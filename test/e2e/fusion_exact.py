#!/usr/bin/python3
"""What the importer folds changes no bit of training.

    /usr/bin/python3 test/e2e/fusion_exact.py --pipec build/bin/pipec --workdir DIR

An attention block written as ONNX (q = x Wq, k = x Wk, scores = q k^T / 4,
softmax, times x, then 0.5 * that, a Gemm to 10 classes): the Div by 4 and
the Mul by 0.5 are powers of two, so the importer gives them to the
MatMuls as alpha (lib/Import/OnnxImporter.cpp, foldMatMulScale) and the
backward's MatMuls carry it too. Compiled on 2 stages with and without
--no-fuse and trained 4 steps on the same data, the two builds must agree
to the bit: every step's loss and every final weight. The fused build's
pipeline.mlir must hold the alphas, the other none.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from e2e_common import Checks, losses_of, pipec_workdir_args, run  # noqa: E402
from safetensors_io import load_checkpoint  # noqa: E402


def write_model(d):
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)

    def weight(name, shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)

    def const(name, value):
        return helper.make_node("Constant", [], [name], name=name,
                                value=numpy_helper.from_array(np.array(value, np.float32)))
    nodes = [const("four", [4.0]), const("half", 0.5),
             helper.make_node("MatMul", ["x", "wq"], ["q"], name="q"),
             helper.make_node("MatMul", ["x", "wk"], ["k"], name="k"),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1], name="kt"),
             helper.make_node("MatMul", ["q", "kt"], ["s"], name="scores"),
             helper.make_node("Div", ["s", "four"], ["z"], name="scale"),
             helper.make_node("Softmax", ["z"], ["p"], axis=-1, name="softmax"),
             helper.make_node("MatMul", ["p", "x"], ["o"], name="mix"),
             helper.make_node("Mul", ["half", "o"], ["o2"], name="halve"),
             helper.make_node("Reshape", ["o2", "shape"], ["flat"], name="flat"),
             helper.make_node("Gemm", ["flat", "wo"], ["logits"], transB=1, name="head")]
    inits = [weight("wq", (16, 16)), weight("wk", (16, 16)), weight("wo", (10, 128)),
             numpy_helper.from_array(np.array([-1, 128], np.int64), "shape")]
    graph = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 8, 16])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [8, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, os.path.join(d, "attention.onnx"))
    np.save(os.path.join(d, "x.npy"), rng.standard_normal((16, 8, 16)).astype(np.float32))
    np.save(os.path.join(d, "y.npy"), rng.integers(0, 10, 16).astype(np.int64))


def main():
    a = pipec_workdir_args()
    write_model(a.workdir)
    checks = Checks()
    onnx_path = os.path.join(a.workdir, "attention.onnx")
    runs = {}
    for name, extra in (("fused", []), ("unfused", ["--no-fuse"])):
        out = os.path.join(a.workdir, name)
        rc, text = run([a.pipec, "compile", onnx_path, "-o", out, "--stages", "2", "--microbatches", "2",
                        "--emit-mlir", "--quiet"] + extra)
        if rc != 0:
            checks.report(False, f"compile ({name})", text[-600:])
            return checks.summary()
        alphas = open(os.path.join(out, "pipeline.mlir")).read().count("alpha = ")
        want = alphas > 0 if name == "fused" else alphas == 0
        checks.report(want, f"{name}: MatMuls with alpha in pipeline.mlir", str(alphas))
        rc, text = run([a.pipec, "train", out, "--steps", "4", "--lr", "0.5", "--quiet",
                        "--inputs", os.path.join(a.workdir, "x.npy"), "--labels", os.path.join(a.workdir, "y.npy")])
        if rc != 0:
            checks.report(False, f"train ({name})", text[-600:])
            return checks.summary()
        runs[name] = (losses_of(out), load_checkpoint(os.path.join(out, "checkpoints", "step-000004")))
    (lf, wf), (lu, wu) = runs["fused"], runs["unfused"]
    checks.report(lf == lu, "losses bit-identical", f"{lf} vs {lu}")
    import numpy as np
    differing = {k: int((np.asarray(wf[k]).view(np.uint32) != np.asarray(wu[k]).view(np.uint32)).sum())
                 for k in wu}
    checks.report(sorted(wf) == sorted(wu) and not any(differing.values()), "final weights bit-identical",
                  f"differing words per tensor: {differing}")
    return checks.summary()


if __name__ == "__main__":
    sys.exit(main())
