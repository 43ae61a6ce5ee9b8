"""Torch implementations of the op catalog's kinds, for the torch backend's local compute.

What it is for: `runtime.torch_rank` runs every local op of a rank whose rule asks for the
`default` kernel (the op's own implementation on the local blocks) with the torch function
here when its kind has one, so the torch backend computes with torch ops, not only
communicates with torch. Each function has exactly the semantics and attrs of the kind's
numpy implementation (`shardlab.ops.*`, whose docstrings say what they compute): the same
formulas in the same order, the same broadcasting, the same errors for bad indices.
`tests/shardlab/runtime/test_torch_ops.py` checks every kind against the numpy
implementation in float64 and float32.

Attention and the masked softmax live in `runtime.torch_attention`, dropout (the same
SplitMix64 hash of the global element index, bit for bit) in `runtime.torch_dropout`; both
register here. `unpack` cuts the buffer as numpy does
(the rank's `block_shapes` come from the kernel, `runtime.torch_kernels.local_attrs`); kinds
without inputs (`fill`, `rope_cache`) make their tensors on the CPU, the rank moves them.
The rank-aware kernels (`runtime.kernels`) have torch versions in `runtime.torch_kernels`,
built on those modules' helpers. Kinds left out run their numpy kernel: `opaque` and the sync ops.

Torch stays lazy, as everywhere in the engine: importing this module does not import it;
the first `run_tensors` does (`load_torch`), in the torch backend's rank processes; code that
calls the helpers directly (`runtime.torch_kernels`) calls `load_torch` first.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from shardlab.errors import ExecutionError, OpSignatureError
from shardlab.ir import FLOAT_DTYPES
from shardlab.ops.base import Array, Attrs
from shardlab.ops.reduce import reduce_dims
from shardlab.ops.rope import _cache_attrs
from shardlab.ops.shape import _slice_args, _split_args
from shardlab.runtime import torch_attention, torch_dropout
from shardlab.runtime.torch_attention import ATTENTION_IMPLS
from shardlab.runtime.torch_device import bind_torch
from shardlab.runtime.torch_dropout import DROPOUT_IMPLS

if TYPE_CHECKING:
    import torch
    from torch import Tensor

#: (input tensors, attrs) -> output tensors, as the kind's numpy implementation.
TorchFn = Callable[["Sequence[Tensor]", Attrs], "list[Tensor]"]


def load_torch() -> None:
    """Bind `torch` in this module and in the kinds' modules it registers (the functions
    use it) on first use."""
    bind_torch(globals())
    torch_attention.load_torch()
    torch_dropout.load_torch()


def _sigmoid(x: Tensor) -> Tensor:
    return 0.5 * (1.0 + torch.tanh(0.5 * x))


def _gelu(x: Tensor, approximate: str) -> Tensor:
    if approximate == "tanh":
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)
        return 0.5 * x * (1.0 + torch.tanh(inner))
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def _matmul(xs: Sequence[Tensor], attrs: Attrs) -> list[Tensor]:
    a, b = xs
    if attrs.get("transpose_a", False):
        a = a.transpose(-1, -2)
    if attrs.get("transpose_b", False):
        b = b.transpose(-1, -2)
    return [torch.matmul(a, b)]


def _linear(xs: Sequence[Tensor], attrs: Attrs) -> list[Tensor]:
    y = torch.matmul(xs[0], xs[1])
    return [y + xs[2] if len(xs) == 3 else y]


def _binary(fn: Callable[[Tensor, Tensor], Tensor]) -> TorchFn:
    return lambda xs, attrs: [fn(xs[0], xs[1])]


def _unary(fn: Callable[[Tensor, Attrs], Tensor]) -> TorchFn:
    return lambda xs, attrs: [fn(xs[0], attrs)]


_UNARY: dict[str, Callable[[Tensor, Attrs], Tensor]] = {
    "neg": lambda x, a: -x,
    "relu": lambda x, a: torch.clamp_min(x, 0),
    "gelu": lambda x, a: _gelu(x, str(a.get("approximate", "none"))),
    "silu": lambda x, a: x * _sigmoid(x),
    "sigmoid": lambda x, a: _sigmoid(x),
    "tanh": lambda x, a: torch.tanh(x),
    "exp": lambda x, a: torch.exp(x),
    "log": lambda x, a: torch.log(x),
    "square": lambda x, a: x * x,
    "sqrt": lambda x, a: torch.sqrt(x),
    "rsqrt": lambda x, a: 1.0 / torch.sqrt(x),
}


def _cast(xs: Sequence[Tensor], attrs: Attrs) -> list[Tensor]:
    """Float-to-float casts keep the runtime's compute dtype; others convert for real."""
    x, dtype = xs[0], str(attrs["dtype"])
    if dtype in FLOAT_DTYPES:
        return [x.clone() if x.is_floating_point() else x.to(torch.float64)]
    if x.is_floating_point() and dtype != "bool" and not bool(torch.isfinite(x).all()):
        raise ExecutionError(f"cast to {dtype}: input holds non-finite values")
    return [x.to(getattr(torch, dtype))]


