"""Kinds that `shardlab.autodiff` emits: gradient seeds, backward kernels and optimizer steps.

- fill(): attrs `shape`, `value`, `dtype` -> a constant tensor (the d(loss) = 1 seed, zeros).
- broadcast_to(x): attr `shape` (numpy broadcasting of x to it).
- relu_grad / gelu_grad / silu_grad / sigmoid_grad / tanh_grad (x, dy) -> dx = f'(x) * dy
  (gelu_grad: attr `approximate`).
- max_grad(x, y, dy): attrs `dims`, `keepdim` as the forward `max`; dy split evenly among the
  positions that equal the maximum (torch `amax` semantics).
- slice_grad(dy): attrs of the forward `slice` plus `size` (the sliced dim's size) -> zeros
  with dy written at the sliced positions.
- layer_norm_grad(x, w, dy) -> dx, dw, db; rms_norm_grad(x, w, dy) -> dx, dw (attr `eps`).
- attention_grad(q, k, v, dy) -> dq, dk, dv (attrs `causal`, `scale`; grouped-query heads).
- cross_entropy_grad(logits, labels, dloss, lse) -> dlogits (attr `reduction`): the
  softmax exp(logits - lse) from the log-sum-exp per label that the forward kept
  (`cross_entropy` with attr `lse`), minus the one-hot of the labels, times dloss [/ N].
- embedding_grad(ids, dy): attr `vocab` -> dtable [vocab, H] by scatter-add.
- sgd(param, grad): attrs `lr`, `weight_decay` (default 0) -> new param.
- main_grad(grad16) -> grad32: a 16-bit parameter gradient as Megatron-LM's float32 main
  gradient (accumulated and reduced in float32); the runtime keeps its compute dtype. It
  moves no bytes of its own: Megatron-LM writes the weight gradient's GEMM output straight
  into the float32 buffer (gradient accumulation fusion), so it costs no time.
- adamw(param, grad, exp_avg, exp_avg_sq[, master]): attrs `lr`, `betas`, `eps`,
  `weight_decay`, `step` (>= 1) -> new param, exp_avg, exp_avg_sq[, master]; one
  torch.optim.AdamW step (on the float32 master when given; the param is its copy).

FLOPs (what the cost model charges): fill, broadcast_to and slice_grad only move data (0).
Elementwise kernels count per element of their main tensor, as the forward kinds do
(elementwise.py, norm.py): the activation derivative recomputed from x plus the product with
dy, the norm backward's recomputed statistics and its reductions, the softmax recomputed by
cross_entropy_grad, one add per scattered element of embedding_grad, and the optimizer's
arithmetic (`_PER_ELEMENT`). attention_grad counts its five matmuls (flash-attention style:
recompute S = q k^T, then dV = P^T dY, dP = dY V^T, dQ = dS K, dK = dS^T Q), which is 2.5x the
forward's two when D == Dv, over the same causal pair count as the forward (attention.py);
like the forward it leaves out the softmax.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from shardlab.errors import OpSignatureError
from shardlab.ir import DTYPE_BYTES, INT_DTYPES, TensorType
from shardlab.ops.base import (
    Array,
    Attrs,
    CountFn,
    NumpyFn,
    OpDef,
    attr_bool,
    attr_float,
    attr_int,
    attr_ints,
    attr_str,
    broadcast_shapes,
    no_flops,
    register,
    require_float,
)
from shardlab.ops.elementwise import _erf, sigmoid
from shardlab.ops.reduce import reduce_dims
from shardlab.ops.shape import _slice_args

FAMILY = "autodiff_ops"


def _reg(kind: str, doc: str, n_in: int, infer: Callable[..., list[TensorType]], impl: NumpyFn,
         index_bounds: Callable[..., dict[int, int]] | None = None,
         flops: CountFn = no_flops, max_in: int | None = None) -> None:  # fmt: skip
    """Register `kind` taking `n_in` inputs (up to `max_in` when given)."""
    n_max = n_in if max_in is None else max_in
    register(
        OpDef(kind, FAMILY, doc, n_in, n_max, infer, impl, flops=flops, index_bounds=index_bounds)
    )


#: FLOPs per element of the counted input (see `_per_element`):
#: activation grads = f'(x) recomputed from x (the forward's cost in elementwise.py, plus the
#: few ops of the derivative) + 1 for the product with dy; max_grad = compare, count, multiply,
#: divide; norm grads = recomputed statistics (ln 5, rms 2) + g = dy * w (1) + the two row
#: reductions and the dx formula (ln 7, rms 6) + dweight (and dbias) sums (ln 3, rms 3);
#: cross_entropy_grad = softmax from the kept log-sum-exp (sub, exp) + scaling by dloss / N;
#: embedding_grad = one add per element of dy; adamw = decay 1 + exp_avg 3 + exp_avg_sq 4 +
#: denominator 3 + update 3.
_PER_ELEMENT: dict[str, int] = {
    "relu_grad": 1,
    "gelu_grad": 12,
    "silu_grad": 8,
    "sigmoid_grad": 7,
    "tanh_grad": 7,
    "max_grad": 4,
    "layer_norm_grad": 16,
    "rms_norm_grad": 12,
    "cross_entropy_grad": 3,
    "embedding_grad": 1,
    "adamw": 14,
}


def _per_element(kind: str, which: int = 0) -> CountFn:
    """`_PER_ELEMENT[kind]` FLOPs per element of input `which`."""
    cost = _PER_ELEMENT[kind]
    return lambda ins, outs, attrs: cost * ins[which].numel


def _fill_infer(ins: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    shape = attr_ints(attrs, "shape")
    if any(d <= 0 for d in shape):
        raise OpSignatureError(f"fill: attribute 'shape' {shape} must be positive", attr="shape")
    attr_float(attrs, "value")
    return [TensorType(tuple(shape), attr_str(attrs, "dtype", tuple(DTYPE_BYTES), "float32"))]


_reg("fill", "a tensor of attr shape and dtype, every element attr value.", 0, _fill_infer,
     lambda xs, a: [np.full(tuple(a["shape"]), float(a["value"]))])  # fmt: skip


def _bcast_infer(ins: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    shape = tuple(attr_ints(attrs, "shape"))
    if broadcast_shapes(ins[0].shape, shape, "broadcast_to") != shape:
        raise OpSignatureError(f"broadcast_to: {ins[0]} does not broadcast to {list(shape)}")
    return [ins[0].with_shape(shape)]


_reg("broadcast_to", "x broadcast (numpy rules) to attr shape.", 1, _bcast_infer,
     lambda xs, a: [np.broadcast_to(xs[0], tuple(a["shape"])).copy()])  # fmt: skip


def _x_dy_infer(kind: str) -> Callable[[Sequence[TensorType], Attrs], list[TensorType]]:
    def infer(ins: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
        require_float(ins[0], kind)
        if ins[0] != ins[-1]:
            raise OpSignatureError(f"{kind}: dy {ins[-1]} must have x's type {ins[0]}")
        if kind == "gelu_grad":
            attr_str(attrs, "approximate", ("none", "tanh"), "none")
        return [ins[0]]

    return infer


def _gelu_deriv(x: Array, approximate: str) -> Array:
    if approximate == "tanh":
        c = math.sqrt(2.0 / math.pi)
        t = np.tanh(c * (x + 0.044715 * x**3))
        return np.asarray(0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * 0.044715 * x * x))
    cdf = 0.5 * (1.0 + _erf(x / math.sqrt(2.0)))  # erf is evaluated in float64
    return np.asarray(cdf + x * np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)).astype(x.dtype)


_ACT: dict[str, Callable[[Array, Attrs], Array]] = {
    "relu_grad": lambda x, a: (x > 0).astype(x.dtype),
    "gelu_grad": lambda x, a: _gelu_deriv(x, str(a.get("approximate", "none"))),
    "silu_grad": lambda x, a: sigmoid(x) * (1 + x * (1 - sigmoid(x))),
    "sigmoid_grad": lambda x, a: sigmoid(x) * (1 - sigmoid(x)),
    "tanh_grad": lambda x, a: 1 - np.tanh(x) ** 2,
}


def _act_np(fn: Callable[[Array, Attrs], Array]) -> NumpyFn:
    return lambda xs, a: [fn(xs[0], a) * xs[1]]


for _kind, _fn in _ACT.items():
    _reg(_kind, f"dx = {_kind[:-5]}'(x) * dy for (x, dy).", 2, _x_dy_infer(_kind), _act_np(_fn),
         flops=_per_element(_kind))  # fmt: skip


def _max_grad_np(xs: Sequence[Array], attrs: Attrs) -> list[Array]:
    x, y, dy = xs
    dims = reduce_dims(x.ndim, attrs, "max_grad")
    if not attrs.get("keepdim", False):
        y, dy = np.expand_dims(y, dims), np.expand_dims(dy, dims)
    hit = (x == y).astype(x.dtype)
    return [hit * dy / np.sum(hit, axis=dims, keepdims=True)]


_reg("max_grad", "dx of max (x, y, dy): dy split evenly among the maxima; attrs of max.", 3,
     lambda ins, a: [ins[0]], _max_grad_np, flops=_per_element("max_grad"))  # fmt: skip


def _slice_grad_infer(ins: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    dim = attr_int(attrs, "dim") % ins[0].rank
    shape = [*ins[0].shape]
    shape[dim] = attr_int(attrs, "size")
    _slice_args(shape, attrs)
    return [ins[0].with_shape(shape)]


def _slice_grad_np(xs: Sequence[Array], attrs: Attrs) -> list[Array]:
    dim = int(attrs["dim"]) % xs[0].ndim
    shape = [*xs[0].shape]
    shape[dim] = int(attrs["size"])
    out = np.zeros(shape, dtype=xs[0].dtype)
    _, sl = _slice_args(shape, attrs)
    out[(slice(None),) * dim + (sl,)] = xs[0]
    return [out]


_reg("slice_grad", "zeros with dy at the positions the forward slice read; attr size.", 1,
     _slice_grad_infer, _slice_grad_np)  # fmt: skip


def _norm_grad_infer(kind: str) -> Callable[[Sequence[TensorType], Attrs], list[TensorType]]:
    def infer(ins: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
        x, w, dy = ins
        require_float(x, kind)
        if dy != x or w.shape != (x.shape[-1],):
            raise OpSignatureError(f"{kind}: needs x, weight [{x.shape[-1]}], dy of x's type")
        return [x, w, w] if kind == "layer_norm_grad" else [x, w]

    return infer


def _ln_grad_np(xs: Sequence[Array], attrs: Attrs) -> list[Array]:
    x, w, dy = xs
    mu = np.mean(x, axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(np.var(x, axis=-1, keepdims=True) + float(attrs.get("eps", 1e-5)))
    xhat = (x - mu) * rstd
    lead = tuple(range(x.ndim - 1))
    g = dy * w
    dx = rstd * (g - np.mean(g, -1, keepdims=True) - xhat * np.mean(g * xhat, -1, keepdims=True))
    return [dx, np.sum(dy * xhat, axis=lead), np.sum(dy, axis=lead)]


def _rms_grad_np(xs: Sequence[Array], attrs: Attrs) -> list[Array]:
    x, w, dy = xs
    rstd = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + float(attrs.get("eps", 1e-6)))
    g = dy * w
    dx = rstd * g - x * rstd**3 * np.mean(g * x, axis=-1, keepdims=True)
    return [dx, np.sum(dy * x * rstd, axis=tuple(range(x.ndim - 1)))]


_reg("layer_norm_grad", "dx, dweight, dbias of layer_norm from (x, weight, dy); attr eps.", 3,
     _norm_grad_infer("layer_norm_grad"), _ln_grad_np,
     flops=_per_element("layer_norm_grad"))  # fmt: skip
_reg("rms_norm_grad", "dx, dweight of rms_norm from (x, weight, dy); attr eps.", 3,
     _norm_grad_infer("rms_norm_grad"), _rms_grad_np,
     flops=_per_element("rms_norm_grad"))  # fmt: skip


def _attn_grad_np(xs: Sequence[Array], attrs: Attrs) -> list[Array]:
    q, k, v, dy = xs
    return attention_backward(q, k, v, dy, bool(attrs.get("causal", True)), attrs.get("scale"))


def attention_backward(
    q: Array, k: Array, v: Array, dy: Array, causal: bool, scale: float | None
) -> list[Array]:
    """dq, dk, dv of grouped-query attention (query head h reads kv head h // group)."""
    group = q.shape[2] // k.shape[2] if k.shape[2] else 1  # no heads: an empty block
    kr, vr = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
    scale = 1.0 / math.sqrt(q.shape[3]) if scale is None else float(scale)
    s = np.einsum("bqhd,bkhd->bhqk", q, kr) * scale
    if causal:
        s = np.where(np.triu(np.ones(s.shape[-2:], dtype=bool), k=1), -np.inf, s)
    p = np.exp(s - np.max(s, axis=-1, keepdims=True))
    p /= np.sum(p, axis=-1, keepdims=True)
    dvr = np.einsum("bhqk,bqhd->bkhd", p, dy)
    dp = np.einsum("bqhd,bkhd->bhqk", dy, vr)
    ds = p * (dp - np.sum(dp * p, axis=-1, keepdims=True)) * scale
    dq = np.einsum("bhqk,bkhd->bqhd", ds, kr)
    dkr = np.einsum("bhqk,bqhd->bkhd", ds, q)
    b, skv, hkv = k.shape[:3]
    dk = dkr.reshape(b, skv, hkv, group, k.shape[3]).sum(axis=3)  # no -1: blocks may be empty
    dv = dvr.reshape(b, skv, hkv, group, v.shape[3]).sum(axis=3)
    return [dq, dk, dv]


def _attn_grad_infer(ins: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    q, k, v, dy = ins
    if dy.shape != (*q.shape[:3], v.shape[3]):
        raise OpSignatureError(f"attention_grad: dy must be [B, Sq, Hq, Dv], got {dy}")
    attr_bool(attrs, "causal", True)
    return [q, k, v]


def _attn_grad_flops(ins: Sequence[TensorType], outs: Sequence[TensorType], attrs: Attrs) -> int:
    """Recomputed S (D) + dV, dP (Dv each) + dQ, dK (D each), over the forward's pair count."""
    q, k, v, _ = ins
    b, sq, hq, d = q.shape
    pairs = sq * (sq + 1) // 2 if attrs.get("causal", True) else sq * k.shape[1]
    return 2 * b * hq * pairs * (3 * d + 2 * v.shape[3])


_reg("attention_grad", "dq, dk, dv of scaled_dot_product_attention from (q, k, v, dy); "
     "attrs causal, scale; grouped-query heads.", 4, _attn_grad_infer, _attn_grad_np,
     flops=_attn_grad_flops)  # fmt: skip


def _ce_grad_infer(ins: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    logits, labels, dloss, lse = ins
    require_float(logits, "cross_entropy_grad")
    lead = logits.shape[:-1]
    if (labels.dtype not in INT_DTYPES or labels.shape != lead or dloss.shape
            or lse.shape != lead or not lse.is_float):  # fmt: skip
        raise OpSignatureError(
            "cross_entropy_grad: needs logits [..., V], labels [...], dloss [], lse [...] float"
        )
    attr_str(attrs, "reduction", ("mean", "sum"), "mean")
    return [logits]


def _ce_grad_np(xs: Sequence[Array], attrs: Attrs) -> list[Array]:
    logits, labels, dloss, lse = xs
    p = np.exp(logits - lse[..., None])
    idx = labels[..., None].astype(np.int64)
    np.put_along_axis(p, idx, np.take_along_axis(p, idx, axis=-1) - 1.0, axis=-1)
    n = labels.size if attrs.get("reduction", "mean") == "mean" else 1
    return [p * (dloss / n)]


_reg("cross_entropy_grad", "dlogits = (exp(logits - lse) - onehot(labels)) * dloss [/ N], "
     "lse the forward's log-sum-exp per label; attr reduction.", 4, _ce_grad_infer, _ce_grad_np,
     index_bounds=lambda ins, a: {1: ins[0].shape[-1]},
     flops=_per_element("cross_entropy_grad"))  # fmt: skip


def _emb_grad_infer(ins: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    ids, dy = ins
    if ids.dtype not in INT_DTYPES or dy.shape[:-1] != ids.shape:
        raise OpSignatureError(f"embedding_grad: needs ids [...] and dy [..., H], got {ids}, {dy}")
    return [dy.with_shape((attr_int(attrs, "vocab"), dy.shape[-1]))]


def _emb_grad_np(xs: Sequence[Array], attrs: Attrs) -> list[Array]:
    ids, dy = xs
    out = np.zeros((int(attrs["vocab"]), dy.shape[-1]), dtype=dy.dtype)
    np.add.at(out, ids.reshape(-1), dy.reshape(ids.size, dy.shape[-1]))  # dy may be empty
    return [out]


_reg("embedding_grad", "dtable [vocab, H]: rows of dy scatter-added at ids; attr vocab.", 2,
     _emb_grad_infer, _emb_grad_np, index_bounds=lambda ins, a: {0: int(a["vocab"])},
     flops=_per_element("embedding_grad", which=1))  # fmt: skip


def _main_grad_infer(ins: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    require_float(ins[0], "main_grad", "gradient")
    return [ins[0].with_dtype("float32")]


def _main_grad_np(xs: Sequence[Array], attrs: Attrs) -> list[Array]:
    return [np.array(xs[0], copy=True)]


register(
    OpDef("main_grad", FAMILY, "the float32 main gradient of a 16-bit parameter gradient.",
          1, 1, _main_grad_infer, _main_grad_np, bytes=no_flops)
)  # fmt: skip


def _opt_infer(kind: str) -> Callable[[Sequence[TensorType], Attrs], list[TensorType]]:
    def infer(ins: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
        require_float(ins[0], kind, "param")
        if any(t.shape != ins[0].shape for t in ins):
            raise OpSignatureError(f"{kind}: every input must have the param's shape")
        attr_float(attrs, "lr")
        if kind == "adamw" and attr_int(attrs, "step", 1) < 1:
            raise OpSignatureError("adamw: attribute 'step' must be >= 1", attr="step")
        if kind == "sgd":
            return [ins[0]]
        if len(ins) == 5 and not ins[4].is_float:
            raise OpSignatureError("adamw: the master weight must be a float tensor")
        return [ins[0], *ins[2:]]

    return infer


def _sgd_np(xs: Sequence[Array], attrs: Attrs) -> list[Array]:
    p, g = xs
    g = g + float(attrs.get("weight_decay", 0.0)) * p
    return [p - float(attrs["lr"]) * g]


def _adamw_np(xs: Sequence[Array], attrs: Attrs) -> list[Array]:
    """With a master weight (5th input), the step updates the master and the param is its
    copy in the param's dtype (mixed precision)."""
    if len(xs) == 5:
        p_new, m, v = _adamw_np([xs[4], *xs[1:4]], attrs)
        return [p_new.copy(), m, v, p_new]
    p, g, m, v = xs
    lr, eps = float(attrs["lr"]), float(attrs.get("eps", 1e-8))
    b1, b2 = (float(b) for b in attrs.get("betas", [0.9, 0.999]))
    step = int(attrs.get("step", 1))
    p = p * (1.0 - lr * float(attrs.get("weight_decay", 0.01)))
    m = m * b1 + (1.0 - b1) * g
    v = v * b2 + (1.0 - b2) * g * g
    bc1, bc2 = 1.0 - b1**step, 1.0 - b2**step
    denom = np.sqrt(v) / math.sqrt(bc2) + eps
    return [p - (lr / bc1) * m / denom, m, v]


def _sgd_flops(ins: Sequence[TensorType], outs: Sequence[TensorType], attrs: Attrs) -> int:
    """lr * grad and the subtraction; weight decay adds a multiply and an add."""
    return (4 if attrs.get("weight_decay") else 2) * ins[0].numel


_reg("sgd", "param - lr * (grad + weight_decay * param); attrs lr, weight_decay (0).", 2,
     _opt_infer("sgd"), _sgd_np, flops=_sgd_flops)  # fmt: skip
_reg("adamw", "one torch.optim.AdamW step of (param, grad, exp_avg, exp_avg_sq[, master]) -> "
     "new param, exp_avg, exp_avg_sq[, master]; attrs lr, betas, eps, weight_decay, step. With "
     "a float32 master weight the step updates it and the param becomes its copy.", 4,
     _opt_infer("adamw"), _adamw_np, flops=_per_element("adamw"), max_in=5)  # fmt: skip
