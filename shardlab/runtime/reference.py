"""The single-device reference: run a graph with numpy, in float64 or float32.

Every numeric check in Shardlab compares against this. Floating-point values (whatever
their declared dtype) are computed in the chosen compute dtype; integer and bool values
keep their own. Sources (inputs, params, state, constants without a producer) come from
`feeds` or are drawn from a seeded generator; integer sources used as indices are drawn in
range of every consumer that indexes with them.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from shardlab.errors import ExecutionError, ShardlabError
from shardlab.ir import Graph, Op, TensorType, Value, ValueKind
from shardlab.ops import get_op
from shardlab.ops.base import Array

COMPUTE_DTYPES = {"float64": np.float64, "float32": np.float32}
_INT_NP = {"int64": np.int64, "int32": np.int32, "bool": np.bool_}


def numpy_dtype(ttype: TensorType, compute_dtype: str) -> type:
    """The numpy dtype a value of `ttype` is held in."""
    return COMPUTE_DTYPES[compute_dtype] if ttype.is_float else _INT_NP[ttype.dtype]


def source_values(graph: Graph) -> list[Value]:
    """Values that are fed rather than computed."""
    return [graph.values[name] for name in graph.sources]


def index_bound(graph: Graph, value: str) -> int | None:
    """Exclusive upper bound of the indices an integer value may hold, from its consumers."""
    bounds = []
    for op in graph.consumers(value):
        opdef = get_op(op.kind)
        if opdef.index_bounds is None:
            continue
        by_input = opdef.index_bounds([graph.type_of(v) for v in op.inputs], op.attrs)
        bounds += [bound for i, bound in by_input.items() if op.inputs[i] == value]
    return min(bounds) if bounds else None


def make_feeds(graph: Graph, seed: int = 0, compute_dtype: str = "float64") -> dict[str, Array]:
    """Seeded data for every source value of `graph`.

    Optimizer state (kind `state`) starts at zero; a master weight as its param's copy.
    Floats: inputs ~ N(0, 1); matrices ~ N(0, 1/fan_in) with fan_in = dim 0; vectors
    ~ 1 + N(0, 0.1^2) (norm weights). Integers: uniform in [0, index bound), [0, 2) when
    no consumer indexes with them.
    """
    check_compute_dtype(compute_dtype)
    rng = np.random.default_rng(seed)
    feeds: dict[str, Array] = {}
    for value in source_values(graph):
        t = value.type
        dtype = numpy_dtype(t, compute_dtype)
        data: Array
        if t.is_float and value.kind == ValueKind.STATE:
            data = np.zeros(t.shape)  # optimizer state starts at zero, as in torch.optim
        elif t.is_float:
            data = rng.standard_normal(t.shape)
            if value.kind != ValueKind.INPUT and t.rank >= 2:
                data /= np.sqrt(t.shape[0])
            elif value.kind != ValueKind.INPUT and t.rank == 1:
                data = 1.0 + 0.1 * data
        elif t.dtype == "bool":
            data = rng.integers(0, 2, t.shape).astype(bool)
        else:
            data = rng.integers(0, index_bound(graph, value.name) or 2, t.shape)
        feeds[value.name] = np.asarray(data, dtype=dtype)
    for master, param in graph.meta.get("master_weights", {}).items():
        feeds[master] = feeds[param].copy()  # a master weight starts as its param's copy
    return feeds


def run_op(
    op: Op, args: list[Array], out_types: list[TensorType], compute_dtype: str
) -> list[Array]:
    """Apply one op's numpy implementation; check and normalise its outputs."""
    opdef = get_op(op.kind)
    if opdef.numpy_impl is None:
        raise ExecutionError(f"op {op.name!r} ({op.kind}) has no numpy implementation", op=op.name)
    try:
        results = opdef.numpy_impl(args, op.attrs)
    except ShardlabError as exc:
        raise ExecutionError(f"op {op.name!r} ({op.kind}): {exc.message}", op=op.name) from None
    if len(results) != len(out_types):
        raise ExecutionError(
            f"op {op.name!r} ({op.kind}) returned {len(results)} outputs, expected "
            f"{len(out_types)}",
            op=op.name,
        )
    outs = []
    for name, result, ttype in zip(op.outputs, results, out_types, strict=True):
        arr: Array = np.asarray(result, dtype=numpy_dtype(ttype, compute_dtype))
        if arr.shape != ttype.shape:
            raise ExecutionError(
                f"op {op.name!r} ({op.kind}) produced {name!r} with shape {list(arr.shape)}, "
                f"declared {list(ttype.shape)}",
                op=op.name,
                value=name,
            )
        outs.append(arr)
    return outs


def run_reference(
    graph: Graph,
    feeds: Mapping[str, Array] | None = None,
    *,
    seed: int = 0,
    compute_dtype: str = "float64",
) -> dict[str, Array]:
    """Execute `graph` on one device; returns every value by name.

    Sources missing from `feeds` are drawn by `make_feeds(graph, seed, compute_dtype)`.
    """
    check_compute_dtype(compute_dtype)
    env = make_feeds(graph, seed, compute_dtype)
    for name, given in (feeds or {}).items():
        value = graph.values.get(name)
        if value is None or graph.producer(name) is not None:
            raise ExecutionError(f"feed {name!r} is not a source value of the graph", value=name)
        arr: Array = np.asarray(given, dtype=numpy_dtype(value.type, compute_dtype))
        if arr.shape != value.type.shape:
            raise ExecutionError(
                f"feed {name!r} has shape {list(arr.shape)}, the graph declares "
                f"{list(value.type.shape)}",
                value=name,
            )
        env[name] = arr
    for op in graph.ops:
        args = [env[v] for v in op.inputs]
        out_types = [graph.type_of(v) for v in op.outputs]
        for name, arr in zip(op.outputs, run_op(op, args, out_types, compute_dtype), strict=True):
            env[name] = arr
    return env


def check_compute_dtype(compute_dtype: str) -> None:
    """Raise an `ExecutionError` naming `compute_dtype` unless numpy can compute in it."""
    if compute_dtype not in COMPUTE_DTYPES:
        raise ExecutionError(
            f"compute dtype must be float64 or float32, got {compute_dtype!r}", dtype=compute_dtype
        )
