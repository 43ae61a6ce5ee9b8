"""Torch attention for the torch backend: grouped-query attention, its gradient and the
causal masked softmax, with the global offset of a block of queries.

What it is for: `runtime.torch_ops` registers the kinds (`scaled_dot_product_attention`,
`attention_grad`, `masked_softmax`, `masked_softmax_grad`: `ATTENTION_IMPLS`) and
`runtime.torch_kernels` runs the rank-aware kernels on the same functions with a query
block's offset (`attention_tensors`, `attention_backward`, `masked_softmax_tensor`). Each has
exactly the formulas of its numpy counterpart (`ops/attention.py`, `ops/softmax.py`,
`ops/autodiff_ops.attention_backward`).

Torch stays lazy: `load_torch` (called by `torch_ops.load_torch`) binds it on first use.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from shardlab.ops.base import Attrs
from shardlab.runtime.torch_device import bind_torch

if TYPE_CHECKING:
    import torch
    from torch import Tensor


def load_torch() -> None:
    """Bind this module's `torch` (the functions below use it) on first use."""
    bind_torch(globals())


def _causal_above(x: Tensor, offset: int = 0) -> Tensor:
    """True above diagonal `1 + offset` of the [rows, cols] grid of `x`'s last two dims
    (keys after the query), on `x`'s device."""
    rows, cols = x.shape[-2:]
    mask = torch.ones(rows, cols, dtype=torch.bool, device=x.device)
    return torch.triu(mask, diagonal=1 + offset)


def masked_softmax_tensor(x: Tensor, scale: float, causal: bool, offset: int = 0) -> Tensor:
    """softmax(x * scale) over the last dim; when causal, keys j > query i + offset masked
    (`offset`: the global index of x's first query row; ops/softmax.masked_softmax)."""
    z = x * scale
    if causal:
        z = z.masked_fill(_causal_above(x, offset), -math.inf)
    z = z - torch.amax(z, dim=-1, keepdim=True)
    e = torch.exp(z)
    return e / torch.sum(e, dim=-1, keepdim=True)


def _masked_softmax(xs: Sequence[Tensor], attrs: Attrs) -> list[Tensor]:
    scale, causal = float(attrs.get("scale", 1.0)), bool(attrs.get("causal", False))
    return [masked_softmax_tensor(xs[0], scale, causal)]


def _masked_softmax_grad(xs: Sequence[Tensor], attrs: Attrs) -> list[Tensor]:
    y, dy = xs
    dot = torch.sum(dy * y, dim=-1, keepdim=True)
    return [float(attrs.get("scale", 1.0)) * y * (dy - dot)]


def _scale_of(q: Tensor, scale: Any) -> float:
    return 1.0 / math.sqrt(q.shape[3]) if scale is None else float(scale)


def attention_tensors(
    q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: Any, offset: int = 0
) -> Tensor:
    """Grouped-query attention, [B, S, H, D] layout; `offset`: the global index of q's first
    row (ops/attention.attention)."""
    group = q.shape[2] // k.shape[2] if k.shape[2] else 1  # no heads: an empty block
    k = torch.repeat_interleave(k, group, dim=2)  # query head h reads kv head h // group
    v = torch.repeat_interleave(v, group, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * _scale_of(q, scale)
    if causal:
        scores = scores.masked_fill(_causal_above(scores, offset), -math.inf)
    weights = torch.exp(scores - torch.amax(scores, dim=-1, keepdim=True))
    weights = weights / torch.sum(weights, dim=-1, keepdim=True)
    return torch.einsum("bhqk,bkhd->bqhd", weights, v)


def _attention(xs: Sequence[Tensor], attrs: Attrs) -> list[Tensor]:
    q, k, v = xs
    return [attention_tensors(q, k, v, bool(attrs.get("causal", True)), attrs.get("scale"))]


def _attention_grad(xs: Sequence[Tensor], attrs: Attrs) -> list[Tensor]:
    q, k, v, dy = xs
    return attention_backward(q, k, v, dy, bool(attrs.get("causal", True)), attrs.get("scale"))


def attention_backward(
    q: Tensor, k: Tensor, v: Tensor, dy: Tensor, causal: bool, scale: Any
) -> list[Tensor]:
    """dq, dk, dv of grouped-query attention (ops/autodiff_ops.attention_backward)."""
    group = q.shape[2] // k.shape[2] if k.shape[2] else 1  # no heads: an empty block
    kr = torch.repeat_interleave(k, group, dim=2)
    vr = torch.repeat_interleave(v, group, dim=2)
    scale = _scale_of(q, scale)
    s = torch.einsum("bqhd,bkhd->bhqk", q, kr) * scale
    if causal:
        s = s.masked_fill(_causal_above(s), -math.inf)
    p = torch.exp(s - torch.amax(s, dim=-1, keepdim=True))
    p = p / torch.sum(p, dim=-1, keepdim=True)
    dvr = torch.einsum("bhqk,bqhd->bkhd", p, dy)
    dp = torch.einsum("bqhd,bkhd->bhqk", dy, vr)
    ds = p * (dp - torch.sum(dp * p, dim=-1, keepdim=True)) * scale
    dq = torch.einsum("bhqk,bkhd->bqhd", ds, kr)
    dkr = torch.einsum("bhqk,bqhd->bkhd", ds, q)
    b, skv, hkv = k.shape[:3]
    dk = dkr.reshape(b, skv, hkv, group, k.shape[3]).sum(dim=3)  # no -1: blocks may be empty
    dv = dvr.reshape(b, skv, hkv, group, v.shape[3]).sum(dim=3)
    return [dq, dk, dv]


ATTENTION_IMPLS = {
    "masked_softmax": _masked_softmax,
    "masked_softmax_grad": _masked_softmax_grad,
    "scaled_dot_product_attention": _attention,
    "attention_grad": _attention_grad,
}
