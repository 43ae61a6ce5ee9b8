"""Strategy searches: queue a search for a stored preset model on a cluster (202), follow its
job's progress, read the ranked candidates and their Pareto front.

A search walks the meshes, templates, recomputation and schedules of `shardlab.search` on
the worker. Each candidate in the result carries its plan inputs (`mesh`, `templates`,
`options`), so it becomes a stored strategy and plan through the usual endpoints.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from sqlalchemy import select
from sqlalchemy.orm import Session

from backend import ledger
from backend.deps import PrincipalDep, SessionDep, SettingsDep
from backend.errors import ApiError
from backend.orm import Model, Search
from backend.pagination import Page
from backend.routers.clusters import resolve_cluster
from backend.routers.plans import job_fields, job_of, owned
from backend.schemas.common import MAX_ROW_ID, PathId, errors
from backend.schemas.jobs import Created, SearchCreate, SearchOut

router = APIRouter(prefix="/api/searches", tags=["searches"])


def _out(session: Session, row: Search) -> dict[str, Any]:
    job = job_of(session, row.job_id)
    return {
        "id": row.id,
        "model_id": row.model_id,
        "cluster": row.cluster,
        "request": dict(row.request),
        "job_id": row.job_id,
        **job_fields(job),
        "result": row.result if job.status == "succeeded" else None,
        "created_at": ledger.iso(row.created_at),
    }


@router.post("", status_code=202, response_model=Created, responses=errors(401, 404, 422))
def create_search(
    body: SearchCreate, session: SessionDep, principal: PrincipalDep, settings: SettingsDep
) -> dict[str, Any]:
    """Queue a search; 422 at once for a model not made from a preset or more GPUs than the
    cluster has."""
    team = principal.team_id
    model: Model = owned(session, Model, team, body.model_id, "model")
    if model.source != "preset" or not model.preset:
        raise ApiError(422, "invalid_search",
                       f"model {model.id} ({model.name!r}) is not made from a preset: a search "
                       "rebuilds the model for each mesh and micro-batch size",
                       model_id=model.id)  # fmt: skip
    spec = resolve_cluster(session, team, body.cluster)
    devices = int(spec["nodes"]) * int(spec["devices_per_node"])
    if body.gpus is not None and body.gpus > devices:
        raise ApiError(422, "invalid_search",
                       f"gpus {body.gpus} is more than the {devices} devices of cluster "
                       f"{body.cluster!r}", gpus=body.gpus)  # fmt: skip
    request = body.model_dump()
    job = ledger.enqueue(session, settings, team, "search", {})
    row = Search(team_id=team, model_id=model.id, cluster=body.cluster, job_id=job.id,
                 request=request)  # fmt: skip
    session.add(row)
    session.flush()
    job.payload = {"search_id": row.id, "cluster": spec}
    session.commit()
    return {"id": row.id, "job_id": job.id, "status": job.status}


@router.get("", response_model=list[SearchOut], responses=errors(401, 422))
def list_searches(
    session: SessionDep,
    principal: PrincipalDep,
    page: Page,
    model_id: Annotated[
        int | None, Query(ge=1, le=MAX_ROW_ID, description="Only this model's searches.")
    ] = None,
) -> list[dict[str, Any]]:
    """The team's searches, newest first, a page at a time (`pagination`), filtered by model."""
    query = select(Search).where(Search.team_id == principal.team_id)
    if model_id is not None:
        query = query.where(Search.model_id == model_id)
    rows = page.rows(session, query.order_by(Search.id.desc()))
    return [_out(session, row) for row in rows]


@router.get("/{search_id}", response_model=SearchOut, responses=errors(401, 404, 422))
def get_search(search_id: PathId, session: SessionDep, principal: PrincipalDep) -> dict[str, Any]:
    """A search with its job's state and, once done, its ranked candidates (the same JSON
    as `shardlab search --json`)."""
    return _out(session, owned(session, Search, principal.team_id, search_id, "search"))
