"""The versioned JSON form of a graph (`"format": "shardlab.graph/1"`).

`graph_to_json` and `graph_from_json` round-trip exactly. Parsing errors name the value or
op (and the JSON field) at fault; a document with control characters in any string, or nested
deeper than `shardlab.user_json.MAX_JSON_DEPTH`, is refused naming where. Shapes are limited
as `shardlab.ir` documents (`MAX_DIM`, `MAX_ELEMENTS`). The published JSON schema is
`shardlab/schema/graph-1.schema.json` (`GRAPH_SCHEMA_PATH`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from shardlab.errors import GraphError
from shardlab.ir import Graph, Op, OpRole, TensorType, Value, ValueKind
from shardlab.user_json import json_problem, path_text

GRAPH_FORMAT = "shardlab.graph/1"
GRAPH_SCHEMA_PATH = Path(__file__).parent / "schema" / "graph-1.schema.json"


def graph_schema() -> dict[str, Any]:
    """The published JSON schema of the graph format."""
    schema: dict[str, Any] = json.loads(GRAPH_SCHEMA_PATH.read_text())
    return schema


def graph_to_json(graph: Graph) -> dict[str, Any]:
    """The JSON-native dict of `graph` (ops in topological order)."""
    return {
        "format": GRAPH_FORMAT,
        "name": graph.name,
        "meta": graph.meta,
        "values": [
            {
                "name": v.name,
                "shape": list(v.type.shape),
                "dtype": v.type.dtype,
                "kind": str(v.kind),
            }
            for v in graph.values.values()
        ],
        "ops": [
            {
                "name": op.name,
                "kind": op.kind,
                "inputs": list(op.inputs),
                "outputs": list(op.outputs),
                "attrs": op.attrs,
                "scope": op.scope,
                "role": str(op.role),
            }
            for op in graph.ops
        ],
        "outputs": list(graph.outputs),
    }


def dumps_graph(graph: Graph, indent: int | None = None) -> str:
    return json.dumps(graph_to_json(graph), indent=indent)


def graph_from_json(data: Any) -> Graph:
    """Parse the JSON form; structural errors raise `GraphError` naming the culprit."""
    if not isinstance(data, dict):
        raise GraphError(f"a graph document must be a JSON object, not {_kind(data)}")
    _check_text(data)
    fmt = data.get("format")
    if fmt != GRAPH_FORMAT:
        raise GraphError(
            f"unsupported graph format {fmt!r}; expected {GRAPH_FORMAT!r}", field="format"
        )
    unknown = sorted(set(data) - {"format", "name", "meta", "values", "ops", "outputs"})
    if unknown:
        raise GraphError(f"unknown top-level field {unknown[0]!r} in graph", field=unknown[0])
    name = _field(data, "name", str, "the graph", default="graph")
    meta = _field(data, "meta", dict, "the graph", default={})
    values = [_parse_value(i, v) for i, v in enumerate(_field(data, "values", list, "the graph"))]
    ops = [_parse_op(i, o) for i, o in enumerate(_field(data, "ops", list, "the graph"))]
    outputs = _field(data, "outputs", list, "the graph", default=None)
    if outputs is not None:
        for out in outputs:
            if not isinstance(out, str):
                raise GraphError(f"graph outputs must be value names, found {out!r}")
    return Graph(values, ops, name=name, outputs=outputs, meta=meta)


def loads_graph(text: str, source: str = "<string>") -> Graph:
    """Parse JSON text; a syntax error names the line and column of `source`."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GraphError(
            f"{source}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}",
            line=exc.lineno,
            column=exc.colno,
        ) from None
    return graph_from_json(data)


def _check_text(data: dict[str, Any]) -> None:
    """Refuse control characters in any string (names of ops and values, attrs, meta) and
    absurd nesting (`shardlab.user_json`), naming where."""
    problem = json_problem(data)
    if problem is None:
        return
    where = path_text(problem.path)
    at = f" at {where}" if where else ""
    raise GraphError(f"the graph document{at}: {problem.message}", field=where or None)


_JSON_KINDS: dict[type, str] = {dict: "an object", list: "an array", str: "a string"}


def _kind(obj: Any) -> str:
    return _JSON_KINDS.get(type(obj), type(obj).__name__)


_MISSING = object()


def _field(obj: dict[str, Any], key: str, typ: type, where: str, default: Any = _MISSING) -> Any:
    if key not in obj:
        if default is _MISSING:
            raise GraphError(f"{where} lacks the field {key!r}", field=key)
        return default
    val = obj[key]
    if not isinstance(val, typ) or (typ is int and isinstance(val, bool)):
        raise GraphError(
            f"field {key!r} of {where} must be {typ.__name__}, not {_kind(val)}", field=key
        )
    return val


def _parse_value(index: int, obj: Any) -> Value:
    if not isinstance(obj, dict):
        raise GraphError(f"value #{index} must be an object, not {_kind(obj)}")
    name = obj.get("name")
    where = f"value {name!r}" if isinstance(name, str) else f"value #{index}"
    name = _field(obj, "name", str, where)
    _no_unknown_fields(obj, {"name", "shape", "dtype", "kind"}, where)
    shape = _field(obj, "shape", list, where)
    for i, dim in enumerate(shape):
        if isinstance(dim, bool) or not isinstance(dim, int):
            raise GraphError(
                f"{where} has dim {i} = {dim!r}; dims must be integers", value=name, dim=i
            )
    dtype = _field(obj, "dtype", str, where)
    kind = _field(obj, "kind", str, where, default="activation")
    if kind not in {k.value for k in ValueKind}:
        raise GraphError(
            f"{where} has unknown kind {kind!r}; expected one of "
            f"{', '.join(k.value for k in ValueKind)}",
            value=name,
        )
    return Value(name, TensorType(tuple(shape), dtype), ValueKind(kind))


def _parse_op(index: int, obj: Any) -> Op:
    if not isinstance(obj, dict):
        raise GraphError(f"op #{index} must be an object, not {_kind(obj)}")
    name = obj.get("name")
    where = f"op {name!r}" if isinstance(name, str) else f"op #{index}"
    name = _field(obj, "name", str, where)
    _no_unknown_fields(obj, {"name", "kind", "inputs", "outputs", "attrs", "scope", "role"}, where)
    kind = _field(obj, "kind", str, where)
    inputs = _field(obj, "inputs", list, where, default=[])
    outputs = _field(obj, "outputs", list, where)
    for ref in (*inputs, *outputs):
        if not isinstance(ref, str):
            raise GraphError(f"{where} refers to {ref!r}; value references are names", op=name)
    attrs = _field(obj, "attrs", dict, where, default={})
    scope = _field(obj, "scope", str, where, default="")
    role = _field(obj, "role", str, where, default="forward")
    if role not in {r.value for r in OpRole}:
        raise GraphError(
            f"{where} has unknown role {role!r}; expected one of "
            f"{', '.join(r.value for r in OpRole)}",
            op=name,
        )
    return Op(name, kind, tuple(inputs), tuple(outputs), attrs, scope, OpRole(role))


def _no_unknown_fields(obj: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise GraphError(f"{where} has unknown field {unknown[0]!r}", field=unknown[0])
