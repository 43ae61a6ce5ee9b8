"""Shape ops that move data without arithmetic (FLOPs 0 for all).

- reshape(x): attr `shape` (at most one -1, same element count). Bytes 0: a view.
- transpose(x): attrs `dim0`, `dim1`; permute(x): attr `perm` (a permutation of
  range(rank)). Both count a contiguous copy (input read, output written).
- split(x): attrs `dim`, `sizes` (positive, summing to the dim) -> one output per size.
- concat(*xs): attr `dim`; every other dim and the dtype must agree.
- slice(x): attrs `dim`, `start`, `stop` (int or null, Python semantics: negative counts from
  the end, out-of-range values clamp), `step` (> 0, default 1); an empty result is an error.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from shardlab.errors import OpSignatureError
from shardlab.ir import TensorType
from shardlab.ops.base import (
    Array,
    Attrs,
    OpDef,
    attr_int,
    attr_ints,
    normalize_dim,
    register,
)


def _no_bytes(ins: Sequence[TensorType], outs: Sequence[TensorType], attrs: Attrs) -> int:
    return 0


def _reshape_target(x: TensorType, attrs: Attrs) -> tuple[int, ...]:
    want = attr_ints(attrs, "shape")
    if want.count(-1) > 1 or any(d == 0 or d < -1 for d in want):
        raise OpSignatureError(
            f"reshape: attribute 'shape' {want} must hold positive sizes and at most one -1",
            attr="shape",
        )
    known = math.prod(d for d in want if d != -1)
    shape = [x.numel // known if d == -1 else d for d in want]
    if math.prod(shape) != x.numel:
        raise OpSignatureError(
            f"reshape: cannot reshape {list(x.shape)} ({x.numel} elements) to {want}",
            attr="shape",
        )
    return tuple(shape)


register(
    OpDef(
        kind="reshape",
        family="shape",
        doc="x viewed with attr shape (one -1 allowed, same element count).",
        min_inputs=1,
        max_inputs=1,
        infer=lambda ins, attrs: [ins[0].with_shape(_reshape_target(ins[0], attrs))],
        numpy_impl=lambda xs, attrs: [np.reshape(xs[0], list(attrs["shape"]))],
        bytes=_no_bytes,
    )
)


def _transpose_dims(rank: int, attrs: Attrs) -> tuple[int, int]:
    return (
        normalize_dim(attr_int(attrs, "dim0"), rank, "transpose: attribute 'dim0'"),
        normalize_dim(attr_int(attrs, "dim1"), rank, "transpose: attribute 'dim1'"),
    )


def _transpose_infer(ins: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    d0, d1 = _transpose_dims(ins[0].rank, attrs)
    shape = list(ins[0].shape)
    shape[d0], shape[d1] = shape[d1], shape[d0]
    return [ins[0].with_shape(shape)]


register(
    OpDef(
        kind="transpose",
        family="shape",
        doc="swap attr dims dim0 and dim1.",
        min_inputs=1,
        max_inputs=1,
        infer=_transpose_infer,
        numpy_impl=lambda xs, attrs: [np.swapaxes(xs[0], *_transpose_dims(xs[0].ndim, attrs))],
    )
)


def _perm(rank: int, attrs: Attrs) -> list[int]:
    perm = attr_ints(attrs, "perm")
    if sorted(perm) != list(range(rank)):
        raise OpSignatureError(
            f"permute: attribute 'perm' {perm} is not a permutation of range({rank})",
            attr="perm",
        )
    return perm


register(
    OpDef(
        kind="permute",
        family="shape",
        doc="reorder dims: output dim i is input dim perm[i].",
        min_inputs=1,
        max_inputs=1,
        infer=lambda ins, attrs: [
            ins[0].with_shape(ins[0].shape[p] for p in _perm(ins[0].rank, attrs))
        ],
        numpy_impl=lambda xs, attrs: [np.transpose(xs[0], _perm(xs[0].ndim, attrs))],
    )
)


def _split_args(rank_shape: Sequence[int], attrs: Attrs) -> tuple[int, list[int]]:
    dim = normalize_dim(attr_int(attrs, "dim"), len(rank_shape), "split: attribute 'dim'")
    sizes = attr_ints(attrs, "sizes")
    if not sizes or any(s <= 0 for s in sizes) or sum(sizes) != rank_shape[dim]:
        raise OpSignatureError(
            f"split: attribute 'sizes' {sizes} must be positive and sum to dim {dim} of "
            f"size {rank_shape[dim]}",
            attr="sizes",
        )
    return dim, sizes


def _split_infer(ins: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    x = ins[0]
    dim, sizes = _split_args(x.shape, attrs)
    return [x.with_shape((*x.shape[:dim], s, *x.shape[dim + 1 :])) for s in sizes]


def _split_np(xs: Sequence[Array], attrs: Attrs) -> list[Array]:
    dim, sizes = _split_args(xs[0].shape, attrs)
    return list(np.split(xs[0], np.cumsum(sizes)[:-1], axis=dim))


register(
    OpDef(
        kind="split",
        family="shape",
        doc="cut x along attr dim into pieces of attr sizes; one output per piece.",
        min_inputs=1,
        max_inputs=1,
        infer=_split_infer,
        numpy_impl=_split_np,
    )
)


def _concat_infer(ins: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    first = ins[0]
    dim = normalize_dim(attr_int(attrs, "dim"), first.rank, "concat: attribute 'dim'")
    for i, t in enumerate(ins[1:], start=1):
        rest, rest0 = list(t.shape), list(first.shape)
        if t.rank == first.rank:
            rest[dim] = rest0[dim] = -1
        if t.dtype != first.dtype or rest != rest0:
            raise OpSignatureError(
                f"concat: input {i} is {t} but input 0 is {first}; all dims but {dim} and "
                "the dtype must agree"
            )
    size = sum(t.shape[dim] for t in ins)
    return [first.with_shape((*first.shape[:dim], size, *first.shape[dim + 1 :]))]


register(
    OpDef(
        kind="concat",
        family="shape",
        doc="join inputs along attr dim; other dims and dtypes agree.",
        min_inputs=1,
        max_inputs=None,
        infer=_concat_infer,
        numpy_impl=lambda xs, attrs: [np.concatenate(list(xs), axis=int(attrs["dim"]))],
    )
)


def _opt_int(attrs: Attrs, key: str) -> int | None:
    return None if attrs.get(key) is None else attr_int(attrs, key)


def _slice_args(shape: Sequence[int], attrs: Attrs) -> tuple[int, slice]:
    dim = normalize_dim(attr_int(attrs, "dim"), len(shape), "slice: attribute 'dim'")
    start, stop, step = (
        _opt_int(attrs, "start"),
        _opt_int(attrs, "stop"),
        attr_int(attrs, "step", 1),
    )
    if step <= 0:
        raise OpSignatureError(f"slice: attribute 'step' must be > 0, got {step}", attr="step")
    sl = slice(start, stop, step)
    if not range(shape[dim])[sl]:
        raise OpSignatureError(
            f"slice: start={start}, stop={stop}, step={step} selects nothing of dim {dim} "
            f"(size {shape[dim]})"
        )
    return dim, sl


def _slice_infer(ins: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    x = ins[0]
    dim, sl = _slice_args(x.shape, attrs)
    return [x.with_shape((*x.shape[:dim], len(range(x.shape[dim])[sl]), *x.shape[dim + 1 :]))]


def _slice_np(xs: Sequence[Array], attrs: Attrs) -> list[Array]:
    dim, sl = _slice_args(xs[0].shape, attrs)
    return [xs[0][(slice(None),) * dim + (sl,)]]


register(
    OpDef(
        kind="slice",
        family="shape",
        doc="x[start:stop:step] along attr dim (Python semantics, step > 0).",
        min_inputs=1,
        max_inputs=1,
        infer=_slice_infer,
        numpy_impl=_slice_np,
    )
)