def _gelu_deriv(x: Tensor, approximate: str) -> Tensor:
    if approximate == "tanh":
        c = math.sqrt(2.0 / math.pi)
        t = torch.tanh(c * (x + 0.044715 * x**3))
        return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * 0.044715 * x * x)
    cdf = 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))
    return cdf + x * torch.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


_ACT_GRAD: dict[str, Callable[[Tensor, Attrs], Tensor]] = {
    "relu_grad": lambda x, a: (x > 0).to(x.dtype),
    "gelu_grad": lambda x, a: _gelu_deriv(x, str(a.get("approximate", "none"))),
    "silu_grad": lambda x, a: _sigmoid(x) * (1 + x * (1 - _sigmoid(x))),
    "sigmoid_grad": lambda x, a: _sigmoid(x) * (1 - _sigmoid(x)),
    "tanh_grad": lambda x, a: 1 - torch.tanh(x) ** 2,
}


def _act_grad(fn: Callable[[Tensor, Attrs], Tensor]) -> TorchFn:
    return lambda xs, attrs: [fn(xs[0], attrs) * xs[1]]


def _shifted(x: Tensor, dim: int) -> tuple[Tensor, Tensor]:
    """(x - max(x), sum(exp(x - max(x)))) along `dim`, dims kept."""
    z = x - torch.amax(x, dim=dim, keepdim=True)
    return z, torch.sum(torch.exp(z), dim=dim, keepdim=True)


def _softmax(xs: Sequence[Tensor], attrs: Attrs) -> list[Tensor]:
    z, total = _shifted(xs[0], int(attrs.get("dim", -1)))
    return [torch.exp(z) / total]


def _log_softmax(xs: Sequence[Tensor], attrs: Attrs) -> list[Tensor]:
    z, total = _shifted(xs[0], int(attrs.get("dim", -1)))
    return [z - torch.log(total)]


def _layer_norm(xs: Sequence[Tensor], attrs: Attrs) -> list[Tensor]:
    x, weight, bias = xs
    centered = x - torch.mean(x, dim=-1, keepdim=True)
    var = torch.mean(centered * centered, dim=-1, keepdim=True)
    eps = float(attrs.get("eps", 1e-5))
    return [centered / torch.sqrt(var + eps) * weight + bias]


def _rms_norm(xs: Sequence[Tensor], attrs: Attrs) -> list[Tensor]:
    x, weight = xs
    eps = float(attrs.get("eps", 1e-6))
    return [x / torch.sqrt(torch.mean(x * x, dim=-1, keepdim=True) + eps) * weight]


def _lead(x: Tensor) -> tuple[int, ...]:
    return tuple(range(x.dim() - 1))


def _layer_norm_grad(xs: Sequence[Tensor], attrs: Attrs) -> list[Tensor]:
    x, w, dy = xs
    mu = torch.mean(x, dim=-1, keepdim=True)
    var = torch.var(x, dim=-1, keepdim=True, correction=0)
    rstd = 1.0 / torch.sqrt(var + float(attrs.get("eps", 1e-5)))
    xhat = (x - mu) * rstd
    g = dy * w
    mean_g = torch.mean(g, dim=-1, keepdim=True)
    dx = rstd * (g - mean_g - xhat * torch.mean(g * xhat, dim=-1, keepdim=True))
    return [dx, torch.sum(dy * xhat, dim=_lead(x)), torch.sum(dy, dim=_lead(x))]


