"""Reductions: `sum`, `mean` and `max` over some or all dims of one input.

Attrs: `dims` (a list of dims, negative allowed; null or absent reduces every dim) and
`keepdim` (keep reduced dims as size 1; default false). The output keeps the input's dtype;
`max` returns the values only. FLOPs: one per input element.
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
    attr_ints,
    normalize_dim,
    register,
    require_float,
)


def reduce_dims(rank: int, attrs: Attrs, kind: str) -> tuple[int, ...]:
    """The reduced dims in [0, rank), sorted; every dim when `dims` is null or absent."""
    if attrs.get("dims") is None:
        return tuple(range(rank))
    dims = attr_ints(attrs, "dims")
    if not dims:
        raise OpSignatureError(
            f"{kind}: attribute 'dims' is empty; use null to reduce every dim", attr="dims"
        )
    norm = [normalize_dim(d, rank, f"{kind}: 'dims' entry") for d in dims]
    if len(set(norm)) != len(norm):
        raise OpSignatureError(
            f"{kind}: attribute 'dims' {dims} names a dim twice (rank {rank})", attr="dims"
        )
    return tuple(sorted(norm))


def _infer(kind: str) -> Callable[[Sequence[TensorType], Attrs], list[TensorType]]:
    def infer(ins: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
        x = ins[0]
        if kind == "mean":
            require_float(x, kind)
        elif x.dtype == "bool":
            raise OpSignatureError(f"{kind} needs a numeric input, got {x}")
        dims = reduce_dims(x.rank, attrs, kind)
        keep = attr_bool(attrs, "keepdim")
        shape = [1 if i in dims else n for i, n in enumerate(x.shape) if keep or i not in dims]
        return [x.with_shape(shape)]

    return infer


def _flops(ins: Sequence[TensorType], outs: Sequence[TensorType], attrs: Attrs) -> int:
    return ins[0].numel


def _numpy(kind: str, fn: Callable[..., Array]) -> Callable[[Sequence[Array], Attrs], list[Array]]:
    def impl(xs: Sequence[Array], attrs: Attrs) -> list[Array]:
        x = xs[0]
        dims = reduce_dims(x.ndim, attrs, kind)
        keep = bool(attrs.get("keepdim", False))
        return [np.asarray(fn(x, axis=dims, keepdims=keep)).astype(x.dtype, copy=False)]

    return impl


_REDUCE: dict[str, tuple[Callable[..., Array], str]] = {
    "sum": (np.sum, "sum"),
    "mean": (np.mean, "mean (floating-point input)"),
    "max": (np.max, "maximum (values only)"),
}

for _kind, (_fn, _doc) in _REDUCE.items():
    register(
        OpDef(
            kind=_kind,
            family="reduce",
            doc=f"{_doc} over attr dims (null: all dims); attr keepdim (default false).",
            min_inputs=1,
            max_inputs=1,
            infer=_infer(_kind),
            numpy_impl=_numpy(_kind, _fn),
            flops=_flops,
        )
    )
