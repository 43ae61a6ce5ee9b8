"""Torch dropout for the torch backend: the mask as a pure function of (seed, global
element index), bit for bit the numpy one.

What it is for: `runtime.torch_ops` registers `dropout` and `dropout_grad`
(`DROPOUT_IMPLS`) and `runtime.torch_kernels` runs `dropout_global_index` on a block's
global indices (`block_index`, `dropout_block`). `ops/dropout.py`'s mask is the SplitMix64
finalizer in uint64 arithmetic; torch has int64, whose products and xors wrap exactly as
uint64's, so only the right shifts differ: `_shr` is uint64's logical shift on int64 bits.

Torch stays lazy: `load_torch` (called by `torch_ops.load_torch`) binds it on first use.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from shardlab.ops.base import Attrs, attr_int
from shardlab.ops.dropout import dropout_offset, dropout_p
from shardlab.runtime.torch_device import bind_torch

if TYPE_CHECKING:
    import torch
    from torch import Tensor


def load_torch() -> None:
    """Bind this module's `torch` (the functions below use it) on first use."""
    bind_torch(globals())


_GOLDEN = 0x9E3779B97F4A7C15  # ops/dropout.py's SplitMix64 constants, as int64 bit patterns
_MIX1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MIX2 = 0x94D049BB133111EB - (1 << 64)


def _shr(z: Tensor, k: int) -> Tensor:
    """The logical right shift by `k` of the uint64 bits held in int64 `z`."""
    return (z >> k) & ((1 << (64 - k)) - 1)


def keep_mask(index: Tensor, seed: int, p: float) -> Tensor:
    """ops/dropout.keep_mask in int64 (products and xors wrap as uint64's): True where the
    element of global flat `index` (int64) is kept."""
    start = ((seed + 1) * _GOLDEN) & ((1 << 64) - 1)
    z = index + (start - (1 << 64) if start >> 63 else start)
    z = (z ^ _shr(z, 30)) * _MIX1
    z = (z ^ _shr(z, 27)) * _MIX2
    z = z ^ _shr(z, 31)
    return _shr(z, 32) >= round(p * 2.0**32)


def block_index(shape: Sequence[int], ranges: Sequence[tuple[int, int]], device: Any) -> Tensor:
    """ops/dropout.block_index (int64, on `device`): global row-major flat indices of the
    block `ranges` of a tensor of global `shape`."""
    index = torch.zeros(tuple(b - a for a, b in ranges), dtype=torch.int64, device=device)
    stride = 1
    for d in reversed(range(len(shape))):
        start, stop = ranges[d]
        along = torch.arange(start, stop, dtype=torch.int64, device=device) * stride
        index = index + along.reshape([-1 if i == d else 1 for i in range(len(shape))])
        stride *= int(shape[d])
    return index


def dropout_block(x: Tensor, attrs: Attrs, index: Tensor) -> list[Tensor]:
    """(y, mask) of the block of x whose global flat indices are `index` (ops/dropout)."""
    p = dropout_p(attrs)
    offset = dropout_offset(attrs)
    if offset:
        index = index + offset
    mask = keep_mask(index, attr_int(attrs, "seed"), p)
    return [x * mask / (1.0 - p), mask]


def _dropout(xs: Sequence[Tensor], attrs: Attrs) -> list[Tensor]:
    x = xs[0]
    return dropout_block(x, attrs, block_index(x.shape, [(0, n) for n in x.shape], x.device))


DROPOUT_IMPLS = {
    "dropout": _dropout,
    "dropout_grad": lambda xs, attrs: [xs[0] * xs[1] / (1.0 - float(attrs["p"]))],
}
