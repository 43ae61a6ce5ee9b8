"""Semantic validation of a graph against the op catalog, and loading graph files.

`Graph(...)` already checks structure; `validate_graph` checks every op: its kind is in the
catalog (or `opaque`), its arity and attributes fit, and the output types it declares are the
ones shape inference gives. Every error is a `GraphError` naming the op and the value.
"""

from __future__ import annotations

from pathlib import Path

from shardlab.errors import GraphError, OpSignatureError
from shardlab.graph_json import loads_graph
from shardlab.ir import Graph, Op
from shardlab.ops import get_op
from shardlab.ops.base import OpDef


def validate_op(graph: Graph, op: Op) -> None:
    """Check one op against its kind's signature; raise GraphError naming it."""
    opdef = get_op_or_error(op)
    ins = [graph.type_of(v) for v in op.inputs]
    try:
        opdef.check_arity(len(ins))
        inferred = opdef.infer(ins, op.attrs)
    except OpSignatureError as exc:
        message = exc.message.removeprefix(f"{op.kind}: ")
        raise GraphError(
            f"op {op.name!r} ({op.kind}): {message}", op=op.name, **exc.detail
        ) from None
    if len(inferred) != len(op.outputs):
        raise GraphError(
            f"op {op.name!r} ({op.kind}) declares {len(op.outputs)} outputs but its kind "
            f"produces {len(inferred)}",
            op=op.name,
        )
    for out_name, want in zip(op.outputs, inferred, strict=True):
        have = graph.type_of(out_name)
        if have != want:
            raise GraphError(
                f"op {op.name!r} ({op.kind}): output {out_name!r} is declared {have} but "
                f"shape inference gives {want}",
                op=op.name,
                value=out_name,
            )


def get_op_or_error(op: Op) -> OpDef:
    """The catalog entry of `op.kind`, with an error that names the op."""
    try:
        return get_op(op.kind)
    except GraphError as exc:
        raise GraphError(f"op {op.name!r}: {exc.message}", op=op.name, kind=op.kind) from None


def validate_graph(graph: Graph) -> Graph:
    """Check every op of `graph`; returns the graph for chaining."""
    for op in graph.ops:
        validate_op(graph, op)
    return graph


def load_graph_file(path: str | Path) -> Graph:
    """Read, parse and fully validate a graph JSON file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise GraphError(f"cannot read {path}: {exc.strerror}", path=str(path)) from None
    return validate_graph(loads_graph(text, source=str(path)))