def _rms_norm_grad(xs: Sequence[Tensor], attrs: Attrs) -> list[Tensor]:
    x, w, dy = xs
    ms = torch.mean(x * x, dim=-1, keepdim=True)
    rstd = 1.0 / torch.sqrt(ms + float(attrs.get("eps", 1e-6)))
    g = dy * w
    dx = rstd * g - x * rstd**3 * torch.mean(g * x, dim=-1, keepdim=True)
    return [dx, torch.sum(dy * x * rstd, dim=_lead(x))]


def _check_indices(kind: str, what: str, ids: Tensor, bound: int, of: str) -> None:
    """ExecutionError (the numpy implementation's words) for indices outside [0, bound)."""
    if ids.numel():
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= bound:
            raise ExecutionError(
                f"{kind}: {what} hold values in [{low}, {high}], outside the {of} [0, {bound})"
            )


def _embedding(xs: Sequence[Tensor], attrs: Attrs) -> list[Tensor]:
    ids, table = xs
    _check_indices("embedding", "ids", ids, table.shape[0], "table's rows")
    return [table[ids.long()]]


def _embedding_grad(xs: Sequence[Tensor], attrs: Attrs) -> list[Tensor]:
    ids, dy = xs
    out = dy.new_zeros(int(attrs["vocab"]), dy.shape[-1])
    rows = dy.reshape(ids.numel(), dy.shape[-1])  # no -1: dy may be an empty block
    return [out.index_add_(0, ids.reshape(-1).long(), rows)]


def _reduce_terms(terms: Tensor, attrs: Attrs) -> Tensor:
    if attrs.get("reduction", "mean") == "sum":
        return torch.sum(terms)
    return torch.mean(terms)


def _cross_entropy(xs: Sequence[Tensor], attrs: Attrs) -> list[Tensor]:
    logits, labels = xs
    _check_indices("cross_entropy", "labels", labels, logits.shape[-1], "classes")
    peak = torch.amax(logits, dim=-1, keepdim=True)
    lse = peak[..., 0] + torch.log(torch.sum(torch.exp(logits - peak), dim=-1))
    picked = torch.gather(logits, -1, labels.long()[..., None])[..., 0]
    loss = _reduce_terms(lse - picked, attrs)
    return [loss, lse] if attrs.get("lse", False) else [loss]


def _cross_entropy_grad(xs: Sequence[Tensor], attrs: Attrs) -> list[Tensor]:
    logits, labels, dloss, lse = xs
    p = torch.exp(logits - lse[..., None])
    idx = labels.long()[..., None]
    p = p.scatter(-1, idx, torch.gather(p, -1, idx) - 1.0)
    n = labels.numel() if attrs.get("reduction", "mean") == "mean" else 1
    return [p * (dloss / n)]


def _mse_loss(xs: Sequence[Tensor], attrs: Attrs) -> list[Tensor]:
    diff = xs[0] - xs[1]
    return [_reduce_terms(diff * diff, attrs)]


def _reduction(kind: str) -> TorchFn:
    def impl(xs: Sequence[Tensor], attrs: Attrs) -> list[Tensor]:
        x = xs[0]
        dims = reduce_dims(x.dim(), attrs, kind)
        keep = bool(attrs.get("keepdim", False))
        if not dims:  # a 0-d input: numpy's reduction over no axis keeps it
            return [x.clone()]
        if kind == "max":
            return [torch.amax(x, dim=dims, keepdim=keep)]
        fn = torch.sum if kind == "sum" else torch.mean
        return [fn(x, dim=dims, keepdim=keep).to(x.dtype)]

    return impl


def _max_grad(xs: Sequence[Tensor], attrs: Attrs) -> list[Tensor]:
    x, y, dy = xs
    dims = reduce_dims(x.dim(), attrs, "max_grad")
    if not attrs.get("keepdim", False):
        for d in dims:  # sorted: each unsqueeze lands where numpy's expand_dims puts it
            y, dy = y.unsqueeze(d), dy.unsqueeze(d)
    hit = (x == y).to(x.dtype)
    return [hit * dy / torch.sum(hit, dim=dims, keepdim=True)]


def _index(shape: Sequence[int], attrs: Attrs) -> tuple[slice, ...]:
    """The index of the positions a `slice` op reads, its slice normalized for torch."""
    dim, sl = _slice_args(shape, attrs)
    picked = range(shape[dim])[sl]
    return (slice(None),) * dim + (slice(picked.start, picked.stop, picked.step),)


def _slice(xs: Sequence[Tensor], attrs: Attrs) -> list[Tensor]:
    return [xs[0][_index(xs[0].shape, attrs)]]


