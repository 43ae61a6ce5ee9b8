"""`embedding(ids, table)`: gather rows of table[V, H] -> ids.shape + [H].

ids is an int64/int32 tensor of any rank holding row numbers in [0, V); table is a
floating-point [V, H]. FLOPs: 0. Bytes: the ids read, plus each gathered row read once and
written once (2 x output bytes); the rest of the table is never touched, so it is not counted.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from shardlab.errors import ExecutionError, OpSignatureError
from shardlab.ir import INT_DTYPES, TensorType
from shardlab.ops.base import Array, Attrs, OpDef, register, require_float


def _infer(ins: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    ids, table = ins
    if ids.dtype not in INT_DTYPES:
        raise OpSignatureError(f"embedding: ids must be int64 or int32, got {ids}")
    require_float(table, "embedding", "table")
    if table.rank != 2:
        raise OpSignatureError(f"embedding: table must have rank 2 [V, H], got {table}")
    return [TensorType((*ids.shape, table.shape[1]), table.dtype)]


def _bytes(ins: Sequence[TensorType], outs: Sequence[TensorType], attrs: Attrs) -> int:
    return ins[0].nbytes + 2 * outs[0].nbytes


def _numpy(xs: Sequence[Array], attrs: Attrs) -> list[Array]:
    ids, table = xs
    vocab = table.shape[0]
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        raise ExecutionError(
            f"embedding: ids hold values in [{ids.min()}, {ids.max()}], outside the table's "
            f"rows [0, {vocab})"
        )
    return [np.asarray(table[ids])]


register(
    OpDef(
        kind="embedding",
        family="embedding",
        doc="table[ids]: rows of table[V, H] for integer ids of any rank -> ids.shape + [H].",
        min_inputs=2,
        max_inputs=2,
        infer=_infer,
        numpy_impl=_numpy,
        bytes=_bytes,
        index_bounds=lambda ins, attrs: {0: ins[1].shape[0]},
    )
)
