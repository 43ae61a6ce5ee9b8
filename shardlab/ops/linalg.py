"""Matrix products: `matmul` (batched, transpose flags) and `linear` (x @ w + b)."""

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
    attr_bool,
    broadcast_shapes,
    register,
    require_float,
    same_dtype,
)


def _mk(t: TensorType, transpose: bool, which: str) -> tuple[tuple[int, ...], int, int]:
    """Batch dims and the (rows, cols) of an operand after its optional transpose."""
    if t.rank < 2:
        raise OpSignatureError(f"matmul: {which} must have rank >= 2, got {t}")
    rows, cols = t.shape[-2], t.shape[-1]
    return t.shape[:-2], *((cols, rows) if transpose else (rows, cols))


def _matmul_dims(ins: Sequence[TensorType], attrs: Attrs) -> tuple[tuple[int, ...], int, int, int]:
    """(batch shape, m, k, n) of a matmul."""
    a, b = ins
    a_batch, m, k = _mk(a, attr_bool(attrs, "transpose_a"), "a")
    b_batch, k2, n = _mk(b, attr_bool(attrs, "transpose_b"), "b")
    if k != k2:
        raise OpSignatureError(
            f"matmul: contracted dims disagree: a {list(a.shape)} gives {k}, "
            f"b {list(b.shape)} gives {k2}"
        )
    return broadcast_shapes(a_batch, b_batch, "matmul batch dims"), m, k, n


def _matmul_infer(ins: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    dtype = same_dtype(ins, "matmul")
    require_float(ins[0], "matmul")
    batch, m, _, n = _matmul_dims(ins, attrs)
    return [TensorType((*batch, m, n), dtype)]


def _matmul_flops(ins: Sequence[TensorType], outs: Sequence[TensorType], attrs: Attrs) -> int:
    batch, m, k, n = _matmul_dims(ins, attrs)
    return 2 * math.prod(batch) * m * k * n


def _matmul_np(xs: Sequence[Array], attrs: Attrs) -> list[Array]:
    a, b = xs
    if attrs.get("transpose_a", False):
        a = np.swapaxes(a, -1, -2)
    if attrs.get("transpose_b", False):
        b = np.swapaxes(b, -1, -2)
    return [np.matmul(a, b)]


register(
    OpDef(
        kind="matmul",
        family="linalg",
        doc="a @ b over the last two dims, batch dims broadcast; attrs transpose_a, transpose_b.",
        min_inputs=2,
        max_inputs=2,
        infer=_matmul_infer,
        numpy_impl=_matmul_np,
        flops=_matmul_flops,
    )
)


def _linear_infer(ins: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    x, w = ins[0], ins[1]
    dtype = same_dtype(ins, "linear")
    require_float(x, "linear")
    if x.rank < 1 or w.rank != 2:
        raise OpSignatureError(f"linear: needs x[..., in] and w[in, out], got {x} and {w}")
    if x.shape[-1] != w.shape[0]:
        raise OpSignatureError(
            f"linear: x's last dim {x.shape[-1]} does not match w's first dim {w.shape[0]}"
        )
    if len(ins) == 3 and ins[2].shape != (w.shape[1],):
        raise OpSignatureError(f"linear: bias must have shape [{w.shape[1]}], got {ins[2]}")
    return [TensorType((*x.shape[:-1], w.shape[1]), dtype)]


def _linear_flops(ins: Sequence[TensorType], outs: Sequence[TensorType], attrs: Attrs) -> int:
    x, w = ins[0], ins[1]
    rows = x.numel // x.shape[-1]
    return 2 * rows * w.shape[0] * w.shape[1] + (outs[0].numel if len(ins) == 3 else 0)


def _linear_np(xs: Sequence[Array], attrs: Attrs) -> list[Array]:
    y = np.matmul(xs[0], xs[1])
    return [y + xs[2] if len(xs) == 3 else y]


register(
    OpDef(
        kind="linear",
        family="linalg",
        doc="x[..., in] @ w[in, out] (+ bias[out]).",
        min_inputs=2,
        max_inputs=3,
        infer=_linear_infer,
        numpy_impl=_linear_np,
        flops=_linear_flops,
    )
)
