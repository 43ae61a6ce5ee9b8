"""`scaled_dot_product_attention(q, k, v)` with grouped-query heads and an optional causal mask.

Layout (batch, seq, heads, head_dim): q [B, Sq, Hq, D], k [B, Skv, Hkv, D],
v [B, Skv, Hkv, Dv] -> [B, Sq, Hq, Dv]. Query head h reads kv head h // (Hq // Hkv), so Hq
must be a multiple of Hkv. Attrs: `causal` (default true; needs Sq == Skv; query i sees keys
j <= i) and `scale` (a number; null or absent means 1 / sqrt(D)).

FLOPs count the two matmuls only (scores q.k and the weighted sum of v):
2 * B * Hq * pairs * (D + Dv), where pairs = Sq * Skv, or Sq * (Sq + 1) / 2 when causal
(only the query/key pairs the mask keeps). A rank holding a shard of the queries (Sq < Skv,
sequence-sharded attention) is counted as the last shard, the busiest: Sq * (Skv - Sq) +
Sq * (Sq + 1) / 2. The softmax is not counted.
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
    attr_bool,
    attr_float,
    register,
    require_float,
    same_dtype,
)

_KIND = "scaled_dot_product_attention"


def _infer(ins: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    q, k, v = ins
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.rank != 4:
            raise OpSignatureError(f"{_KIND}: {name} must be [batch, seq, heads, dim], got {t}")
    require_float(q, _KIND, "q")
    dtype = same_dtype(ins, _KIND)
    (b, sq, hq, d), (bk, skv, hkv, dk) = q.shape, k.shape
    if bk != b or v.shape[0] != b:
        raise OpSignatureError(f"{_KIND}: batch dims disagree: q {q}, k {k}, v {v}", dim=0)
    if dk != d:
        raise OpSignatureError(f"{_KIND}: k's head dim {dk} differs from q's {d}", dim=3)
    if v.shape[1:3] != (skv, hkv):
        raise OpSignatureError(
            f"{_KIND}: v must have k's seq and heads [{b}, {skv}, {hkv}, Dv], got {v}"
        )
    if hq % hkv:
        raise OpSignatureError(
            f"{_KIND}: q's heads ({hq}) must be a multiple of k/v's heads ({hkv})", dim=2
        )
    if attr_bool(attrs, "causal", True) and sq != skv:
        raise OpSignatureError(
            f"{_KIND}: attribute 'causal' needs q's seq ({sq}) to equal k's seq ({skv})",
            attr="causal",
        )
    if attrs.get("scale") is not None:
        attr_float(attrs, "scale")
    return [TensorType((b, sq, hq, v.shape[3]), dtype)]


def _flops(ins: Sequence[TensorType], outs: Sequence[TensorType], attrs: Attrs) -> int:
    q, k, v = ins
    b, sq, hq, d = q.shape
    skv = k.shape[1]
    pairs = sq * skv
    if attrs.get("causal", True):
        # a block of the last sq queries (a rank's sequence shard: the busiest) sees every key
        # before it and a triangle of its own; the whole sequence (sq == skv) is a triangle
        pairs = sq * (skv - sq) + sq * (sq + 1) // 2
    return 2 * b * hq * pairs * (d + v.shape[3])


def attention(
    q: Array, k: Array, v: Array, causal: bool, scale: float | None, query_offset: int = 0
) -> Array:
    """The attention computation; `query_offset` is the global index of q's first row
    (non-zero when the query sequence is sharded and k/v hold the whole sequence)."""
    group = q.shape[2] // k.shape[2] if k.shape[2] else 1  # no heads: an empty block
    k = np.repeat(k, group, axis=2)  # query head h reads kv head h // group
    v = np.repeat(v, group, axis=2)
    scale = 1.0 / math.sqrt(q.shape[3]) if scale is None else float(scale)
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if causal:
        above = np.triu(np.ones(scores.shape[-2:], dtype=bool), k=1 + query_offset)
        scores = np.where(above, -np.inf, scores)  # key j > query i + offset
    weights = np.exp(scores - np.max(scores, axis=-1, keepdims=True))
    weights /= np.sum(weights, axis=-1, keepdims=True)
    return np.asarray(np.einsum("bhqk,bkhd->bqhd", weights, v))


def _numpy(xs: Sequence[Array], attrs: Attrs) -> list[Array]:
    q, k, v = xs
    scale = attrs.get("scale")
    causal = bool(attrs.get("causal", True))
    return [attention(q, k, v, causal, None if scale is None else float(scale))]


register(
    OpDef(
        kind=_KIND,
        family="attention",
        doc="softmax(q k^T * scale [+ causal mask]) v, layout [B, S, H, D], grouped-query "
        "heads; attrs causal (default true), scale (default 1/sqrt(D)).",
        min_inputs=3,
        max_inputs=3,
        infer=_infer,
        numpy_impl=_numpy,
        flops=_flops,
    )
)