def _slice_grad(xs: Sequence[Tensor], attrs: Attrs) -> list[Tensor]:
    dy = xs[0]
    dim = int(attrs["dim"]) % dy.dim()
    shape = [*dy.shape]
    shape[dim] = int(attrs["size"])
    out = dy.new_zeros(shape)
    out[_index(shape, attrs)] = dy
    return [out]


def _transpose(xs: Sequence[Tensor], attrs: Attrs) -> list[Tensor]:
    return [xs[0].transpose(int(attrs["dim0"]), int(attrs["dim1"]))]


def _split(xs: Sequence[Tensor], attrs: Attrs) -> list[Tensor]:
    dim, sizes = _split_args(xs[0].shape, attrs)
    return list(torch.split(xs[0], sizes, dim=dim))


def _rotary(xs: Sequence[Tensor], attrs: Attrs) -> list[Tensor]:
    x, cos, sin = xs
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return [torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)]


def _unpack(xs: Sequence[Tensor], attrs: Attrs) -> list[Tensor]:
    """The buffer cut into `shapes`, or `block_shapes` when it is a rank's shorter block."""
    buf = xs[0].reshape(-1)
    shapes = [tuple(s) for s in attrs["shapes"]]
    if buf.numel() != sum(math.prod(s) for s in shapes):
        shapes = [tuple(s) for s in attrs.get("block_shapes", shapes)]
    if buf.numel() != sum(math.prod(s) for s in shapes):
        raise OpSignatureError(
            f"unpack: a buffer of {buf.numel()} elements fits neither 'shapes' nor 'block_shapes'"
        )
    pieces = torch.split(buf, [math.prod(s) for s in shapes])
    return [piece.reshape(s).clone() for piece, s in zip(pieces, shapes, strict=True)]


