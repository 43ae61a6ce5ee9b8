"""`softmax` and `log_softmax` along attr `dim` (default -1), floating-point inputs only.

The numpy implementations subtract the maximum along `dim` before exponentiating, so large
inputs do not overflow. FLOPs: about 5 per element (max, subtract, exp, sum, divide / log).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from shardlab.ir import TensorType
from shardlab.ops.base import (
    Array,
    Attrs,
    OpDef,
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
