"""The serial program representation: tensor types, values, ops and graphs.

A `Graph` is a list of ops in topological order over named values with global shapes.
Constructing a `Graph` checks its structure (names, producers, cycles, shapes, dtypes);
`shardlab.validate.validate_graph` additionally checks every op against the op catalog.
The JSON form lives in `shardlab.graph_json`.
"""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from shardlab.errors import GraphError

#: Bytes per element of every supported dtype.
DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "int64": 8,
    "int32": 4,
    "bool": 1,
}
FLOAT_DTYPES = frozenset({"float32", "float16", "bfloat16"})
INT_DTYPES = frozenset({"int64", "int32"})
#: The largest dim of a value: a signed 32-bit integer (every real model's dims are far less).
MAX_DIM = 2**31 - 1
#: The most elements of one value: at 8 bytes each (the widest dtype), its size in bytes must
#: fit a signed 64-bit integer, as numpy's and the cost model's size arithmetic needs.
MAX_ELEMENTS = 2**63 // 8 - 1


@dataclass(frozen=True, slots=True)
class TensorType:
    """Global shape and dtype of a value."""

    shape: tuple[int, ...]
    dtype: str = "float32"

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOAT_DTYPES

    def with_shape(self, shape: Iterable[int]) -> TensorType:
        return TensorType(tuple(shape), self.dtype)

    def with_dtype(self, dtype: str) -> TensorType:
        return TensorType(self.shape, dtype)

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(str(d) for d in self.shape)}]"


class ValueKind(StrEnum):
    """What a value is for; decides how it is initialised, stored and costed."""

    INPUT = "input"
    PARAM = "param"
    ACTIVATION = "activation"
    GRAD = "grad"
    STATE = "state"
    CONSTANT = "constant"


#: Kinds that may exist without a producing op (they are fed or initialised).
SOURCE_KINDS = frozenset({ValueKind.INPUT, ValueKind.PARAM, ValueKind.STATE, ValueKind.CONSTANT})


class OpRole(StrEnum):
    """Which part of a training step an op belongs to."""

    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"
    LOSS = "loss"
    COMM = "comm"


@dataclass(frozen=True, slots=True)
class Value:
    """A named tensor of the graph."""

    name: str
    type: TensorType
    kind: ValueKind = ValueKind.ACTIVATION


def _json_native(obj: Any, where: str) -> Any:
    """Return `obj` with tuples turned into lists; reject what JSON cannot hold."""
    if obj is None or isinstance(obj, bool | int | str):
        return obj
    if isinstance(obj, float):
        if not math.isfinite(obj):
            raise GraphError(f"{where} is {obj}, which JSON cannot hold")
        return obj
    if isinstance(obj, list | tuple):
        return [_json_native(x, where) for x in obj]
    if isinstance(obj, Mapping):
        out = {}
        for key, val in obj.items():
            if not isinstance(key, str):
                raise GraphError(f"{where} has a non-string key {key!r}")
            out[key] = _json_native(val, f"{where}.{key}")
        return out
    raise GraphError(f"{where} has a value of type {type(obj).__name__}, which JSON cannot hold")


@dataclass(frozen=True, slots=True)
class Op:
    """One operator application: reads `inputs`, writes `outputs` (value names).

    `attrs` holds JSON-native attributes (tuples are stored as lists); `scope` is the
    module path (`layers.3.attn.q_proj`) that hierarchical views group by.
    """

    name: str
    kind: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict[str, Any] = field(default_factory=dict)
    scope: str = ""
    role: OpRole = OpRole.FORWARD

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))
        object.__setattr__(self, "attrs", _json_native(self.attrs, f"op {self.name!r} attrs"))
        object.__setattr__(self, "role", OpRole(self.role))