def _rope_cache(xs: Sequence[Tensor], attrs: Attrs) -> list[Tensor]:
    """cos, sin tables in float64 (ops/rope.py), on the CPU."""
    seq, head_dim, theta = _cache_attrs(attrs)
    inv_freq = theta ** (-2.0 * torch.arange(head_dim // 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(seq, dtype=torch.float64), inv_freq)
    return [torch.cos(angles), torch.sin(angles)]


def _fill(xs: Sequence[Tensor], attrs: Attrs) -> list[Tensor]:
    """A float64 tensor of attr shape, on the CPU (the numpy implementation's np.full)."""
    shape = tuple(int(d) for d in attrs["shape"])
    return [torch.full(shape, float(attrs["value"]), dtype=torch.float64)]


def _sgd(xs: Sequence[Tensor], attrs: Attrs) -> list[Tensor]:
    p, g = xs
    g = g + float(attrs.get("weight_decay", 0.0)) * p
    return [p - float(attrs["lr"]) * g]


def _adamw(xs: Sequence[Tensor], attrs: Attrs) -> list[Tensor]:
    """One AdamW step; with a master weight (5th input) it steps the master and the param
    is its copy (ops/autodiff_ops._adamw_np)."""
    if len(xs) == 5:
        p_new, m, v = _adamw([xs[4], *xs[1:4]], attrs)
        return [p_new.clone(), m, v, p_new]
    p, g, m, v = xs
    lr, eps = float(attrs["lr"]), float(attrs.get("eps", 1e-8))
    b1, b2 = (float(b) for b in attrs.get("betas", [0.9, 0.999]))
    step = int(attrs.get("step", 1))
    p = p * (1.0 - lr * float(attrs.get("weight_decay", 0.01)))
    m = m * b1 + (1.0 - b1) * g
    v = v * b2 + (1.0 - b2) * g * g
    bc1, bc2 = 1.0 - b1**step, 1.0 - b2**step
    denom = torch.sqrt(v) / math.sqrt(bc2) + eps
    return [p - (lr / bc1) * m / denom, m, v]


TORCH_IMPLS: dict[str, TorchFn] = {
    "matmul": _matmul,
    "linear": _linear,
    "add": _binary(operator.add),
    "sub": _binary(operator.sub),
    "mul": _binary(operator.mul),
    "div": _binary(operator.truediv),
    **{kind: _unary(fn) for kind, fn in _UNARY.items()},
    "scale": lambda xs, attrs: [xs[0] * float(attrs["factor"])],
    "cast": _cast,
    **{kind: _act_grad(fn) for kind, fn in _ACT_GRAD.items()},
    "softmax": _softmax,
    "log_softmax": _log_softmax,
    "layer_norm": _layer_norm,
    "rms_norm": _rms_norm,
    "layer_norm_grad": _layer_norm_grad,
    "rms_norm_grad": _rms_norm_grad,
    "rotary_embedding": _rotary,
    "embedding": _embedding,
    "embedding_grad": _embedding_grad,
    "cross_entropy": _cross_entropy,
    "cross_entropy_grad": _cross_entropy_grad,
    "mse_loss": _mse_loss,
    "reshape": lambda xs, attrs: [torch.reshape(xs[0], list(attrs["shape"]))],
    "transpose": _transpose,
    "permute": lambda xs, attrs: [xs[0].permute(*(int(p) for p in attrs["perm"]))],
    "concat": lambda xs, attrs: [torch.cat(list(xs), dim=int(attrs["dim"]))],
    "split": _split,
    "slice": _slice,
    "slice_grad": _slice_grad,
    "broadcast_to": lambda xs, attrs: [xs[0].expand(*attrs["shape"]).contiguous()],
    "sum": _reduction("sum"),
    "mean": _reduction("mean"),
    "max": _reduction("max"),
    "max_grad": _max_grad,
    "main_grad": lambda xs, attrs: [xs[0].clone()],
    "pack": lambda xs, attrs: [torch.cat([x.reshape(-1) for x in xs])],
    "unpack": _unpack,
    "fill": _fill,
    "rope_cache": _rope_cache,
    "sgd": _sgd,
    "adamw": _adamw,
    **ATTENTION_IMPLS,
    **DROPOUT_IMPLS,
}


#: Kinds that compute in float32 on 16-bit inputs, their outputs rounded back: softmax,
#: normalization and loss statistics, as the fused kernels of mixed-precision training
#: (flash attention, Apex / Megatron layer norm, vocab-parallel cross entropy) compute them;
#: in bfloat16 their sums and differences (`dp - sum(dp * p)`) lose every digit.
UPCAST_KINDS = frozenset({
    "softmax", "log_softmax", "masked_softmax", "masked_softmax_grad",
    "layer_norm", "rms_norm", "layer_norm_grad", "rms_norm_grad",
    "scaled_dot_product_attention", "attention_grad",
    "cross_entropy", "cross_entropy_grad", "mse_loss", "sgd", "adamw",
})  # fmt: skip


def run_torch(kind: str, xs: Sequence[Array], attrs: Attrs) -> list[Array]:
    """`TORCH_IMPLS[kind]` on numpy blocks (`run_tensors` on each wrapped by
    `torch.from_numpy`: no copy, once C-contiguous and writable), each output handed back
    as `.numpy()` (no copy)."""
    load_torch()
    tensors = [torch.from_numpy(_wrappable(np.asarray(x))) for x in xs]
    return [y.numpy() for y in run_tensors(kind, tensors, attrs)]


def run_tensors(kind: str, xs: Sequence[Tensor], attrs: Attrs) -> list[Tensor]:
    """`TORCH_IMPLS[kind]` on tensors (a torch rank's blocks, on its device).

    Float tensors of different dtypes (a float32 activation and the rope tables, float64; a
    bfloat16 activation and a float32 master) are first cast to their common dtype, as
    numpy's promotion would compute them: torch's matmul, einsum and index_add do not
    promote. `UPCAST_KINDS` compute 16-bit inputs in float32."""
    load_torch()
    floats = {x.dtype for x in xs if x.is_floating_point()}
    if len(floats) > 1:
        common = next(iter(floats))
        for dtype in floats:
            common = torch.promote_types(common, dtype)
        xs = [x.to(common) if x.is_floating_point() else x for x in xs]
    if kind in UPCAST_KINDS and floats & {torch.bfloat16, torch.float16}:
        low = next(x.dtype for x in xs if x.is_floating_point())
        wide = [x.float() if x.is_floating_point() else x for x in xs]
        return [y.to(low) if y.is_floating_point() else y for y in TORCH_IMPLS[kind](wide, attrs)]
    return TORCH_IMPLS[kind](xs, attrs)


def _wrappable(x: Array) -> Array:
    """`x`, or a C-contiguous writable copy where torch cannot share its memory."""
    if x.flags.c_contiguous and x.flags.writeable:
        return x
    return np.array(x, order="C", copy=True)
