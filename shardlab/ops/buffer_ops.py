"""Kinds that passes insert around fused collectives (seed 002): `pack` and `unpack`.

- pack(x1, ..., xn) -> one 1-D buffer: the inputs flattened (C order) and concatenated.
- unpack(buffer): attrs `shapes` (the outputs' shapes) and optionally `block_shapes` -> the
  buffer cut into consecutive pieces, each reshaped.

They never appear in a serial graph, so they have no VJP and no SPMD rule: the
data-parallel fusion pass (`shardlab.passes.data_parallel`) puts them in a `DistProgram`
directly, with the `default` kernel. Both are layout-only, so the same implementation is the
kernel of every rank: pack concatenates whatever blocks the rank holds; unpack cuts its block
of the buffer into `block_shapes` (the member blocks every rank holds: placements divide dims
evenly) when the block is shorter than the whole (`shapes`), and into `shapes` otherwise (one
device, or members that are not sharded). Types are global: a packed buffer's global length is
the members' total numel.

Cost: no FLOPs and no bytes. The simulated mesh copies, but the frameworks this models lay a
bucket's gradients out as views of one contiguous buffer (Paddle's coalesce_tensor with
copy_data=False, PyTorch DDP's gradient_as_bucket_view, Megatron's grad buffer): the backward
writes into the bucket and the optimizer reads from it, so packing moves no data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from shardlab.errors import OpSignatureError
from shardlab.ir import TensorType
from shardlab.ops.base import Array, Attrs, OpDef, register, same_dtype

FAMILY = "buffer_ops"


def _views(ins: Sequence[TensorType], outs: Sequence[TensorType], attrs: Attrs) -> int:
    """Bytes moved: none, the members are views of the buffer (see the module docstring)."""
    return 0


def _pack_infer(ins: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    dtype = same_dtype(ins, "pack")
    return [TensorType((sum(t.numel for t in ins),), dtype)]


def _pack_np(xs: Sequence[Array], attrs: Attrs) -> list[Array]:
    return [np.concatenate([np.reshape(x, -1) for x in xs])]


def _shape_list(attrs: Attrs, key: str) -> list[tuple[int, ...]]:
    """Attribute `key` as a non-empty list of shapes (lists of positive integers)."""
    val = attrs.get(key)
    if (
        not isinstance(val, list | tuple)
        or not val
        or any(
            not isinstance(s, list | tuple)
            or any(isinstance(d, bool) or not isinstance(d, int) or d <= 0 for d in s)
            for s in val
        )
    ):
        raise OpSignatureError(
            f"unpack: attribute {key!r} must be a non-empty list of shapes, got {val!r}", attr=key
        )
    return [tuple(s) for s in val]


def _unpack_infer(ins: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    (buf,) = ins
    shapes = _shape_list(attrs, "shapes")
    if buf.rank != 1 or buf.shape[0] != sum(math.prod(s) for s in shapes):
        raise OpSignatureError(
            f"unpack: the buffer {buf} must be 1-D with as many elements as attribute 'shapes' "
            f"{[list(s) for s in shapes]}"
        )
    if "block_shapes" in attrs:
        blocks = _shape_list(attrs, "block_shapes")
        if [len(b) for b in blocks] != [len(s) for s in shapes]:
            raise OpSignatureError(
                "unpack: attribute 'block_shapes' must have one shape per output, of its rank",
                attr="block_shapes",
            )
    return [TensorType(s, buf.dtype) for s in shapes]


def _unpack_np(xs: Sequence[Array], attrs: Attrs) -> list[Array]:
    buf = np.reshape(xs[0], -1)
    shapes = [tuple(s) for s in attrs["shapes"]]
    if buf.size != sum(math.prod(s) for s in shapes):
        shapes = [tuple(s) for s in attrs.get("block_shapes", shapes)]
    if buf.size != sum(math.prod(s) for s in shapes):
        raise OpSignatureError(
            f"unpack: a buffer of {buf.size} elements fits neither 'shapes' nor 'block_shapes'"
        )
    cuts = np.cumsum([math.prod(s) for s in shapes])[:-1]
    return [
        np.reshape(piece, s).copy() for piece, s in zip(np.split(buf, cuts), shapes, strict=True)
    ]


register(
    OpDef(
        "pack",
        FAMILY,
        "one 1-D buffer: the inputs (one dtype) flattened and concatenated in order.",
        1,
        None,
        _pack_infer,
        _pack_np,
        bytes=_views,
    )
)
register(
    OpDef(
        "unpack",
        FAMILY,
        "the 1-D buffer cut into consecutive pieces of attr shapes (or, for a rank's block of a "
        "packed buffer, attr block_shapes), each reshaped; the inverse of pack.",
        1,
        1,
        _unpack_infer,
        _unpack_np,
        bytes=_views,
    )
)
