"""An independent float64 reference for training an ONNX model: forward,
reverse-mode gradients and SGD with microbatch gradient accumulation,
written in numpy from the ONNX operator specification. It shares no code
with pipec (no importer, no kernels, no autodiff rules); the test scripts
use it as the oracle pipec's runs are compared with, and check its own
gradients against central finite differences first.

Supported: the operators of the example models (examples/resnet, vgg, gpt):
Conv, BatchNormalization (training mode), MaxPool, GlobalAveragePool,
Gemm, MatMul, LayerNormalization, Softmax, Relu, Erf, Sqrt, Add, Sub, Mul,
Div, Where, Equal, Cast, Dropout (inference mode), Flatten, Reshape, Transpose, Split, Concat,
Unsqueeze, Shape, Gather, Constant. Anything else is refused by name.

The loss is pipec's default: softmax cross-entropy of output 0 (rows =
all leading dimensions) against integer labels, the mean over the
microbatch; each microbatch's gradient is scaled by 1/m and accumulated,
and one SGD step is taken per global batch. BatchNormalization's running
statistics follow the ONNX update (momentum, population variance) once per
microbatch, in microbatch order.
"""
import math

import numpy as np
import onnx
from onnx import numpy_helper


# Irrational constants a model writes as float32 literals (GELU's sqrt(2) and
# sqrt(2/pi), SELU's alpha and gamma, pi, e, ln 2).
_KNOWN = [math.sqrt(2), 1 / math.sqrt(2), math.sqrt(2 / math.pi), math.pi, math.e, math.log(2),
          1.6732632423543772848170429916717, 1.0507009873554804934193349852946]


def intended_value(f):
    """The number a float32 literal stands for: a known irrational that
    rounds to it, else its shortest decimal (0.1, 1e-5). Float64 training
    in pipec reads model literals the same way (README, precision mode)."""
    f32 = np.float32(f)
    for k in _KNOWN:
        if np.float32(k) == f32 or np.float32(-k) == f32:
            return math.copysign(k, float(f32))
    return float(np.format_float_positional(f32))


