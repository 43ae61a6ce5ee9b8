"""`dropout(x) -> (y, mask)` and its backward kernel `dropout_grad(dy, mask) -> dx`.

Attrs: `p` (the probability of dropping an element, 0 <= p < 1), `seed` (an integer) and
`offset` (an integer >= 0, default 0: the global flat index of x's first element in the
tensor the mask is drawn for; a pipeline's micro-batch m of a batch-major x is its block of
the whole batch, so its masks are the ones one device draws for those rows).
`y = x * mask / (1 - p)`; the mask is bool (one byte per element, as Megatron-LM stores it).

The mask is a pure function of (seed, global flat element index): a counter-based hash (the
SplitMix64 finalizer, numpy uint64 arithmetic that wraps) of the index offset by the seed;
an element is kept when the hash's top 32 bits are at least round(p * 2^32). A rank holding
a block of x therefore computes exactly the block of the mask one device computes, given the
block's global offsets (`block_index`, used by the kernel `dropout_global_index` of
`shardlab.runtime.kernels`).

`dropout_grad(dy, mask)` (attr `p`): `dx = dy * mask / (1 - p)`.

FLOPs: 2 per element for both (the product with the mask and the 1 / (1 - p) scaling; the
integer hash is not counted). Bytes: every input and output once (the mask at one byte).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from shardlab.errors import OpSignatureError
from shardlab.ir import TensorType
from shardlab.ops.base import (
    Array,
    Attrs,
    OpDef,
    attr_float,
    attr_int,
    register,
    require_float,
)

FAMILY = "dropout"
_GOLDEN = 0x9E3779B97F4A7C15  # 2^64 / golden ratio: the SplitMix64 increment
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_MASK64 = (1 << 64) - 1


def dropout_p(attrs: Attrs, kind: str = "dropout") -> float:
    """Attr `p`, checked to lie in [0, 1)."""
    p = attr_float(attrs, "p")
    if not 0.0 <= p < 1.0:
        raise OpSignatureError(f"{kind}: attribute 'p' must be in [0, 1), got {p}", attr="p")
    return p


def block_index(shape: Sequence[int], ranges: Sequence[tuple[int, int]]) -> Array:
    """Global row-major flat indices (uint64) of the block `ranges` ([start, stop) per dim)
    of a tensor of global `shape`."""
    index = np.zeros(tuple(b - a for a, b in ranges), dtype=np.uint64)
    stride = 1
    for d in reversed(range(len(shape))):
        start, stop = ranges[d]
        along = np.arange(start, stop, dtype=np.uint64) * np.uint64(stride)
        index = index + along.reshape([-1 if i == d else 1 for i in range(len(shape))])
        stride *= int(shape[d])
    return index


def keep_mask(index: Array, seed: int, p: float) -> Array:
    """True where the element of global flat `index` is kept (counter-based, no state)."""
    flat = np.asarray(index, dtype=np.uint64).reshape(-1)  # arrays wrap silently, scalars warn
    z = flat + np.uint64(((seed + 1) * _GOLDEN) & _MASK64)
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    z = z ^ (z >> np.uint64(31))
    threshold = np.uint64(round(p * 2.0**32))
    return np.asarray((z >> np.uint64(32)) >= threshold).reshape(np.shape(index))


def dropout_block(x: Array, attrs: Attrs, index: Array) -> list[Array]:
    """(y, mask) of the block of x whose global flat indices are `index`."""
    p = dropout_p(attrs)
    offset = dropout_offset(attrs)
    if offset:
        index = np.asarray(index, dtype=np.uint64) + np.uint64(offset)
    mask = keep_mask(index, attr_int(attrs, "seed"), p)
    return [np.asarray(x * mask / (1.0 - p)), mask]


def dropout_offset(attrs: Attrs) -> int:
    """Attr `offset` (default 0), checked to be a non-negative integer."""
    offset = attrs.get("offset", 0)
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise OpSignatureError(
            f"dropout: attribute 'offset' must be an integer >= 0, got {offset!r}", attr="offset"
        )
    return offset


def _dropout_infer(ins: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    require_float(ins[0], "dropout")
    dropout_p(attrs)
    dropout_offset(attrs)
    attr_int(attrs, "seed")
    return [ins[0], TensorType(ins[0].shape, "bool")]


def _dropout_np(xs: Sequence[Array], attrs: Attrs) -> list[Array]:
    x = xs[0]
    return dropout_block(x, attrs, block_index(x.shape, [(0, n) for n in x.shape]))


def _grad_infer(ins: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    dy, mask = ins
    require_float(dy, "dropout_grad", "dy")
    if mask.dtype != "bool" or mask.shape != dy.shape:
        raise OpSignatureError(f"dropout_grad: mask must be bool of dy's shape, got {mask}")
    dropout_p(attrs, "dropout_grad")
    return [dy]


def _grad_np(xs: Sequence[Array], attrs: Attrs) -> list[Array]:
    dy, mask = xs
    return [np.asarray(dy * mask / (1.0 - float(attrs["p"])))]


def _flops(ins: Sequence[TensorType], outs: Sequence[TensorType], attrs: Attrs) -> int:
    return 2 * outs[0].numel


register(
    OpDef(
        kind="dropout",
        family=FAMILY,
        doc="(y, mask): y = x * mask / (1 - p), mask a bool function of (seed, global "
        "element index); attrs p in [0, 1), seed (an integer).",
        min_inputs=1,
        max_inputs=1,
        infer=_dropout_infer,
        numpy_impl=_dropout_np,
        flops=_flops,
    )
)
register(
    OpDef(
        kind="dropout_grad",
        family=FAMILY,
        doc="dx = dy * mask / (1 - p) for (dy, mask); attr p.",
        min_inputs=2,
        max_inputs=2,
        infer=_grad_infer,
        numpy_impl=_grad_np,
        flops=_flops,
    )
)
