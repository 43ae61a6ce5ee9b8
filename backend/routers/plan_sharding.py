"""Which rank holds which block of a value: the sharding diagram's data.

- `GET /api/plans/{id}/values`: every value of the plan's training graph with its spec,
  global shape, dtype and kind, and the diagram's default (the largest sharded parameter).
- `GET /api/plans/{id}/blocks/{value}`: per rank, the block it holds (`shardlab.blocks`).

Specs come from the plan's `placements` artifact (what the placements view shows). Global
shapes and dtypes are not stored with them: they are those of the training graph the worker
built, rebuilt here from the `plan` artifact (its model graph, optimizer and lr) with the same
`training_graph`, and kept in a small cache keyed by the artifacts' content (a built plan's
artifacts do not change).
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter
from sqlalchemy.orm import Session

from backend import blobs
from backend.deps import PrincipalDep, SessionDep
from backend.errors import ApiError
from backend.orm import Plan
from backend.routers.plans import artifact_row, built_plan
from backend.schemas.common import PathId, errors
from shardlab.autodiff import training_graph
from shardlab.blocks import blocks_json, mesh_json
from shardlab.graph_json import graph_from_json
from shardlab.ir import ValueKind
from shardlab.mesh import Mesh
from shardlab.placement import DistSpec

router = APIRouter(prefix="/api/plans", tags=["plans"])

#: Value tables of this many plans are kept (a llama3-8b one takes about a second to build).
CACHE_SIZE = 16


@dataclass(frozen=True, slots=True)
class ValueInfo:
    """One value of a plan: its completed spec and its global type."""

    name: str
    spec: str
    shape: tuple[int, ...]
    dtype: str
    kind: str

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "spec": self.spec,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "kind": self.kind,
        }


@dataclass(frozen=True, slots=True)
class ValueTable:
    """A built plan's mesh and values (in the training graph's order)."""

    mesh: Mesh
    values: dict[str, ValueInfo]

    def default(self) -> str | None:
        """The diagram's first value: the largest parameter a mesh axis shards (the first
        of equals), else the first sharded value, else the first value."""
        values = list(self.values.values())
        sharded = [v for v in values if "S(" in v.spec]
        params = [v for v in sharded if v.kind == ValueKind.PARAM]
        if params:
            return max(params, key=lambda v: math.prod(v.shape)).name
        return (sharded or values)[0].name if values else None


_cache: OrderedDict[bytes, ValueTable] = OrderedDict()
_lock = threading.Lock()


def _build_table(plan_data: dict[str, Any], placements: dict[str, Any]) -> ValueTable:
    mesh = Mesh.from_json(plan_data["strategy"]["mesh"])
    graph = training_graph(
        graph_from_json(plan_data["model"]),
        optimizer=str(plan_data["optimizer"]),
        lr=float(plan_data.get("lr", 1e-3)),
        recompute=str(plan_data["strategy"].get("options", {}).get("recompute", "none")),
    )
    values = {}
    for name, entry in placements["values"].items():
        value = graph.values.get(name)
        if value is None:  # not in the training graph: nothing to draw it with
            continue
        values[name] = ValueInfo(
            name, entry["spec"], tuple(value.type.shape), value.type.dtype, value.kind.value
        )
    return ValueTable(mesh, values)


def value_table(session: Session, plan: Plan) -> ValueTable:
    """The plan's mesh and values with specs, shapes, dtypes and kinds (cached)."""
    plan_row = artifact_row(session, plan, "plan")
    placements_row = artifact_row(session, plan, "placements")
    key = hashlib.sha256(plan_row.data + b"\0" + placements_row.data).digest()
    with _lock:
        table = _cache.get(key)
        if table is not None:
            _cache.move_to_end(key)
            return table
    table = _build_table(blobs.unpack(plan_row.data), blobs.unpack(placements_row.data))
    with _lock:
        _cache[key] = table
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return table


@router.get("/{plan_id}/values", responses=errors(401, 404, 409, 422))
def list_values(plan_id: PathId, session: SessionDep, principal: PrincipalDep) -> dict[str, Any]:
    """Every value of the plan (training graph order) with its spec, global shape, dtype and
    kind (param, activation, grad, state, input, constant); `default` is the value the
    sharding diagram opens with: the largest parameter that a mesh axis shards."""
    plan = built_plan(session, principal.team_id, plan_id)
    table = value_table(session, plan)
    return {
        "plan_id": plan_id,
        "mesh": mesh_json(table.mesh),
        "default": table.default(),
        "values": [v.to_json() for v in table.values.values()],
    }


@router.get("/{plan_id}/blocks/{value:path}", responses=errors(401, 404, 409, 422))
def get_blocks(
    plan_id: PathId, value: str, session: SessionDep, principal: PrincipalDep
) -> dict[str, Any]:
    """The block of `value` each rank holds: per rank its mesh coordinate, local shape,
    global `[start, stop)` per tensor dim, the mesh axes it holds a partial value over
    (`Partial` placements) with their op, its replica group (ranks that differ only along
    `Replicate` axes: the same block) and its partial group (ranks whose blocks reduce to
    the value's block). Ranks are listed in mesh position order (row-major)."""
    plan = built_plan(session, principal.team_id, plan_id)
    table = value_table(session, plan)
    info = table.values.get(value)
    if info is None:
        raise ApiError(
            404,
            "not_found",
            f"plan {plan_id} has no value {value!r}",
            resource="value",
            value=value,
        )
    spec = DistSpec.parse(info.spec, table.mesh)
    return {
        "plan_id": plan_id,
        "value": value,
        "kind": info.kind,
        "shape": list(info.shape),
        "dtype": info.dtype,
        **blocks_json(info.shape, spec),
    }
