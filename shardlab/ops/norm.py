"""Normalizations over the last dim: `layer_norm(x, weight, bias)` and `rms_norm(x, weight)`.

- layer_norm: (x - mean) / sqrt(var + eps) * weight + bias, biased variance; attr `eps`
  (default 1e-5). FLOPs: 8 per element.
- rms_norm: x / sqrt(mean(x^2) + eps) * weight; attr `eps` (default 1e-6). FLOPs: 4 per
  element.

weight and bias have shape [x.shape[-1]] and x's dtype.
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
    attr_float,
    register,
    require_float,
    same_dtype,
)

_EPS = {"layer_norm": 1e-5, "rms_norm": 1e-6}
_FLOPS_PER_ELEMENT = {"layer_norm": 8, "rms_norm": 4}


def _infer(kind: str) -> Callable[[Sequence[TensorType], Attrs], list[TensorType]]:
    names = ("weight", "bias") if kind == "layer_norm" else ("weight",)

    def infer(ins: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
        x = ins[0]
        require_float(x, kind, "x")
        if x.rank < 1:
            raise OpSignatureError(f"{kind}: x must have rank >= 1, got {x}")
        for name, t in zip(names, ins[1:], strict=True):
            if t.shape != (x.shape[-1],):
                raise OpSignatureError(
                    f"{kind}: {name} must have shape [{x.shape[-1]}] (x's last dim), got {t}"
                )
        same_dtype(ins, kind)
        if attr_float(attrs, "eps", _EPS[kind]) < 0:
            raise OpSignatureError(f"{kind}: attribute 'eps' must be >= 0", attr="eps")
        return [x]

    return infer


def _flops(kind: str) -> Callable[[Sequence[TensorType], Sequence[TensorType], Attrs], int]:
    def flops(ins: Sequence[TensorType], outs: Sequence[TensorType], attrs: Attrs) -> int:
        return _FLOPS_PER_ELEMENT[kind] * ins[0].numel

    return flops


def _layer_norm_np(xs: Sequence[Array], attrs: Attrs) -> list[Array]:
    x, weight, bias = xs
    centered = x - np.mean(x, axis=-1, keepdims=True)
    var = np.mean(centered * centered, axis=-1, keepdims=True)
    eps = float(attrs.get("eps", _EPS["layer_norm"]))
    return [centered / np.sqrt(var + eps) * weight + bias]


def _rms_norm_np(xs: Sequence[Array], attrs: Attrs) -> list[Array]:
    x, weight = xs
    eps = float(attrs.get("eps", _EPS["rms_norm"]))
    return [x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight]


register(
    OpDef(
        kind="layer_norm",
        family="norm",
        doc="(x - mean) / sqrt(var + eps) * weight + bias over the last dim; attr eps (1e-5).",
        min_inputs=3,
        max_inputs=3,
        infer=_infer("layer_norm"),
        numpy_impl=_layer_norm_np,
        flops=_flops("layer_norm"),
    )
)

register(
    OpDef(
        kind="rms_norm",
        family="norm",
        doc="x / sqrt(mean(x^2) + eps) * weight over the last dim; attr eps (1e-6).",
        min_inputs=2,
        max_inputs=2,
        infer=_infer("rms_norm"),
        numpy_impl=_rms_norm_np,
        flops=_flops("rms_norm"),
    )
)
