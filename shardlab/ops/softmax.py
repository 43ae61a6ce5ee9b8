"""`softmax` and `log_softmax` along attr `dim` (default -1), floating-point inputs only;
`masked_softmax` and its backward kernel `masked_softmax_grad` for eager attention.

The numpy implementations subtract the maximum along `dim` before exponentiating, so large
inputs do not overflow. FLOPs: about 5 per element (max, subtract, exp, sum, divide / log).

- masked_softmax(x): softmax over the last dim of `x * scale`, with a causal mask when attr
  `causal` (default false): the last two dims are (query, key), of equal size, and query i
  sees keys j <= i + `query_offset` (the global index of x's first query row; 0 unless a
  kernel runs it on a block of queries). Attrs `scale` (a number, default 1). 6 FLOPs per
  element (the scaling, then the softmax's 5).
- masked_softmax_grad(y, dy) -> dx = scale * y * (dy - sum(dy * y)) over the last dim: it
  needs only the forward's output y (masked positions have y = 0, so dx = 0 there), so the
  scores need not be kept for backward. Attr `scale`. 5 FLOPs per element.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from shardlab.errors import OpSignatureError
from shardlab.ir import TensorType
from shardlab.ops.base import (
    Array,
    Attrs,
    OpDef,
    attr_bool,
    attr_float,
    attr_int,
    normalize_dim,
    register,
    require_float,
)


def _infer(kind: str) -> Callable[[Sequence[TensorType], Attrs], list[TensorType]]:
    def infer(ins: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
        require_float(ins[0], kind)
        normalize_dim(attr_int(attrs, "dim", -1), ins[0].rank, f"{kind}: attribute 'dim'")
        return [ins[0]]

    return infer


def _flops(ins: Sequence[TensorType], outs: Sequence[TensorType], attrs: Attrs) -> int:
    return 5 * ins[0].numel


def _shifted(x: Array, dim: int) -> tuple[Array, Array]:
    """(x - max(x), sum(exp(x - max(x)))) along `dim`, keeping dims for broadcasting."""
    z = x - np.max(x, axis=dim, keepdims=True)
    return z, np.sum(np.exp(z), axis=dim, keepdims=True)


def _softmax_np(xs: Sequence[Array], attrs: Attrs) -> list[Array]:
    z, total = _shifted(xs[0], int(attrs.get("dim", -1)))
    return [np.exp(z) / total]


def _log_softmax_np(xs: Sequence[Array], attrs: Attrs) -> list[Array]:
    z, total = _shifted(xs[0], int(attrs.get("dim", -1)))
    return [z - np.log(total)]


for _kind, _impl, _doc in (
    ("softmax", _softmax_np, "exp(x) / sum(exp(x))"),
    ("log_softmax", _log_softmax_np, "x - log(sum(exp(x)))"),
):
    register(
        OpDef(
            kind=_kind,
            family="softmax",
            doc=f"{_doc} along attr dim (default -1); floating-point input.",
            min_inputs=1,
            max_inputs=1,
            infer=_infer(_kind),
            numpy_impl=_impl,
            flops=_flops,
        )
    )


def _masked_infer(ins: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    x = ins[0]
    require_float(x, "masked_softmax")
    attr_float(attrs, "scale", 1.0)
    if attr_bool(attrs, "causal") and (x.rank < 2 or x.shape[-2] != x.shape[-1]):
        raise OpSignatureError(
            f"masked_softmax: attribute 'causal' needs [..., queries, keys] with as many "
            f"queries as keys, got {x}",
            attr="causal",
        )
    return [x]


def masked_softmax(x: Array, scale: float, causal: bool, query_offset: int = 0) -> Array:
    """softmax(x * scale) over the last dim; when causal, keys j > query i + offset masked."""
    z = x * scale
    if causal:
        above = np.triu(np.ones(x.shape[-2:], dtype=bool), k=1 + query_offset)
        z = np.where(above, -np.inf, z)
    z = z - np.max(z, axis=-1, keepdims=True)
    e = np.exp(z)
    return np.asarray(e / np.sum(e, axis=-1, keepdims=True))


def _masked_np(xs: Sequence[Array], attrs: Attrs) -> list[Array]:
    scale = float(attrs.get("scale", 1.0))
    return [masked_softmax(xs[0], scale, bool(attrs.get("causal", False)))]


def _masked_grad_infer(ins: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    y, dy = ins
    require_float(y, "masked_softmax_grad")
    if dy != y or y.rank < 1:
        raise OpSignatureError(f"masked_softmax_grad: dy {dy} must have y's type {y}")
    attr_float(attrs, "scale", 1.0)
    return [y]


def _masked_grad_np(xs: Sequence[Array], attrs: Attrs) -> list[Array]:
    y, dy = xs
    dot = np.sum(dy * y, axis=-1, keepdims=True)
    return [np.asarray(float(attrs.get("scale", 1.0)) * y * (dy - dot))]


register(
    OpDef(
        kind="masked_softmax",
        family="softmax",
        doc="softmax(x * scale) over the last dim, keys after the query masked when causal "
        "([..., queries, keys]); attrs scale (default 1), causal (default false).",
        min_inputs=1,
        max_inputs=1,
        infer=_masked_infer,
        numpy_impl=_masked_np,
        flops=lambda ins, outs, attrs: 6 * ins[0].numel,
    )
)
register(
    OpDef(
        kind="masked_softmax_grad",
        family="softmax",
        doc="dx = scale * y * (dy - sum(dy * y)) over the last dim, from masked_softmax's "
        "output y and dy; attr scale.",
        min_inputs=2,
        max_inputs=2,
        infer=_masked_grad_infer,
        numpy_impl=_masked_grad_np,
        flops=lambda ins, outs, attrs: 5 * ins[0].numel,
    )
)
