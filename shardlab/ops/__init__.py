"""The op catalog: one module per family, each registering its kinds on import.

`get_op(kind)` returns an `OpDef`; `infer_types` and `op_cost` apply one to an op of a graph.
"""

from __future__ import annotations

from collections.abc import Sequence

from shardlab.ir import Graph, Op, TensorType
from shardlab.ops import (  # noqa: F401  (imported to register their kinds)
    attention,
    autodiff_ops,
    buffer_ops,
    dropout,
    elementwise,
    embedding,
    linalg,
    loss,
    norm,
    opaque,
    reduce,
    rope,
    shape,
    softmax,
    sync_ops,
)
from shardlab.ops.base import OpCost, OpDef, all_ops, attach, get_op, register

__all__ = ["OpCost", "OpDef", "all_ops", "attach", "get_op", "infer_types", "op_cost", "register"]


def infer_types(
    kind: str, inputs: Sequence[TensorType], attrs: dict[str, object]
) -> list[TensorType]:
    """Output types of applying `kind` to `inputs` (OpSignatureError if they do not fit)."""
    opdef = get_op(kind)
    opdef.check_arity(len(inputs))
    return opdef.infer(inputs, attrs)


def op_cost(graph: Graph, op: Op) -> OpCost:
    """FLOPs and bytes of `op` in `graph`, from its kind's declarations."""
    opdef = get_op(op.kind)
    ins = [graph.type_of(v) for v in op.inputs]
    outs = [graph.type_of(v) for v in op.outputs]
    return OpCost(opdef.flops(ins, outs, op.attrs), opdef.bytes(ins, outs, op.attrs))