class Graph:
    """A serial program: values with global shapes and ops in topological order.

    The constructor checks structure and raises `GraphError` naming the offending op or
    value: empty or duplicate names, unknown dtypes, dims that are not positive or over
    `MAX_DIM`, values of more than `MAX_ELEMENTS` elements, ops that read
    or write unknown values, values produced twice, non-source values never produced,
    and cycles. Ops are stored in a topological order that keeps the given order
    wherever it is already valid.
    """

    def __init__(
        self,
        values: Iterable[Value],
        ops: Iterable[Op],
        *,
        name: str = "graph",
        outputs: Iterable[str] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.meta: dict[str, Any] = _json_native(dict(meta or {}), "graph meta")
        self._values: dict[str, Value] = {}
        for value in values:
            _check_value(value)
            if value.name in self._values:
                raise GraphError(f"duplicate value name {value.name!r}", value=value.name)
            self._values[value.name] = value
        op_list = list(ops)
        self._producer: dict[str, Op] = {}
        self._consumers: dict[str, list[Op]] = {}
        self._ops_by_name: dict[str, Op] = {}
        for op in op_list:
            self._index_op(op)
        for value in self._values.values():
            if value.name not in self._producer and value.kind not in SOURCE_KINDS:
                raise GraphError(
                    f"value {value.name!r} ({value.kind}) is never produced by any op; "
                    f"only {', '.join(sorted(SOURCE_KINDS))} values may be sources",
                    value=value.name,
                )
        self.ops: tuple[Op, ...] = _topological_order(op_list, self._producer)
        out_names = (
            list(outputs)
            if outputs is not None
            else [v for v in self._producer if v not in self._consumers]
        )
        for out in out_names:
            if out not in self._values:
                raise GraphError(f"graph output {out!r} is not a value of the graph", value=out)
        self.outputs: tuple[str, ...] = tuple(out_names)

    def _index_op(self, op: Op) -> None:
        if not op.name:
            raise GraphError("an op has an empty name", op=op.name)
        if op.name in self._ops_by_name:
            raise GraphError(f"duplicate op name {op.name!r}", op=op.name)
        if not op.kind:
            raise GraphError(f"op {op.name!r} has an empty kind", op=op.name)
        self._ops_by_name[op.name] = op
        for name in op.inputs:
            if name not in self._values:
                raise GraphError(
                    f"op {op.name!r} reads {name!r}, which is not a value of the graph",
                    op=op.name,
                    value=name,
                )
            self._consumers.setdefault(name, []).append(op)
        if len(set(op.outputs)) != len(op.outputs):
            raise GraphError(f"op {op.name!r} lists an output twice", op=op.name)
        for name in op.outputs:
            value = self._values.get(name)
            if value is None:
                raise GraphError(
                    f"op {op.name!r} writes {name!r}, which is not a value of the graph",
                    op=op.name,
                    value=name,
                )
            if value.kind == ValueKind.INPUT:
                raise GraphError(
                    f"op {op.name!r} writes {name!r}, which is a graph input",
                    op=op.name,
                    value=name,
                )
            if name in self._producer:
                raise GraphError(
                    f"value {name!r} is produced twice: by {self._producer[name].name!r} "
                    f"and by {op.name!r}",
                    op=op.name,
                    value=name,
                )
            self._producer[name] = op

    # -- lookups ---------------------------------------------------------------------

    @property
    def values(self) -> Mapping[str, Value]:
        return self._values

    def value(self, name: str) -> Value:
        try:
            return self._values[name]
        except KeyError:
            raise GraphError(f"graph {self.name!r} has no value {name!r}", value=name) from None

    def op(self, name: str) -> Op:
        try:
            return self._ops_by_name[name]
        except KeyError:
            raise GraphError(f"graph {self.name!r} has no op {name!r}", op=name) from None

    @functools.cached_property
    def sources(self) -> tuple[str, ...]:
        """The values no op writes (inputs, parameters, optimizer states), in the graph's
        order."""
        return tuple(name for name in self._values if name not in self._producer)

    def find_op(self, name: str) -> Op | None:
        """The op named `name`, or None where the graph has none."""
        return self._ops_by_name.get(name)

    def producer(self, value_name: str) -> Op | None:
        """The op that writes `value_name`, or None for a source value."""
        return self._producer.get(value_name)

    def consumers(self, value_name: str) -> tuple[Op, ...]:
        """The ops that read `value_name`, in program order of insertion."""
        return tuple(self._consumers.get(value_name, ()))

    def type_of(self, value_name: str) -> TensorType:
        return self.value(value_name).type

    def values_of_kind(self, kind: ValueKind) -> list[Value]:
        return [v for v in self._values.values() if v.kind == kind]

    def num_params(self) -> int:
        """Number of scalar parameters (elements of `param` values without a producer)."""
        return sum(
            v.type.numel
            for v in self._values.values()
            if v.kind == ValueKind.PARAM and v.name not in self._producer
        )

    def flops(self) -> int:
        """Floating-point operations of one execution of the graph, per the op catalog."""
        from shardlab.ops import op_cost  # the catalog imports this module

        return sum(op_cost(self, op).flops for op in self.ops)

    def ops_by_kind(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for op in self.ops:
            counts[op.kind] = counts.get(op.kind, 0) + 1
        return dict(sorted(counts.items()))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Graph):
            return NotImplemented
        return (
            self.name == other.name
            and self.meta == other.meta
            and list(self._values.values()) == list(other._values.values())
            and self.ops == other.ops
            and self.outputs == other.outputs
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, {len(self._values)} values, {len(self.ops)} ops)"


def _check_value(value: Value) -> None:
    if not value.name:
        raise GraphError("a value has an empty name")
    t = value.type
    if t.dtype not in DTYPE_BYTES:
        raise GraphError(
            f"value {value.name!r} has unknown dtype {t.dtype!r}; "
            f"expected one of {', '.join(DTYPE_BYTES)}",
            value=value.name,
        )
    for i, dim in enumerate(t.shape):
        if isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0:
            raise GraphError(
                f"value {value.name!r} has dim {i} of size {dim!r}; dims must be positive integers",
                value=value.name,
                dim=i,
            )
        if dim > MAX_DIM:
            raise GraphError(
                f"value {value.name!r} has dim {i} of size {dim}; dims must be at most "
                f"{MAX_DIM} (2^31 - 1)",
                value=value.name,
                dim=i,
                size=dim,
                limit=MAX_DIM,
            )
    if t.numel > MAX_ELEMENTS:
        raise GraphError(
            f"value {value.name!r} of shape {list(t.shape)} has {t.numel} elements; a value may "
            f"have at most {MAX_ELEMENTS} (2^60 - 1: its size in bytes must fit 64 bits)",
            value=value.name,
            elements=t.numel,
            limit=MAX_ELEMENTS,
        )
    try:
        ValueKind(value.kind)
    except ValueError:
        raise GraphError(
            f"value {value.name!r} has unknown kind {value.kind!r}; expected one of "
            f"{', '.join(k.value for k in ValueKind)}",
            value=value.name,
        ) from None


def _topological_order(ops: list[Op], producer: Mapping[str, Op]) -> tuple[Op, ...]:
    """Kahn's algorithm, preferring the given order; raises on a cycle."""
    index = {op.name: i for i, op in enumerate(ops)}
    deps: dict[str, set[str]] = {}
    users: dict[str, list[str]] = {op.name: [] for op in ops}
    for op in ops:
        preds = {producer[v].name for v in op.inputs if v in producer}
        deps[op.name] = preds
        for pred in preds:
            users[pred].append(op.name)
    if all(index[p] < index[op.name] for op in ops for p in deps[op.name]):
        return tuple(ops)
    remaining = {name: len(preds) for name, preds in deps.items()}
    ready = [index[name] for name, n in remaining.items() if n == 0]
    heapq.heapify(ready)
    order: list[Op] = []
    while ready:
        op = ops[heapq.heappop(ready)]
        order.append(op)
        for user in users[op.name]:
            remaining[user] -= 1
            if remaining[user] == 0:
                heapq.heappush(ready, index[user])
    if len(order) != len(ops):
        stuck = {name for name, n in remaining.items() if n > 0}
        cycle = _find_cycle(stuck, deps)
        raise GraphError(f"the graph has a cycle: {' -> '.join(cycle)}", op=cycle[0], cycle=cycle)
    return tuple(order)


def _find_cycle(stuck: set[str], deps: Mapping[str, set[str]]) -> list[str]:
    """Walk predecessors inside the stuck set until a name repeats; return that loop."""
    start = min(stuck)
    path: list[str] = []
    seen: dict[str, int] = {}
    node = start
    while node not in seen:
        seen[node] = len(path)
        path.append(node)
        node = min(p for p in deps[node] if p in stuck)
    loop = path[seen[node] :]
    loop.reverse()
    return [*loop, loop[0]]
