"""The op graph of a plan, one module scope at a time, for the graph view.

`GET /api/plans/{id}/graph?scope=layers.0` answers the nodes (child modules, folded repeats,
the scope's own ops), the edges between them with the values and specs they carry and the
communication ops on them as badges (`backend.plan_graph`). `GET .../graph/search?q=` finds
ops, values, collectives and modules with the scope to open; `GET .../graph/ops/{name}` is one
op with the shapes of what it reads and writes.

The program is indexed once per plan and kept, with the views built from it, in small
in-process LRU caches keyed by the program artifact's row (a rebuilt plan has a new one);
the team check runs on every request before any cache is read.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Annotated, Any, Generic, TypeVar

from fastapi import APIRouter, Query
from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.deps import PrincipalDep, SessionDep
from backend.errors import ApiError
from backend.orm import Artifact, Plan
from backend.plan_graph.index import GraphIndex
from backend.plan_graph.op_detail import op_detail, value_shapes
from backend.plan_graph.scope_view import ScopeNotFound, scope_view
from backend.plan_graph.search import MAX_SEARCH, search
from backend.routers.plans import artifact, built_plan
from backend.schemas.common import PathId, errors
from shardlab.errors import ShardlabError

router = APIRouter(prefix="/api/plans", tags=["plans"])

K = TypeVar("K")
V = TypeVar("V")


class LRU(Generic[K, V]):
    """A small thread-safe least-recently-used cache."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._data: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K, make: Callable[[], V]) -> V:
        """The cached value of `key`, made (outside the lock) when missing."""
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                return self._data[key]
        value = make()
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.size:
                self._data.popitem(last=False)
        return value

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


#: indexed programs (the largest: llama3-8b dp=8,tp=8 is ~3,700 ops), views, value shapes
INDEXES: LRU[tuple[int, int], GraphIndex] = LRU(4)
VIEWS: LRU[tuple[int, int, str], dict[str, Any]] = LRU(256)
SHAPES: LRU[tuple[int, int], dict[str, tuple[list[int], str]]] = LRU(3)


def _program_row(session: Session, plan: Plan) -> int:
    row = session.scalar(
        select(Artifact.id).where(
            Artifact.owner == "plan", Artifact.owner_id == plan.id, Artifact.kind == "program"
        )
    )
    if row is None:
        raise ApiError(
            404, "not_found", f"plan {plan.id} has no program", resource="program", plan_id=plan.id
        )
    return int(row)


def plan_index(
    session: Session, principal: Any, plan_id: int
) -> tuple[tuple[int, int], GraphIndex]:
    """The team's built plan, indexed (404/409 as for the plan's other views)."""
    plan = built_plan(session, principal.team_id, plan_id)
    key = (plan.id, _program_row(session, plan))

    def make() -> GraphIndex:
        program = artifact(session, plan, "program")
        placements = artifact(session, plan, "placements")
        fallback = (plan.summary or {}).get("fallback_ops") or []
        return GraphIndex.build(program, placements, fallback)

    return key, INDEXES.get(key, make)


@router.get("/{plan_id}/graph", responses=errors(401, 404, 409, 422))
def get_graph(
    plan_id: PathId,
    session: SessionDep,
    principal: PrincipalDep,
    scope: Annotated[
        str, Query(max_length=500, description='A module path, e.g. "layers.0.attn"; "" = root.')
    ] = "",
) -> dict[str, Any]:
    """The op graph of one module scope of the plan's program: child modules (repeated
    layers folded into one node with `repeat`) and the scope's own ops as nodes; value flow
    between them as edges with specs; communication ops as badges on those edges with why
    they exist. 404 names a scope the program does not have."""
    key, index = plan_index(session, principal, plan_id)

    def make() -> dict[str, Any]:
        try:
            return scope_view(index, scope)
        except ScopeNotFound:
            raise ApiError(
                404,
                "not_found",
                f"plan {plan_id} has no module scope {scope!r}",
                resource="scope",
                scope=scope,
                plan_id=plan_id,
            ) from None

    return {"plan_id": plan_id, **VIEWS.get((*key, scope), make)}


@router.get("/{plan_id}/graph/search", responses=errors(401, 404, 409, 422))
def search_graph(
    plan_id: PathId,
    session: SessionDep,
    principal: PrincipalDep,
    q: Annotated[str, Query(max_length=200, description="Part of a name.")] = "",
) -> dict[str, Any]:
    """Up to 50 ops, collectives, values and modules whose name contains `q` (case does not
    matter; exact and prefix matches first), each with the scope to open to see it; none for
    an empty `q`."""
    _, index = plan_index(session, principal, plan_id)
    return {"plan_id": plan_id, "q": q, "results": search(index, q, MAX_SEARCH)}


@router.get("/{plan_id}/graph/ops/{name:path}", responses=errors(401, 404, 409, 422))
def get_graph_op(
    plan_id: PathId, name: str, session: SessionDep, principal: PrincipalDep
) -> dict[str, Any]:
    """One op of the program for the graph's side panel: kind, role, scope, the rule's
    reason, and per input and output its spec, global shape and per-rank block shape."""
    key, index = plan_index(session, principal, plan_id)
    if name not in index.by_name:
        raise ApiError(
            404, "not_found", f"plan {plan_id} has no op {name!r}", resource="op", name=name
        )
    plan = built_plan(session, principal.team_id, plan_id)

    def make() -> dict[str, tuple[list[int], str]]:
        try:
            return value_shapes(artifact(session, plan, "plan"))
        except (ApiError, ShardlabError, KeyError, ValueError, TypeError):
            return {}  # no plan artifact or an unreadable one: no shapes, the rest stands

    detail = op_detail(index, name, SHAPES.get(key, make))
    assert detail is not None
    return {"plan_id": plan_id, **detail}