def _attrs(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _unbroadcast(g, shape):
    """Sum a broadcast gradient back to `shape`."""
    while g.ndim > len(shape):
        g = g.sum(axis=0)
    for ax, d in enumerate(shape):
        if d == 1 and g.shape[ax] != 1:
            g = g.sum(axis=ax, keepdims=True)
    return g


_erf = np.frompyfunc(math.erf, 1, 1)


def _pad_hw(x, pads):
    t, l, b, r = pads[0], pads[1], pads[2], pads[3]
    return np.pad(x, ((0, 0), (0, 0), (t, b), (l, r)))


def _windows(xp, kh, kw, sh, sw, dh, dw, oh, ow):
    """View [N, C, oh, ow, kh, kw] of the windows of a padded NCHW tensor."""
    n, c, _, _ = xp.shape
    s = xp.strides
    return np.lib.stride_tricks.as_strided(
        xp, shape=(n, c, oh, ow, kh, kw),
        strides=(s[0], s[1], s[2] * sh, s[3] * sw, s[2] * dh, s[3] * dw), writeable=False)


def _conv_geometry(x, w, a):
    kh, kw = w.shape[2], w.shape[3]
    pads = list(a.get("pads", [0, 0, 0, 0]))
    sh, sw = a.get("strides", [1, 1])
    dh, dw = a.get("dilations", [1, 1])
    if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        raise ValueError("reference: Conv auto_pad is not supported")
    H, W = x.shape[2] + pads[0] + pads[2], x.shape[3] + pads[1] + pads[3]
    oh = (H - dh * (kh - 1) - 1) // sh + 1
    ow = (W - dw * (kw - 1) - 1) // sw + 1
    return kh, kw, pads, sh, sw, dh, dw, oh, ow


def conv_forward(x, w, b, a):
    g = a.get("group", 1)
    kh, kw, pads, sh, sw, dh, dw, oh, ow = _conv_geometry(x, w, a)
    win = _windows(_pad_hw(x, pads), kh, kw, sh, sw, dh, dw, oh, ow)
    cg, mg = x.shape[1] // g, w.shape[0] // g
    outs = []
    for k in range(g):
        outs.append(np.einsum("ncxyij,mcij->nmxy", win[:, k * cg:(k + 1) * cg], w[k * mg:(k + 1) * mg]))
    y = np.concatenate(outs, axis=1)
    if b is not None:
        y = y + b.reshape(1, -1, 1, 1)
    return y


def conv_backward(x, w, dy, a):
    g = a.get("group", 1)
    kh, kw, pads, sh, sw, dh, dw, oh, ow = _conv_geometry(x, w, a)
    xp = _pad_hw(x, pads)
    win = _windows(xp, kh, kw, sh, sw, dh, dw, oh, ow)
    cg, mg = x.shape[1] // g, w.shape[0] // g
    dw_parts, dxp = [], np.zeros_like(xp)
    for k in range(g):
        dyk = dy[:, k * mg:(k + 1) * mg]
        dw_parts.append(np.einsum("nmxy,ncxyij->mcij", dyk, win[:, k * cg:(k + 1) * cg]))
        dwin = np.einsum("nmxy,mcij->ncxyij", dyk, w[k * mg:(k + 1) * mg])
        for i in range(kh):
            for j in range(kw):
                dxp[:, k * cg:(k + 1) * cg,
                    i * dh:i * dh + sh * (oh - 1) + 1:sh,
                    j * dw:j * dw + sw * (ow - 1) + 1:sw] += dwin[:, :, :, :, i, j]
    dx = dxp[:, :, pads[0]:xp.shape[2] - pads[2], pads[1]:xp.shape[3] - pads[3]]
    return dx, np.concatenate(dw_parts, axis=0), dy.sum(axis=(0, 2, 3))


def maxpool_forward(x, a):
    kh, kw = a["kernel_shape"]
    pads = list(a.get("pads", [0, 0, 0, 0]))
    sh, sw = a.get("strides", [1, 1])
    if a.get("ceil_mode", 0) or a.get("dilations", [1, 1]) != [1, 1]:
        raise ValueError("reference: MaxPool ceil_mode/dilations are not supported")
    xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])), constant_values=-np.inf)
    oh = (xp.shape[2] - kh) // sh + 1
    ow = (xp.shape[3] - kw) // sw + 1
    win = _windows(xp, kh, kw, sh, sw, 1, 1, oh, ow)
    flat = win.reshape(*win.shape[:4], kh * kw)
    arg = flat.argmax(axis=-1)
    return np.take_along_axis(flat, arg[..., None], axis=-1)[..., 0], (arg, xp.shape, pads, kh, kw, sh, sw)


def maxpool_backward(dy, saved):
    arg, xshape, pads, kh, kw, sh, sw = saved
    dxp = np.zeros(xshape)
    n, c, oh, ow = dy.shape
    ii, jj = arg // kw, arg % kw
    N, C, X, Y = np.meshgrid(np.arange(n), np.arange(c), np.arange(oh), np.arange(ow), indexing="ij")
    np.add.at(dxp, (N, C, X * sh + ii, Y * sw + jj), dy)
    return dxp[:, :, pads[0]:xshape[2] - pads[2], pads[1]:xshape[3] - pads[3]]


