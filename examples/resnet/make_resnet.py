#!/usr/bin/python3
"""Writes a ResNet as ONNX: by default a small one (CIFAR-style, 32x32x3
input, 10 classes); with --arch resnet50 torchvision's ResNet-50 (v1.5:
ImageNet stem, bottleneck blocks 3-4-6-3 with the stride on the 3x3
convolution, 224x224x3 input, 1000 classes).

    /usr/bin/python3 examples/resnet/make_resnet.py [-o examples/resnet/resnet.onnx]
        [--batch 16] [--width 16] [--blocks 2] [--data-steps 4]
    /usr/bin/python3 examples/resnet/make_resnet.py --arch resnet50 --batch 64 -o r50.onnx

The graph follows what torch.onnx.export emits for a torchvision-style
ResNet exported in training mode (opset 17): Conv (no bias) ->
BatchNormalization(training_mode=1, running statistics as extra outputs)
-> Relu, basic blocks with identity or 1x1-conv projection shortcuts (Add),
GlobalAveragePool -> Flatten -> Gemm. Deterministic weights (Kaiming
uniform, fixed seed). With --data-steps it writes x.npy / y.npy too.
"""
import argparse
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class Builder:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.count = [], [], 0

    def name(self, prefix):
        self.count += 1
        return f"{prefix}_{self.count}"

    def init(self, name, array):
        self.inits.append(numpy_helper.from_array(array.astype(np.float32), name))
        return name

    def conv_bn(self, x, cin, cout, k, stride, prefix, relu=True):
        bound = np.sqrt(6.0 / (cin * k * k))
        w = self.init(f"{prefix}.conv.weight",
                      self.rng.uniform(-bound, bound, (cout, cin, k, k)))
        c = self.name(f"{prefix}/conv")
        self.nodes.append(helper.make_node(
            "Conv", [x, w], [c], name=f"/{prefix}/conv/Conv", kernel_shape=[k, k],
            strides=[stride, stride], pads=[k // 2] * 4, dilations=[1, 1], group=1))
        scale = self.init(f"{prefix}.bn.weight", np.ones(cout))
        bias = self.init(f"{prefix}.bn.bias", np.zeros(cout))
        mean = self.init(f"{prefix}.bn.running_mean", np.zeros(cout))
        var = self.init(f"{prefix}.bn.running_var", np.ones(cout))
        y = self.name(f"{prefix}/bn")
        self.nodes.append(helper.make_node(
            "BatchNormalization", [c, scale, bias, mean, var],
            [y, self.name(f"{prefix}/bn_rm"), self.name(f"{prefix}/bn_rv")],
            name=f"/{prefix}/bn/BatchNormalization", epsilon=1e-5, momentum=0.9,
            training_mode=1))
        if not relu:
            return y
        r = self.name(f"{prefix}/relu")
        self.nodes.append(helper.make_node("Relu", [y], [r], name=f"/{prefix}/relu/Relu"))
        return r

    def bottleneck(self, x, cin, width, stride, prefix):
        """torchvision's Bottleneck (expansion 4, stride on the 3x3)."""
        cout = 4 * width
        h = self.conv_bn(x, cin, width, 1, 1, f"{prefix}.1")
        h = self.conv_bn(h, width, width, 3, stride, f"{prefix}.2")
        h = self.conv_bn(h, width, cout, 1, 1, f"{prefix}.3", relu=False)
        return self.residual(h, x, cin, cout, stride, prefix)

    def residual(self, h, x, cin, cout, stride, prefix):
        """relu(h + shortcut(x)): the identity, or a 1x1 projection when
        the shape changes."""
        shortcut = x
        if stride != 1 or cin != cout:
            shortcut = self.conv_bn(x, cin, cout, 1, stride, f"{prefix}.down", relu=False)
        s = self.name(f"{prefix}/add")
        self.nodes.append(helper.make_node("Add", [h, shortcut], [s], name=f"/{prefix}/Add"))
        r = self.name(f"{prefix}/out")
        self.nodes.append(helper.make_node("Relu", [s], [r], name=f"/{prefix}/Relu"))
        return r

    def block(self, x, cin, cout, stride, prefix):
        h = self.conv_bn(x, cin, cout, 3, stride, f"{prefix}.1")
        h = self.conv_bn(h, cout, cout, 3, 1, f"{prefix}.2", relu=False)
        return self.residual(h, x, cin, cout, stride, prefix)


# ResNet-50: (bottleneck width, blocks) per stage.
RESNET50_STAGES = [(64, 3), (128, 4), (256, 6), (512, 3)]


def resnet50_flops(batch, image=224, classes=1000):
    """Training FLOPs of one step of ResNet-50 (2 per multiply-add of the
    convolutions and the classifier, forward times 3 for training); the
    normalisations, activations and pooling are left out."""
    macs = 0

    def conv(cin, cout, k, hw):
        return cin * cout * k * k * hw * hw

    hw = image // 2  # stem: 7x7 stride 2
    macs += conv(3, 64, 7, hw)
    hw //= 2  # max pool
    cin = 64
    for stage, (width, blocks) in enumerate(RESNET50_STAGES):
        for i in range(blocks):
            stride = 2 if (i == 0 and stage > 0) else 1
            out = hw // stride
            macs += conv(cin, width, 1, hw) + conv(width, width, 3, out) + conv(width, 4 * width, 1, out)
            if stride != 1 or cin != 4 * width:
                macs += conv(cin, 4 * width, 1, out)
            cin, hw = 4 * width, out
    macs += cin * classes
    return 3 * 2 * macs * batch


def build(batch, width, blocks, seed=0, arch="small", classes=10):
    b = Builder(seed)
    image = 32
    if arch == "resnet50":
        image = 224
        x = b.conv_bn("input", 3, 64, 7, 2, "stem")
        b.nodes.append(helper.make_node("MaxPool", [x], ["stem_pool"], name="/maxpool/MaxPool",
                                        kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))
        x, cin = "stem_pool", 64
        for stage, (w, n) in enumerate(RESNET50_STAGES):
            for i in range(n):
                stride = 2 if (i == 0 and stage > 0) else 1
                x = b.bottleneck(x, cin, w, stride, f"layer{stage + 1}.{i}")
                cin = 4 * w
    else:
        x = b.conv_bn("input", 3, width, 3, 1, "stem")
        cin = width
        for stage, cout in enumerate([width, 2 * width, 4 * width]):
            for i in range(blocks):
                stride = 2 if (i == 0 and stage > 0) else 1
                x = b.block(x, cin, cout, stride, f"layer{stage + 1}.{i}")
                cin = cout
    b.nodes.append(helper.make_node("GlobalAveragePool", [x], ["pool"], name="/avgpool/GlobalAveragePool"))
    b.nodes.append(helper.make_node("Flatten", ["pool"], ["flat"], name="/Flatten", axis=1))
    bound = 1.0 / np.sqrt(cin)
    w = b.init("fc.weight", b.rng.uniform(-bound, bound, (classes, cin)))
    bias = b.init("fc.bias", b.rng.uniform(-bound, bound, (classes,)))
    b.nodes.append(helper.make_node("Gemm", ["flat", w, bias], ["logits"], name="/fc/Gemm", transB=1))
    graph = helper.make_graph(
        b.nodes, "resnet",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, 3, image, image])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, classes])],
        b.inits)
    model = helper.make_model(graph, producer_name="pipec-examples",
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("-o", "--output", default=os.path.join(here, "resnet.onnx"))
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--blocks", type=int, default=2)
    ap.add_argument("--data-steps", type=int, default=0)
    ap.add_argument("--arch", choices=["small", "resnet50"], default="small",
                    help="small: CIFAR-style (--width, --blocks); resnet50: torchvision's ResNet-50")
    args = ap.parse_args()
    big = args.arch == "resnet50"
    model = build(args.batch, args.width, args.blocks, arch=args.arch, classes=1000 if big else 10)
    onnx.save(model, args.output)
    print(f"wrote {args.output}")
    if args.data_steps and big:
        rng = np.random.default_rng(1)
        n = args.data_steps * args.batch
        d = os.path.dirname(os.path.abspath(args.output))
        np.save(os.path.join(d, "x.npy"), rng.standard_normal((n, 3, 224, 224)).astype(np.float32))
        np.save(os.path.join(d, "y.npy"), rng.integers(0, 1000, n).astype(np.int64))
        print(f"wrote {d}/x.npy and {d}/y.npy ({n} images)")
    elif args.data_steps:
        rng = np.random.default_rng(1)
        n = args.data_steps * args.batch
        x = rng.standard_normal((n, 3, 32, 32)).astype(np.float32)
        y = (x[:, 0, :16, :].mean(axis=(1, 2)) > 0).astype(np.int64) + 2 * (x[:, 1].mean(axis=(1, 2)) > 0)
        d = os.path.dirname(os.path.abspath(args.output))
        np.save(os.path.join(d, "x.npy"), x)
        np.save(os.path.join(d, "y.npy"), y.astype(np.int64))
        print(f"wrote {d}/x.npy {x.shape} and {d}/y.npy {y.shape}")


if __name__ == "__main__":
    main()
