#!/usr/bin/python3
"""Writes the small ONNX models the importer lit tests read into a folder:

    make_models.py OUTDIR

tiny.onnx        Flatten -> Gemm(transB) -> Relu -> MatMul -> Add -> Softmax
all_ops.onnx     every operator of the MLP slice once
unsupported.onnx a LpPool, two Foo nodes of a custom domain and a LRN
dynamic.onnx     an input with a symbolic batch dimension
opset11.onnx     opset 11 (upgraded by ONNX's version converter)
computed_shape.onnx  Reshape whose shape is computed by Shape (folds at import)
runtime_mask.onnx    Equal/Not/Cast/Where on integer ids (a run-time mask)
mask_unsqueeze.onnx  a boolean mask unsqueezed to broadcast in Where
exporter.onnx        what torch.onnx.export writes for training (see below)
merged.onnx          one bias initializer read by three Gemms
fixed_batch.onnx     a Reshape target that holds the batch
opset20.onnx         a Gelu of opset 20 (newer than the ONNX library)
zero_stride.onnx     an opset-11 Conv with a zero stride (crashes libonnx)
runtime_shape.onnx   Reshape whose shape is a model input (cannot fold)
with_loss.onnx   a model that ends in SoftmaxCrossEntropyLoss
external.onnx    tiny.onnx with its weights in external.bin
heavy.onnx       a 1.25 MiB initializer in external data (heavy.bin)
traversal.onnx   external data pointing outside the model's folder
huge.onnx        an input of 2^44 elements
truncated.onnx   the first half of tiny.onnx
not_onnx.onnx    a text file
empty.onnx       zero bytes
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def model(nodes, inputs, outputs, inits=(), opset=17, domains=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    imports = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
    m = helper.make_model(g, opset_imports=imports)
    m.ir_version = 8
    return m


def f32(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def init(name, shape, seed):
    rng = np.random.default_rng(seed)
    return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)


def main(out):
    os.makedirs(out, exist_ok=True)
    tiny = model(
        [helper.make_node("Flatten", ["x"], ["f"], name="flat"),
         helper.make_node("Gemm", ["f", "w1", "b1"], ["h"], name="fc1", transB=1),
         helper.make_node("Relu", ["h"], ["r"], name="relu1"),
         helper.make_node("MatMul", ["r", "w2"], ["m"], name="mm2"),
         helper.make_node("Add", ["m", "b2"], ["a"], name="add2"),
         helper.make_node("Softmax", ["a"], ["y"], name="soft", axis=1)],
        [f32("x", [8, 2, 3])], [f32("y", [8, 4])],
        [init("w1", [5, 6], 1), init("b1", [5], 2), init("w2", [5, 4], 3), init("b2", [4], 4)])
    onnx.save(tiny, f"{out}/tiny.onnx")

    shape = numpy_helper.from_array(np.array([2, 12], dtype=np.int64), "shape")
    all_ops = model(
        [helper.make_node("Transpose", ["x"], ["t"], name="tr", perm=[0, 2, 1]),
         helper.make_node("Reshape", ["t", "shape"], ["re"], name="rs"),
         helper.make_node("Identity", ["re"], ["id"], name="ident"),
         helper.make_node("Constant", [], ["c"], name="const",
                          value=numpy_helper.from_array(np.full([12], 0.5, np.float32))),
         helper.make_node("Sub", ["id", "c"], ["s"], name="sub"),
         helper.make_node("Mul", ["s", "s"], ["mu"], name="mul"),
         helper.make_node("Div", ["mu", "c"], ["d"], name="div"),
         helper.make_node("Tanh", ["d"], ["th"], name="tanh"),
         helper.make_node("Sigmoid", ["th"], ["sg"], name="sig"),
         helper.make_node("LogSoftmax", ["sg"], ["y"], name="logsoft", axis=-1)],
        [f32("x", [2, 3, 4])], [f32("y", [2, 12])], [shape])
    onnx.save(all_ops, f"{out}/all_ops.onnx")

    unsupported = model(
        [helper.make_node("LpPool", ["x"], ["c1"], name="lppool1", kernel_shape=[3, 3]),
         helper.make_node("Foo", ["c1"], ["f1"], name="foo1", domain="com.example"),
         helper.make_node("Foo", ["f1"], ["f2"], name="foo2", domain="com.example"),
         helper.make_node("LRN", ["f2"], ["y"], name="lrn", size=3)],
        [f32("x", [1, 1, 5, 5])], [f32("y", None)],
        domains=["com.example"])
    onnx.save(unsupported, f"{out}/unsupported.onnx")

    dynamic = model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                    [f32("x", ["N", 4])], [f32("y", ["N", 4])])
    onnx.save(dynamic, f"{out}/dynamic.onnx")

    old = model([helper.make_node("Gemm", ["x", "w", "b"], ["h"], name="fc", transB=1),
                 helper.make_node("Softmax", ["h"], ["y"], name="soft")],
                [f32("x", [2, 3])], [f32("y", [2, 4])],
                [init("w", [4, 3], 6), init("b", [4], 7)], opset=11)
    onnx.save(old, f"{out}/opset11.onnx")

    computed = model(
        [helper.make_node("Shape", ["x"], ["s"], name="shape_of"),
         helper.make_node("Reshape", ["x", "s"], ["y"], name="reshape")],
        [f32("x", [2, 3])], [f32("y", [2, 3])])
    onnx.save(computed, f"{out}/computed_shape.onnx")

    runtime = model(
        [helper.make_node("Reshape", ["x", "s"], ["y"], name="reshape_rt")],
        [f32("x", [2, 3]), helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
        [f32("y", [3, 2])])
    onnx.save(runtime, f"{out}/runtime_shape.onnx")

    labels = helper.make_tensor_value_info("labels", TensorProto.INT64, [4])
    with_loss = model(
        [helper.make_node("Gemm", ["x", "w", "b"], ["s"], name="fc", transB=1),
         helper.make_node("SoftmaxCrossEntropyLoss", ["s", "labels"], ["loss"],
                          name="sce", reduction="mean")],
        [f32("x", [4, 3]), labels], [f32("loss", [])],
        [init("w", [5, 3], 8), init("b", [5], 9)])
    onnx.save(with_loss, f"{out}/with_loss.onnx")

    # A mask computed at run time from integer ids (padding id 0): Equal,
    # Not, Cast to float and Where (pipec compile adds the loss).
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, [4, 5])
    zero = numpy_helper.from_array(np.array(0, dtype=np.int64), "pad")
    neg = numpy_helper.from_array(np.array(-30.0, dtype=np.float32), "neg")
    mask = model(
        [helper.make_node("Gemm", ["x", "w", "b"], ["s"], name="fc", transB=1),
         helper.make_node("Equal", ["ids", "pad"], ["is_pad"], name="eq"),
         helper.make_node("Not", ["is_pad"], ["keep"], name="not"),
         helper.make_node("Cast", ["keep"], ["keepf"], name="cast", to=TensorProto.FLOAT),
         helper.make_node("Mul", ["s", "keepf"], ["sk"], name="mul"),
         helper.make_node("Where", ["is_pad", "neg", "sk"], ["masked"], name="where")],
        [f32("x", [4, 3]), ids], [f32("masked", [4, 5])],
        [init("w", [5, 3], 8), init("b", [5], 9), zero, neg])
    onnx.save(mask, f"{out}/runtime_mask.onnx")

    # A key padding mask as attention writes it: the boolean [4, 5] mask is
    # unsqueezed to [4, 1, 5] to broadcast against [4, 3, 5] scores.
    axes = numpy_helper.from_array(np.array([1], dtype=np.int64), "axes")
    pad3 = model(
        [helper.make_node("Equal", ["ids", "pad"], ["is_pad"], name="eq"),
         helper.make_node("Unsqueeze", ["is_pad", "axes"], ["is_pad3"], name="unsq"),
         helper.make_node("Where", ["is_pad3", "neg", "scores"], ["masked"], name="where")],
        [f32("scores", [4, 3, 5]), ids], [f32("masked", [4, 3, 5])],
        [zero, neg, axes])
    onnx.save(pad3, f"{out}/mask_unsqueeze.onnx")

    # What torch.onnx.export writes for training (exporter.onnx): positions
    # from Range(0, Shape(x)[1]) that ONNX's shape inference leaves
    # unknown until the importer folds them, a view whose target Concat's
    # the batch read by Shape, a Dropout and an opset-13 BatchNormalization
    # whose mask and statistics outputs nobody reads, and a float buffer
    # (mask) that only Equal reads.
    i64 = lambda name, v: numpy_helper.from_array(np.array(v, dtype=np.int64), name)
    exporter = model(
        [helper.make_node("Shape", ["x"], ["shape"], name="shape"),
         helper.make_node("Gather", ["shape", "one"], ["t"], name="seq_len", axis=0),
         helper.make_node("Range", ["zero", "t", "one"], ["pos"], name="range"),
         helper.make_node("Gather", ["pos_table", "pos"], ["pe"], name="pos_embed", axis=0),
         helper.make_node("Add", ["x", "pe"], ["h"], name="add_pos"),
         helper.make_node("Gather", ["shape", "zero"], ["b"], name="batch_dim", axis=0),
         helper.make_node("Unsqueeze", ["b", "axes0"], ["b1"], name="unsq"),
         helper.make_node("Concat", ["b1", "minus1"], ["flat_shape"], name="cat", axis=0),
         helper.make_node("Reshape", ["h", "flat_shape"], ["flat"], name="view"),
         helper.make_node("Constant", [], ["fzero"], name="zero_f",
                          value=numpy_helper.from_array(np.array(0, np.float32))),
         helper.make_node("Constant", [], ["ninf"], name="fill",
                          value=numpy_helper.from_array(np.array(-1e4, np.float32))),
         helper.make_node("Equal", ["mask", "fzero"], ["is_pad"], name="eq"),
         helper.make_node("Where", ["is_pad", "ninf", "flat"], ["masked"], name="masked_fill"),
         helper.make_node("Dropout", ["masked", "ratio", "training"], ["d", "d_mask"], name="drop"),
         helper.make_node("Unsqueeze", ["d", "axes23"], ["d4"], name="to_nchw"),
         helper.make_node("BatchNormalization", ["d4", "bn_s", "bn_b", "bn_m", "bn_v"],
                          ["bn", "bn_mean", "bn_var", "bn_saved_mean", "bn_saved_var"], name="bn"),
         helper.make_node("Flatten", ["bn"], ["y"], name="flatten")],
        [f32("x", [2, 3, 4])], [f32("y", [2, 12])],
        [init("pos_table", [8, 4], 10), i64("zero", 0), i64("one", 1), i64("axes0", [0]),
         i64("minus1", [-1]), i64("axes23", [2, 3]),
         numpy_helper.from_array(np.array([[1] * 8 + [0] * 4], np.float32), "mask"),
         numpy_helper.from_array(np.array(0.25, np.float32), "ratio"),
         numpy_helper.from_array(np.array(True), "training"),
         init("bn_s", [12], 11), init("bn_b", [12], 12),
         numpy_helper.from_array(np.zeros(12, np.float32), "bn_m"),
         numpy_helper.from_array(np.ones(12, np.float32), "bn_v")],
        opset=13)
    onnx.save(exporter, f"{out}/exporter.onnx")

    # Equal initializers merged by an exporter (torch.onnx.export in eval
    # mode): fc1 and fc2 read one bias, and an Identity gives it a third
    # name.
    merged = model(
        [helper.make_node("Gemm", ["x", "w1", "b"], ["h1"], name="fc1", transB=1),
         helper.make_node("Gemm", ["h1", "w2", "b"], ["h2"], name="fc2", transB=1),
         helper.make_node("Identity", ["b"], ["fc3.bias"], name="copy"),
         helper.make_node("Gemm", ["h2", "w3", "fc3.bias"], ["y"], name="fc3", transB=1)],
        [f32("x", [2, 3])], [f32("y", [2, 3])],
        [init("w1", [3, 3], 13), init("w2", [3, 3], 14), init("w3", [3, 3], 15),
         numpy_helper.from_array(np.zeros(3, np.float32), "b")])
    onnx.save(merged, f"{out}/merged.onnx")

    # A zero stride in an opset-11 Conv: libonnx's shape inference (run for
    # the version converter) divides by it (found by fuzzing).
    zero_stride = model([helper.make_node("Conv", ["x", "W"], ["y"], name="conv",
                                          kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 0])],
                        [f32("x", [1, 1, 7, 5])], [f32("y", [1, 1, 4, 3])],
                        [init("W", [1, 1, 3, 3], 16)], opset=11)
    onnx.save(zero_stride, f"{out}/zero_stride.onnx")

    # Newer than the linked ONNX library (1.12 knows opsets up to 17).
    newer = model([helper.make_node("Gelu", ["x"], ["y"], name="gelu")],
                  [f32("x", [2, 3])], [f32("y", [2, 3])], opset=20)
    newer.ir_version = 9
    onnx.save(newer, f"{out}/opset20.onnx")

    # Traced without a dynamic batch axis: the batch 4 is in the view's
    # target, so it cannot be re-specialised to another batch.
    fixed = model(
        [helper.make_node("Reshape", ["x", "target"], ["y"], name="view")],
        [f32("x", [4, 3, 2])], [f32("y", [4, 6])], [i64("target", [4, 6])])
    onnx.save(fixed, f"{out}/fixed_batch.onnx")

    # External data (models over 2 GiB): loaded from the model's folder;
    # a location outside it is refused.
    ext = onnx.load(f"{out}/tiny.onnx")
    onnx.save_model(ext, f"{out}/external.onnx", save_as_external_data=True,
                    all_tensors_to_one_file=True, location="external.bin",
                    size_threshold=0)
    # An initializer over 1 MiB (the importer keeps those out of what
    # libonnx processes, which is how models over 2 GiB import) in external
    # data, next to a small one.
    heavy = model(
        [helper.make_node("MatMul", ["x", "heavy_w"], ["h"], name="mm"),
         helper.make_node("Add", ["h", "small_b"], ["y"], name="add")],
        [f32("x", [2, 640])], [f32("y", [2, 512])],
        [numpy_helper.from_array(np.full((640, 512), 0.5, np.float32), "heavy_w"),
         numpy_helper.from_array(np.full((512,), 0.25, np.float32), "small_b")])
    onnx.save_model(heavy, f"{out}/heavy.onnx", save_as_external_data=True,
                    all_tensors_to_one_file=True, location="heavy.bin", size_threshold=0)
    trav = onnx.load(f"{out}/external.onnx", load_external_data=False)
    for t in trav.graph.initializer:
        for kv in t.external_data:
            if kv.key == "location":
                kv.value = "../outside.bin"
    onnx.save(trav, f"{out}/traversal.onnx")

    huge = model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                 [f32("x", [1 << 22, 1 << 22])], [f32("y", [1 << 22, 1 << 22])])
    onnx.save(huge, f"{out}/huge.onnx")

    # Where with a constant condition and run-time branches (a causal or
    # padding mask as exporters write it), as conformance-style cases with
    # numpy's expected output: a constant -inf mask value, and two run-time
    # branches with a broadcast condition.
    rng = np.random.default_rng(11)
    mask = np.array([[True, False, True, True], [False, True, False, True]])
    x = rng.standard_normal((2, 4)).astype(np.float32)
    z = rng.standard_normal((3, 2, 4)).astype(np.float32)
    cases = {
        "test_where_const_cond_inf_mask": (
            [helper.make_node("Constant", [], ["minf"], name="mask_value",
                              value=numpy_helper.from_array(np.array(-np.inf, dtype=np.float32))),
             helper.make_node("Where", ["c", "x", "minf"], ["y"], name="mask")],
            [f32("x", [2, 4])], [f32("y", [2, 4])],
            [numpy_helper.from_array(mask, "c")],
            [x], np.where(mask, x, np.float32(-np.inf))),
        "test_where_const_cond_runtime_branches": (
            [helper.make_node("Where", ["c", "x", "z"], ["y"], name="select")],
            [f32("x", [2, 4]), f32("z", [3, 2, 4])], [f32("y", [3, 2, 4])],
            [numpy_helper.from_array(mask[1], "c")],
            [x, z], np.where(mask[1], x, z)),
    }
    for name, (nodes, ins, outs, inits, feeds, expected) in cases.items():
        d = f"{out}/numeric_cases/{name}"
        os.makedirs(f"{d}/test_data_set_0")
        onnx.save(model(nodes, ins, outs, inits), f"{d}/model.onnx")
        for i, v in enumerate(feeds):
            onnx.save_tensor(numpy_helper.from_array(v), f"{d}/test_data_set_0/input_{i}.pb")
        onnx.save_tensor(numpy_helper.from_array(expected.astype(np.float32)),
                         f"{d}/test_data_set_0/output_0.pb")

    # GELU in the erf form exporters write: fused into one nn.gelu; the same
    # graph with the Erf output also returned stays unfused.
    def const(name, v):
        return helper.make_node("Constant", [], [name], name=name,
                                value=numpy_helper.from_array(np.array(v, dtype=np.float32)))
    gelu_nodes = [const("sqrt2", 1.4142135381698608), const("one", 1.0), const("half", 0.5),
                  helper.make_node("Div", ["x", "sqrt2"], ["d"], name="act/Div"),
                  helper.make_node("Erf", ["d"], ["e"], name="act/Erf"),
                  helper.make_node("Add", ["e", "one"], ["a"], name="act/Add"),
                  helper.make_node("Mul", ["x", "a"], ["m"], name="act/Mul"),
                  helper.make_node("Mul", ["m", "half"], ["y"], name="act/Mul_1")]
    onnx.save(model(gelu_nodes, [f32("x", [2, 8])], [f32("y", [2, 8])]), f"{out}/erf_gelu.onnx")
    import math
    gx = (np.random.default_rng(12).standard_normal((2, 8)) * 3).astype(np.float32)
    gy = np.array([[0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in row] for row in gx.astype(np.float64)])
    d = f"{out}/numeric_cases/test_erf_gelu_fused"
    os.makedirs(f"{d}/test_data_set_0")
    onnx.save(model(gelu_nodes, [f32("x", [2, 8])], [f32("y", [2, 8])]), f"{d}/model.onnx")
    onnx.save_tensor(numpy_helper.from_array(gx), f"{d}/test_data_set_0/input_0.pb")
    onnx.save_tensor(numpy_helper.from_array(gy.astype(np.float32)), f"{d}/test_data_set_0/output_0.pb")
    onnx.save(model(gelu_nodes, [f32("x", [2, 8])], [f32("y", [2, 8]), f32("e", [2, 8])]),
              f"{out}/erf_gelu_shared.onnx")

    # Scales after a MatMul: by a power of two (Div 4, Mul 0.5 on the left)
    # folded into its alpha; by 3, or after a MatMul read twice, kept.
    scale_nodes = [const("four", 4.0), const("half2", 0.5), const("three", 3.0),
                   helper.make_node("MatMul", ["a", "b"], ["s1"], name="mm1"),
                   helper.make_node("Div", ["s1", "four"], ["y1"], name="div4"),
                   helper.make_node("MatMul", ["a", "b"], ["s2"], name="mm2"),
                   helper.make_node("Mul", ["half2", "s2"], ["y2"], name="mulhalf"),
                   helper.make_node("MatMul", ["a", "b"], ["s3"], name="mm3"),
                   helper.make_node("Div", ["s3", "three"], ["y3"], name="div3"),
                   helper.make_node("MatMul", ["a", "b"], ["s4"], name="mm4"),
                   helper.make_node("Div", ["s4", "four"], ["y4"], name="div4b"),
                   helper.make_node("Add", ["s4", "y4"], ["y5"], name="twice")]
    onnx.save(model(scale_nodes, [f32("a", [2, 4, 8]), f32("b", [2, 8, 4])],
                    [f32(n, [2, 4, 4]) for n in ("y1", "y2", "y3", "y5")]), f"{out}/scaled_matmul.onnx")

    data = tiny.SerializeToString()
    with open(f"{out}/truncated.onnx", "wb") as fh:
        fh.write(data[: len(data) // 2])
    with open(f"{out}/not_onnx.onnx", "w") as fh:
        fh.write("this is not a model\n")
    open(f"{out}/empty.onnx", "wb").close()


if __name__ == "__main__":
    main(sys.argv[1])