class Reference:
    def __init__(self, model):
        if isinstance(model, str):
            model = onnx.load(model)
        g = model.graph
        self.initial = {i.name: numpy_helper.to_array(i) for i in g.initializer}
        self.initial = {k: (v.astype(np.float64) if v.dtype.kind == "f" else v)
                        for k, v in self.initial.items()}
        self.nodes = list(g.node)
        for n in self.nodes:
            if n.domain not in ("", "ai.onnx") or not hasattr(self, "_f_" + n.op_type):
                raise ValueError(f"reference does not support {n.domain}:{n.op_type} ({n.name})")
        self.inputs = [i.name for i in g.input if i.name not in self.initial]
        if len(self.inputs) != 1:
            raise ValueError(f"reference expects one data input, got {self.inputs}")
        self.output = g.output[0].name
        # Running statistics: BatchNormalization inputs 3 and 4.
        self.stats = {}
        for n in self.nodes:
            if n.op_type == "BatchNormalization" and _attrs(n).get("training_mode", 0):
                self.stats[n.input[3]] = (n, 1)
                self.stats[n.input[4]] = (n, 2)
        self.trainable = [k for k, v in self.initial.items()
                          if v.dtype.kind == "f" and k not in self.stats]
        self.constants = [k for k, v in self.initial.items() if v.dtype.kind != "f"]

    # -- forward ---------------------------------------------------------------
    def forward(self, params, x):
        env = dict(params)
        env[self.inputs[0]] = x.astype(np.float64) if x.dtype.kind == "f" else x
        saved = {}
        for n in self.nodes:
            ins = [env[i] if i else None for i in n.input]
            outs = getattr(self, "_f_" + n.op_type)(n, _attrs(n), ins, saved)
            for name, v in zip(n.output, outs):
                if name:
                    env[name] = v
        return env, saved

    def _f_Constant(self, n, a, ins, s):
        v = numpy_helper.to_array(a["value"])
        if v.dtype == np.float32:
            return [np.vectorize(intended_value, otypes=[np.float64])(v)]
        return [v.astype(np.float64) if v.dtype.kind == "f" else v]

    def _f_Conv(self, n, a, ins, s):
        return [conv_forward(ins[0], ins[1], ins[2] if len(ins) > 2 else None, a)]

    def _f_BatchNormalization(self, n, a, ins, s):
        x, scale, bias, rm, rv = ins
        eps, mom = a.get("epsilon", 1e-5), a.get("momentum", 0.9)
        # The file stores float32 attributes; read them as the numbers they
        # stand for (1e-5, 0.9), as pipec's float64 mode does.
        eps, mom = intended_value(eps), intended_value(mom)
        shp = (1, -1) + (1,) * (x.ndim - 2)
        axes = (0,) + tuple(range(2, x.ndim))
        if not a.get("training_mode", 0):
            return [(x - rm.reshape(shp)) / np.sqrt(rv.reshape(shp) + eps) * scale.reshape(shp) + bias.reshape(shp)]
        mean = x.mean(axis=axes)
        var = x.var(axis=axes)
        xhat = (x - mean.reshape(shp)) / np.sqrt(var.reshape(shp) + eps)
        s[n.output[0]] = (xhat, np.sqrt(var + eps), shp, axes)
        return [xhat * scale.reshape(shp) + bias.reshape(shp),
                rm * mom + mean * (1 - mom), rv * mom + var * (1 - mom)]

    def _f_MaxPool(self, n, a, ins, s):
        y, s[n.output[0]] = maxpool_forward(ins[0], a)
        return [y]

    def _f_GlobalAveragePool(self, n, a, ins, s):
        return [ins[0].mean(axis=tuple(range(2, ins[0].ndim)), keepdims=True)]

    def _f_Gemm(self, n, a, ins, s):
        A = ins[0].T if a.get("transA", 0) else ins[0]
        B = ins[1].T if a.get("transB", 0) else ins[1]
        y = a.get("alpha", 1.0) * (A @ B)
        if len(ins) > 2 and ins[2] is not None:
            y = y + a.get("beta", 1.0) * ins[2]
        return [y]

    def _f_MatMul(self, n, a, ins, s):
        return [np.matmul(ins[0], ins[1])]

    def _f_LayerNormalization(self, n, a, ins, s):
        x, scale = ins[0], ins[1]
        bias = ins[2] if len(ins) > 2 else None
        axis = a.get("axis", -1) % x.ndim
        eps = intended_value(a.get("epsilon", 1e-5))
        axes = tuple(range(axis, x.ndim))
        mean = x.mean(axis=axes, keepdims=True)
        rstd = 1.0 / np.sqrt(x.var(axis=axes, keepdims=True) + eps)
        xhat = (x - mean) * rstd
        s[n.output[0]] = (xhat, rstd, axes)
        y = xhat * scale + (bias if bias is not None else 0.0)
        return [y] + [None] * (len(n.output) - 1)

    def _f_Softmax(self, n, a, ins, s):
        axis = a.get("axis", -1)
        z = ins[0] - ins[0].max(axis=axis, keepdims=True)
        e = np.exp(z)
        return [e / e.sum(axis=axis, keepdims=True)]

    def _f_Dropout(self, n, a, ins, s):
        training = len(ins) > 2 and ins[2] is not None and bool(np.asarray(ins[2]))
        ratio = float(np.asarray(ins[1])) if len(ins) > 1 and ins[1] is not None else 0.5
        if training and ratio != 0.0:
            raise ValueError("reference: training-mode Dropout draws pipec's own masks; not supported")
        return [ins[0], np.ones(ins[0].shape, dtype=bool)][:len(n.output)]

    def _f_Relu(self, n, a, ins, s):
        return [np.maximum(ins[0], 0.0)]

    def _f_Erf(self, n, a, ins, s):
        return [_erf(ins[0]).astype(np.float64)]

    def _f_Sqrt(self, n, a, ins, s):
        return [np.sqrt(ins[0])]

    def _f_Add(self, n, a, ins, s):
        return [ins[0] + ins[1]]

    def _f_Sub(self, n, a, ins, s):
        return [ins[0] - ins[1]]

    def _f_Mul(self, n, a, ins, s):
        return [ins[0] * ins[1]]

    def _f_Div(self, n, a, ins, s):
        if ins[0].dtype.kind != "f":
            return [ins[0] // ins[1]]
        return [ins[0] / ins[1]]

    def _f_Where(self, n, a, ins, s):
        return [np.where(ins[0], ins[1], ins[2])]

    def _f_Equal(self, n, a, ins, s):
        return [ins[0] == ins[1]]

    def _f_Cast(self, n, a, ins, s):
        to = a["to"]
        if to in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE):
            return [ins[0].astype(np.float64)]
        if to == onnx.TensorProto.BOOL:
            return [ins[0].astype(bool)]
        return [ins[0].astype(onnx.helper.tensor_dtype_to_np_dtype(to))]

    def _f_Flatten(self, n, a, ins, s):
        axis = a.get("axis", 1) % max(ins[0].ndim, 1)
        return [ins[0].reshape(int(np.prod(ins[0].shape[:axis], dtype=np.int64)), -1)]

    def _f_Reshape(self, n, a, ins, s):
        shape = [int(d) for d in ins[1]]
        shape = [ins[0].shape[i] if d == 0 and not a.get("allowzero", 0) else d for i, d in enumerate(shape)]
        return [ins[0].reshape(shape)]

    def _f_Transpose(self, n, a, ins, s):
        return [np.transpose(ins[0], a.get("perm"))]

    def _f_Split(self, n, a, ins, s):
        axis = a.get("axis", 0)
        if len(ins) > 1 and ins[1] is not None:
            sizes = [int(v) for v in ins[1]]
        else:
            k = len(n.output)
            sizes = [ins[0].shape[axis] // k] * k
        return np.split(ins[0], np.cumsum(sizes)[:-1], axis=axis)

    def _f_Concat(self, n, a, ins, s):
        return [np.concatenate(ins, axis=a["axis"])]

    def _f_Unsqueeze(self, n, a, ins, s):
        axes = [int(v) for v in (ins[1] if len(ins) > 1 else a["axes"])]
        out = ins[0]
        rank = out.ndim + len(axes)
        for ax in sorted(v % rank for v in axes):
            out = np.expand_dims(out, ax)
        return [out]

    def _f_Shape(self, n, a, ins, s):
        return [np.array(ins[0].shape, dtype=np.int64)]

    def _f_Gather(self, n, a, ins, s):
        return [np.take(ins[0], ins[1], axis=a.get("axis", 0))]

    # -- backward --------------------------------------------------------------
    def backward(self, env, saved, dout):
        grads = {self.output: dout}

        def acc(name, g):
            if not name or env[name].dtype.kind != "f":
                return
            grads[name] = grads[name] + g if name in grads else g

        for n in reversed(self.nodes):
            dy = grads.get(n.output[0])
            if dy is None:
                continue
            a = _attrs(n)
            ins = [env[i] if i else None for i in n.input]
            op = n.op_type
            if op == "Conv":
                dx, dw, db = conv_backward(ins[0], ins[1], dy, a)
                acc(n.input[0], dx)
                acc(n.input[1], dw)
                if len(n.input) > 2:
                    acc(n.input[2], db)
            elif op == "BatchNormalization":
                xhat, std, shp, axes = saved[n.output[0]]
                scale = ins[1].reshape(shp)
                dxhat = dy * scale
                dx = (dxhat - dxhat.mean(axis=axes, keepdims=True)
                      - xhat * (dxhat * xhat).mean(axis=axes, keepdims=True)) / std.reshape(shp)
                acc(n.input[0], dx)
                acc(n.input[1], (dy * xhat).sum(axis=axes))
                acc(n.input[2], dy.sum(axis=axes))
            elif op == "MaxPool":
                acc(n.input[0], maxpool_backward(dy, saved[n.output[0]]))
            elif op == "GlobalAveragePool":
                x = ins[0]
                cnt = int(np.prod(x.shape[2:]))
                acc(n.input[0], np.broadcast_to(dy / cnt, x.shape).copy())
            elif op == "Gemm":
                alpha, beta = a.get("alpha", 1.0), a.get("beta", 1.0)
                tA, tB = a.get("transA", 0), a.get("transB", 0)
                Ae = ins[0].T if tA else ins[0]
                Be = ins[1].T if tB else ins[1]
                dAe, dBe = alpha * dy @ Be.T, alpha * Ae.T @ dy
                acc(n.input[0], dAe.T if tA else dAe)
                acc(n.input[1], dBe.T if tB else dBe)
                if len(n.input) > 2 and n.input[2]:
                    acc(n.input[2], _unbroadcast(beta * dy, ins[2].shape))
            elif op == "MatMul":
                A, B = ins
                A2 = A[None, :] if A.ndim == 1 else A
                B2 = B[:, None] if B.ndim == 1 else B
                dy2 = dy.reshape(np.matmul(A2, B2).shape)
                acc(n.input[0], _unbroadcast(np.matmul(dy2, np.swapaxes(B2, -1, -2)), A2.shape).reshape(A.shape))
                acc(n.input[1], _unbroadcast(np.matmul(np.swapaxes(A2, -1, -2), dy2), B2.shape).reshape(B.shape))
            elif op == "LayerNormalization":
                xhat, rstd, axes = saved[n.output[0]]
                scale = ins[1]
                dxhat = dy * scale
                dx = rstd * (dxhat - dxhat.mean(axis=axes, keepdims=True)
                             - xhat * (dxhat * xhat).mean(axis=axes, keepdims=True))
                acc(n.input[0], dx)
                acc(n.input[1], _unbroadcast(dy * xhat, scale.shape))
                if len(n.input) > 2 and n.input[2]:
                    acc(n.input[2], _unbroadcast(dy, ins[2].shape))
            elif op == "Softmax":
                y = env[n.output[0]]
                axis = a.get("axis", -1)
                acc(n.input[0], y * (dy - (dy * y).sum(axis=axis, keepdims=True)))
            elif op == "Relu":
                acc(n.input[0], dy * (ins[0] > 0))
            elif op == "Erf":
                acc(n.input[0], dy * 2.0 / math.sqrt(math.pi) * np.exp(-ins[0] ** 2))
            elif op == "Sqrt":
                acc(n.input[0], dy * 0.5 / env[n.output[0]])
            elif op in ("Add", "Sub"):
                acc(n.input[0], _unbroadcast(dy, ins[0].shape))
                acc(n.input[1], _unbroadcast(dy if op == "Add" else -dy, ins[1].shape))
            elif op == "Mul":
                acc(n.input[0], _unbroadcast(dy * ins[1], ins[0].shape))
                acc(n.input[1], _unbroadcast(dy * ins[0], ins[1].shape))
            elif op == "Div":
                acc(n.input[0], _unbroadcast(dy / ins[1], ins[0].shape))
                acc(n.input[1], _unbroadcast(-dy * ins[0] / ins[1] ** 2, ins[1].shape))
            elif op == "Where":
                acc(n.input[1], _unbroadcast(np.where(ins[0], dy, 0.0), ins[1].shape))
                acc(n.input[2], _unbroadcast(np.where(ins[0], 0.0, dy), ins[2].shape))
            elif op == "Cast":
                acc(n.input[0], dy)
            elif op in ("Flatten", "Reshape", "Unsqueeze", "Dropout"):
                acc(n.input[0], dy.reshape(ins[0].shape))
            elif op == "Transpose":
                acc(n.input[0], np.transpose(dy, np.argsort(a.get("perm"))))
            elif op in ("Split", "Concat"):
                axis = a.get("axis", 0)
                if op == "Split":
                    parts = [grads.get(o, np.zeros(env[o].shape)) for o in n.output]
                    acc(n.input[0], np.concatenate(parts, axis=axis))
                else:
                    sizes = np.cumsum([t.shape[axis] for t in ins])[:-1]
                    for name, g in zip(n.input, np.split(dy, sizes, axis=axis)):
                        acc(name, g)
            elif op == "Gather":
                if ins[0].dtype.kind == "f":
                    d = np.zeros_like(ins[0])
                    axis = a.get("axis", 0)
                    if axis != 0:
                        raise ValueError("reference: Gather gradient only on axis 0")
                    np.add.at(d, ins[1], dy)
                    acc(n.input[0], d)
            elif op in ("Equal", "Shape", "Constant"):
                pass
            else:
                raise ValueError(f"reference: no gradient for {op}")
        return grads

    # -- loss and training -----------------------------------------------------
    @staticmethod
    def cross_entropy(logits, labels):
        z2 = logits.reshape(-1, logits.shape[-1])
        y = labels.reshape(-1)
        rows = z2.shape[0]
        z = z2 - z2.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1))[:, None]
        loss = -logp[np.arange(rows), y].mean()
        p = np.exp(logp)
        p[np.arange(rows), y] -= 1.0
        return loss, (p / rows).reshape(logits.shape)

    def loss_and_grad(self, state, x, y, scale=1.0):
        """One microbatch: loss, parameter gradients (times `scale`) and the
        running statistics after it."""
        env, saved = self.forward(state, x)
        loss, dlogits = self.cross_entropy(env[self.output], y)
        grads = self.backward(env, saved, dlogits * scale)
        new_stats = {k: env[n.output[idx]] for k, (n, idx) in self.stats.items()}
        return loss, {k: grads.get(k, np.zeros_like(state[k])) for k in self.trainable}, new_stats

    def loss(self, state, x, y):
        env, _ = self.forward(state, x)
        return self.cross_entropy(env[self.output], y)[0]

    def train(self, x, y, steps, lr, batch, microbatches):
        """SGD steps over global batches of `batch` rows taken in order from
        x/y (cycled). Returns the final state and the step losses."""
        state = {k: v.copy() for k, v in self.initial.items()}
        nbatches = len(x) // batch
        mb = batch // microbatches
        losses = []
        for t in range(steps):
            b0 = (t % nbatches) * batch
            total = {k: np.zeros_like(state[k]) for k in self.trainable}
            step_loss = 0.0
            for j in range(microbatches):
                rows = slice(b0 + j * mb, b0 + (j + 1) * mb)
                loss, g, stats = self.loss_and_grad(state, x[rows], y[rows], 1.0 / microbatches)
                state.update(stats)
                step_loss += loss / microbatches
                for k in total:
                    total[k] += g[k]
            for k in total:
                state[k] = state[k] - lr * total[k]
            losses.append(step_loss)
        return state, losses

    def gradcheck(self, x, y, coords_per_tensor=2, eps=1e-6, seed=123):
        """Central finite differences of the loss on random coordinates (and
        the largest-gradient coordinate) of every trainable tensor. The
        running statistics are held fixed (they do not enter the loss in
        training mode). Returns (ok, coordinates checked, problems)."""
        rng = np.random.default_rng(seed)
        state = {k: v.copy() for k, v in self.initial.items()}
        _, grads, _ = self.loss_and_grad(state, x, y)
        bad, checked = [], 0
        for name in self.trainable:
            flat = state[name].reshape(-1)
            g = grads[name].reshape(-1)
            idx = list(rng.choice(flat.size, size=min(coords_per_tensor, flat.size), replace=False))
            idx.append(int(np.argmax(np.abs(g))))
            for i in idx:
                old = flat[i]
                flat[i] = old + eps
                lp = self.loss(state, x, y)
                flat[i] = old - eps
                lm = self.loss(state, x, y)
                flat[i] = old
                fd = (lp - lm) / (2 * eps)
                checked += 1
                if abs(fd - g[i]) > 1e-8 + 1e-5 * abs(g[i]):
                    bad.append(f"{name}[{i}]: analytic {g[i]:.6e} vs finite difference {fd:.6e}")
            if not np.any(g != 0):
                bad.append(f"{name}: gradient is all zero")
        return not bad, checked, bad
