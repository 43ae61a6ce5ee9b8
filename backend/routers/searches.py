"""Strategy searches: queue a search for a stored preset model on a cluster (202), follow its
job's progress, read the ranked candidates and their Pareto front.

A search walks the meshes, templates, recomputation and schedules of `shardlab.search` on
the worker. Each candidate in the result carries its plan inputs (`mesh`, `templates`,
`options`); `POST /api/searches/{id}/plans {"candidate": i}` builds candidate i as the
search planned it: the model at the searched global batch (the team's identical model, or a
new one), the candidate's strategy (its name's latest version when identical, else the
next), and the plan, queued. Asked twice, it stores no second model nor strategy.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from sqlalchemy import select
from sqlalchemy.orm import Session

from backend import ledger
from backend.deps import PrincipalDep, SessionDep, SettingsDep
from backend.errors import ApiError
from backend.orm import Model, Search
from backend.pagination import Page
from backend.planning import check_plan, plan_deadline, queue_plan
from backend.routers.clusters import resolve_cluster
from backend.routers.models import (
    add_new_model,
    commit_or_conflict,
    find_preset_model,
    new_preset_model,
)
from backend.routers.plans import job_fields, job_of, owned
from backend.routers.strategies import latest_or_new_version
from backend.schemas.common import MAX_ROW_ID, PathId, errors
from backend.schemas.jobs import Created, SearchCreate, SearchOut, SearchPlanCreate
from backend.schemas.resources import StrategyUpdate

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


@router.post(
    "/{search_id}/plans", status_code=202, response_model=Created,
    responses=errors(401, 404, 409, 422),
)  # fmt: skip
def build_candidate(
    search_id: PathId,
    body: SearchPlanCreate,
    request: Request,
    session: SessionDep,
    principal: PrincipalDep,
    settings: SettingsDep,
) -> dict[str, Any]:
    """Queue the plan of candidate `candidate` (its rank, from 0) as the search planned it:
    on the search's model at the searched global batch, under the candidate's strategy, on
    the search's cluster (module docstring). 409 until the search has succeeded; 422 naming
    `candidate` for a rank the result does not have or a candidate that could not be
    planned."""
    team = principal.team_id
    row: Search = owned(session, Search, team, search_id, "search")
    job = job_of(session, row.job_id)
    if job.status != "succeeded" or row.result is None:
        raise ApiError(409, "not_ready", f"search {row.id} is {job.status}: its candidates "
                       "are not known yet", job_status=job.status)  # fmt: skip
    candidates = row.result.get("candidates", [])
    if body.candidate >= len(candidates):
        raise ApiError(422, "invalid_candidate", f"candidate: search {row.id} ranked "
                       f"{len(candidates)} candidates (0 to {len(candidates) - 1}), not "
                       f"{body.candidate}", field="candidate")  # fmt: skip
    chosen = candidates[body.candidate]
    if chosen.get("step_time_s") is None:
        raise ApiError(422, "invalid_candidate", f"candidate: {chosen.get('label')!r} could "
                       f"not be planned ({chosen.get('reason')})", field="candidate")  # fmt: skip
    source: Model = owned(session, Model, team, row.model_id, "model")
    batch = int(row.result.get("global_batch") or (source.overrides or {}).get("batch", 0))
    overrides = {**(source.overrides or {}), **({"batch": batch} if batch else {})}
    assert source.preset is not None  # a search's model is made from a preset
    model = find_preset_model(session, team, source.preset, overrides)
    if model is None:
        name, built = new_preset_model(source.preset, overrides, settings.max_graph_ops)
        model = add_new_model(session, team, name, built, principal.user_id)
    definition = StrategyUpdate(mesh=chosen["mesh"], templates=list(chosen["templates"]),
                                annotations=list(chosen.get("annotations") or []),
                                options=dict(chosen.get("options") or {}))  # fmt: skip
    name = f"search {row.id}: {chosen['label']}"[:200]
    strategy = latest_or_new_version(session, team, name, definition)
    spec = resolve_cluster(session, team, row.cluster)
    with request.app.state.sessions() as reading:
        deadline = plan_deadline(reading, settings, team)
    check_plan(model, strategy, spec, deadline)
    plan, plan_job = queue_plan(session, settings, model, strategy, row.cluster, spec,
                                author_id=principal.user_id)  # fmt: skip
    commit_or_conflict(session, "a concurrent request stored the same model or strategy; "
                       "build the candidate again")  # fmt: skip
    return {"id": plan.id, "job_id": plan_job.id, "status": plan_job.status}
