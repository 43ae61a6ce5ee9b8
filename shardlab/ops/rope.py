"""Rotary position embeddings: `rope_cache()` builds cos/sin tables, `rotary_embedding` applies.

- rope_cache (no inputs): attrs `seq` (> 0), `head_dim` (even, > 0), `theta` (default
  10000.0), `dtype` (a float dtype, default "float32"). Outputs cos and sin, each
  [seq, head_dim / 2], with cos[s, i] = cos(s * theta ** (-2 i / head_dim)). FLOPs: 1 per
  output element. Like every float value of the numpy runtime, the tables are computed in
  float64 whatever `dtype` says.
- rotary_embedding(x, cos, sin): x [B, S, N, D], cos/sin [S, D / 2] -> x's type, the
  HF-Llama "rotate half" convention: with x1 = x[..., :D/2] and x2 = x[..., D/2:],
  out = concat(x1 * cos - x2 * sin, x2 * cos + x1 * sin), cos/sin broadcast over B and N.
  FLOPs: 3 per output element.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from shardlab.errors import OpSignatureError
from shardlab.ir import FLOAT_DTYPES, TensorType
from shardlab.ops.base import (
    Array,
    Attrs,
    OpDef,
    attr_float,
    attr_int,
    attr_str,
    register,
    require_float,
    same_dtype,
)


def _cache_attrs(attrs: Attrs) -> tuple[int, int, float]:
    """(seq, head_dim, theta), validated."""
    seq = attr_int(attrs, "seq")
    if seq <= 0:
        raise OpSignatureError(f"rope_cache: attribute 'seq' must be > 0, got {seq}", attr="seq")
    head_dim = attr_int(attrs, "head_dim")
    if head_dim <= 0 or head_dim % 2:
        raise OpSignatureError(
            f"rope_cache: attribute 'head_dim' must be a positive even integer, got {head_dim}",
            attr="head_dim",
        )
    theta = attr_float(attrs, "theta", 10000.0)
    if theta <= 0:
        raise OpSignatureError(
            f"rope_cache: attribute 'theta' must be > 0, got {theta}", attr="theta"
        )
    return seq, head_dim, theta


def _cache_infer(ins: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    seq, head_dim, _ = _cache_attrs(attrs)
    dtype = attr_str(attrs, "dtype", sorted(FLOAT_DTYPES), "float32")
    out = TensorType((seq, head_dim // 2), dtype)
    return [out, out]


def _cache_flops(ins: Sequence[TensorType], outs: Sequence[TensorType], attrs: Attrs) -> int:
    return sum(t.numel for t in outs)


def _cache_np(xs: Sequence[Array], attrs: Attrs) -> list[Array]:
    seq, head_dim, theta = _cache_attrs(attrs)
    inv_freq = theta ** (-2.0 * np.arange(head_dim // 2, dtype=np.float64) / head_dim)
    angles = np.outer(np.arange(seq, dtype=np.float64), inv_freq)
    return [np.cos(angles), np.sin(angles)]


register(
    OpDef(
        kind="rope_cache",
        family="rope",
        doc="cos, sin [seq, head_dim/2] of s * theta**(-2i/head_dim); attrs seq, head_dim, "
        "theta (10000.0), dtype (float32).",
        min_inputs=0,
        max_inputs=0,
        infer=_cache_infer,
        numpy_impl=_cache_np,
        flops=_cache_flops,
    )
)


def _rotary_infer(ins: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    x = ins[0]
    require_float(x, "rotary_embedding", "x")
    if x.rank != 4 or x.shape[3] % 2:
        raise OpSignatureError(f"rotary_embedding: x must be [B, S, N, D] with an even D, got {x}")
    want = (x.shape[1], x.shape[3] // 2)
    for name, t in zip(("cos", "sin"), ins[1:], strict=True):
        if t.shape != want:
            raise OpSignatureError(
                f"rotary_embedding: {name} must have shape [{want[0]}, {want[1]}] (x's S and "
                f"D/2), got {t}"
            )
    same_dtype(ins, "rotary_embedding")
    return [x]


def _rotary_flops(ins: Sequence[TensorType], outs: Sequence[TensorType], attrs: Attrs) -> int:
    return 3 * outs[0].numel


def _rotary_np(xs: Sequence[Array], attrs: Attrs) -> list[Array]:
    x, cos, sin = xs
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return [np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)]


register(
    OpDef(
        kind="rotary_embedding",
        family="rope",
        doc="rotate-half rotary embedding of x [B, S, N, D] by cos, sin [S, D/2].",
        min_inputs=3,
        max_inputs=3,
        infer=_rotary_infer,
        numpy_impl=_rotary_np,
        flops=_rotary_flops,
    )
)
