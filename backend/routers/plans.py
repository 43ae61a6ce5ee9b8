"""Plans: queue a plan build (202), then read what the worker stored.

`POST /api/plans` creates the plan and its job in one transaction; a worker builds it. Before
that, what the engine can refuse cheaply is refused at once (422, nothing stored): a mesh
with more devices than the cluster, and user annotations that match no value of the model
or do not divide a dim evenly. Once the job succeeded, the plan's summary and artifacts
(program, placements, collectives, trace) are readable; before that those views answer 409
`not_ready` naming the job status.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from backend import blobs, ledger, reviews
from backend.baselines import baseline_names, comparison
from backend.deps import PrincipalDep, SessionDep, SettingsDep
from backend.errors import ApiError, not_found
from backend.json_response import SafeJSONResponse
from backend.orm import Artifact, Job, Model, Plan, ReviewRequest, Strategy
from backend.ownership import require_removal
from backend.pagination import MAX_OFFSET, Page
from backend.plan_graph.index import collective_json
from backend.plan_read import PLANS, fast_plan_json, plans_json
from backend.planning import check_plan, plan_deadline, queue_plan
from backend.routers.clusters import resolve_cluster
from backend.schemas.common import MAX_ROW_ID, PathId, errors
from backend.schemas.jobs import Created, PlanCreate, PlanOut

router = APIRouter(prefix="/api/plans", tags=["plans"])

#: Steps of a placement explanation followed at most.
MAX_DEPTH = 12


def owned(session: Session, table: type[Any], team_id: int, ident: int, what: str) -> Any:
    """The row `ident` of `table` if it belongs to team `team_id`; 404 naming it otherwise."""
    row = session.get(table, ident)
    if row is None or row.team_id != team_id:
        raise not_found(what, ident)
    return row


def job_of(session: Session, job_id: int) -> Job:
    """The job that builds a resource (always present: foreign key)."""
    job = session.get(Job, job_id)
    assert job is not None
    return job


def job_fields(job: Job) -> dict[str, Any]:
    """The job state every resource view repeats."""
    return {
        "status": job.status,
        "progress": job.progress,
        "message": job.message,
        "error": job.error,
    }


def built_plan(session: Session, team_id: int, plan_id: int) -> Plan:
    """The team's plan, once its job succeeded: 404 if unknown, 409 `not_ready` before."""
    plan: Plan = owned(session, Plan, team_id, plan_id, "plan")
    job = job_of(session, plan.job_id)
    if job.status != "succeeded":
        raise ApiError(
            409,
            "not_ready",
            f"plan {plan_id} is not built: its job {job.id} is {job.status}",
            plan_id=plan_id,
            job_id=job.id,
            job_status=job.status,
        )
    return plan


def costed_plan(session: Session, team_id: int, plan_id: int, resource: str) -> Plan:
    """The built plan; 404 (naming `resource`) for a plan planned without a cluster."""
    plan = built_plan(session, team_id, plan_id)
    if plan.cluster is None:
        raise ApiError(
            404,
            "not_found",
            f"plan {plan_id} has no cost: it was planned without a cluster",
            resource=resource,
            plan_id=plan_id,
        )
    return plan


def artifact(session: Session, plan: Plan, kind: str) -> Any:
    """The plan's `kind` artifact, unpacked; 404 when the plan has none."""
    return blobs.unpack(artifact_row(session, plan, kind).data)


def artifact_row(session: Session, plan: Plan, kind: str) -> Artifact:
    """The plan's `kind` artifact row (packed data); 404 when the plan has none."""
    row = session.scalar(
        select(Artifact).where(
            Artifact.owner == "plan", Artifact.owner_id == plan.id, Artifact.kind == kind
        )
    )
    if row is None:
        raise ApiError(
            404, "not_found", f"plan {plan.id} has no {kind}", resource=kind, plan_id=plan.id
        )
    return row


@dataclass
class Labels:
    """Names a plan's view shows for its ids, looked up once for a whole page of plans."""

    users: dict[int, str]
    models: dict[int, str]
    strategies: dict[int, str]

    @classmethod
    def of(cls, session: Session, plans: Sequence[Plan]) -> Labels:
        models = select(Model.id, Model.name).where(Model.id.in_({p.model_id for p in plans}))
        versions = select(Strategy.id, Strategy.name, Strategy.version).where(
            Strategy.id.in_({p.strategy_id for p in plans})
        )
        return cls(
            users=reviews.user_names(session, [p.author_id for p in plans]),
            models={int(i): str(n) for i, n in session.execute(models)},
            strategies={int(i): f"{n} v{v}" for i, n, v in session.execute(versions)},
        )


def _plan_out(
    session: Session, plan: Plan, labels: Labels | None = None, compare: bool = False
) -> dict[str, Any]:
    """The response form of a plan; `labels` saves the name lookups per row in lists;
    `compare` adds the comparison with its baseline (one plan's view, not lists)."""
    job = job_of(session, plan.job_id)
    labels = labels or Labels.of(session, [plan])
    summary = plan.summary if job.status == "succeeded" else None
    return {
        "id": plan.id,
        "model_id": plan.model_id,
        "model": labels.models.get(plan.model_id),
        "strategy_id": plan.strategy_id,
        "strategy": labels.strategies.get(plan.strategy_id),
        "cluster": plan.cluster,
        "job_id": plan.job_id,
        **job_fields(job),
        "summary": summary,
        "author": labels.users.get(plan.author_id) if plan.author_id else None,
        "review_state": plan.review_state,
        "baseline": (comparison(session, plan, summary) or None) if compare else None,
        "baseline_of": baseline_names(session, plan) if compare else [],
        "created_at": ledger.iso(plan.created_at),
    }


@router.post("", status_code=202, response_model=Created, responses=errors(401, 404, 422))
def create_plan(
    body: PlanCreate,
    request: Request,
    session: SessionDep,
    principal: PrincipalDep,
    settings: SettingsDep,
) -> dict[str, Any]:
    """Queue the plan of a model under a strategy version (costed when `cluster` is given);
    422 at once for a mesh larger than the cluster, or an annotation or template that does
    not fit the model. The engine's checks (seconds for a 200,000-op model) run on what a
    short read session loaded, before this request's write transaction (on SQLite, the
    database's write lock) begins."""
    team = principal.team_id
    with request.app.state.sessions() as reading:
        model = owned(reading, Model, team, body.model_id, "model")
        strategy = owned(reading, Strategy, team, body.strategy_id, "strategy")
        spec = resolve_cluster(reading, team, body.cluster) if body.cluster else None
        deadline = plan_deadline(reading, settings, team)
    check_plan(model, strategy, spec, deadline)
    # deleted meanwhile by another request? then this is a 404, not a foreign-key error
    for table, ident, what in ((Model, model.id, "model"), (Strategy, strategy.id, "strategy")):
        if session.scalar(select(table.id).where(table.id == ident)) is None:
            raise not_found(what, ident)
    plan, job = queue_plan(session, settings, model, strategy, body.cluster, spec,
                           author_id=principal.user_id)  # fmt: skip
    session.commit()
    return {"id": plan.id, "job_id": job.id, "status": job.status}


@router.get("", response_model=list[PlanOut], responses=errors(401, 403, 422))
def list_plans(
    session: SessionDep,
    principal: PrincipalDep,
    page: Page,
    model_id: Annotated[
        int | None, Query(ge=1, le=MAX_ROW_ID, description="Only this model's plans.")
    ] = None,
    strategy_id: Annotated[
        int | None, Query(ge=1, le=MAX_ROW_ID, description="Only plans of this strategy version.")
    ] = None,
    cluster: Annotated[
        str | None, Query(max_length=100, description="Only plans on this cluster.")
    ] = None,
    author: Annotated[
        str | None, Query(max_length=100, description='Only plans by this member ("me": you).')
    ] = None,
    review_state: Annotated[
        Literal["none", "pending", "changes_requested", "approved"] | None,
        Query(description="Only plans in this review state."),
    ] = None,
    reviewer: Annotated[
        str | None,
        Query(
            max_length=100,
            description='Only plans waiting for this member\'s review ("me": "waiting for my '
            'review").',
        ),
    ] = None,
) -> Any:
    """The team's plans, newest first, a page at a time (`pagination`), filtered by model,
    strategy version, cluster, author, review state, or a reviewer who has not decided."""
    query = PLANS.where(Plan.team_id == principal.team_id)
    if model_id is not None:
        query = query.where(Plan.model_id == model_id)
    if strategy_id is not None:
        query = query.where(Plan.strategy_id == strategy_id)
    if cluster is not None:
        query = query.where(Plan.cluster == cluster)
    if author is not None:
        query = query.where(Plan.author_id == reviews.member_id(session, principal, author))
    if review_state is not None:
        query = query.where(Plan.review_state == review_state)
    if reviewer is not None:
        waiting = select(ReviewRequest.plan_id).where(
            ReviewRequest.reviewer_id == reviews.member_id(session, principal, reviewer),
            ReviewRequest.state == "pending",
        )
        query = query.where(Plan.id.in_(waiting))
    body = plans_json(session, page.window(session, query.order_by(Plan.id.desc())))
    return Response(body, media_type="application/json", headers=page.headers())


@router.get("/{plan_id}", response_model=PlanOut, responses=errors(401, 404, 422))
def get_plan(plan_id: PathId, session: SessionDep, principal: PrincipalDep) -> Any:
    """A plan with its job's state, its review state and, once built, its summary and its
    comparison with the baseline of its model and cluster (`baseline`, if there is one)."""
    fast = fast_plan_json(session, principal.team_id, plan_id)
    if fast is not None:
        return Response(fast, media_type="application/json")
    plan = owned(session, Plan, principal.team_id, plan_id, "plan")
    return _plan_out(session, plan, compare=True)


@router.delete("/{plan_id}", status_code=204, responses=errors(401, 403, 404, 409, 422))
def delete_plan(plan_id: PathId, session: SessionDep, principal: PrincipalDep) -> Response:
    """Delete a plan with its artifacts, reviews, checks and baselines; only an admin or the
    plan's author may (403), and not while its job is queued or running (409)."""
    plan: Plan = owned(session, Plan, principal.team_id, plan_id, "plan")
    require_removal(principal, plan.author_id, f"plan {plan.id}")
    job = job_of(session, plan.job_id)
    if job.status in ("queued", "running"):
        raise ApiError(409, "conflict", f"plan {plan.id} is being built (job {job.id} is "
                       f"{job.status}): cancel the job first", job_id=job.id)  # fmt: skip
    session.execute(delete(Artifact).where(Artifact.owner == "plan", Artifact.owner_id == plan.id))
    session.delete(plan)
    session.commit()
    return Response(status_code=204)


@router.get("/{plan_id}/program", responses=errors(401, 404, 409, 422))
def get_program(
    plan_id: PathId,
    session: SessionDep,
    principal: PrincipalDep,
    scope: Annotated[str, Query(description="Ops under this scope, e.g. layers.0.")] = "",
    limit: Annotated[int, Query(ge=1, le=5000)] = 500,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> dict[str, Any]:
    """The per-rank program's ops (in program order) under `scope`, a page at a time."""
    plan = built_plan(session, principal.team_id, plan_id)
    ops = artifact(session, plan, "program")["ops"]
    if scope:
        ops = [op for op in ops if op["scope"] == scope or op["scope"].startswith(scope + ".")]
    return {
        "plan_id": plan_id,
        "scope": scope,
        "total": len(ops),
        "offset": offset,
        "limit": limit,
        "ops": ops[offset : offset + limit],
    }


@router.get("/{plan_id}/placements/{value:path}", responses=errors(401, 404, 409, 422))
def get_placement(
    plan_id: PathId, value: str, session: SessionDep, principal: PrincipalDep
) -> dict[str, Any]:
    """A serial value's spec and why: the decisions that set it, then those of the input
    that drove them, back to an annotation or a source (`text`: the chain as lines)."""
    plan = built_plan(session, principal.team_id, plan_id)
    values = artifact(session, plan, "placements")["values"]
    if value not in values:
        raise ApiError(
            404,
            "not_found",
            f"plan {plan_id} has no value {value!r}",
            resource="value",
            value=value,
        )
    chain: list[dict[str, Any]] = []
    current: str | None = value
    while current in values and current not in {s["value"] for s in chain}:
        entry = values[current]
        chain.append(
            {
                "value": current,
                "spec": entry["spec"],
                "decisions": entry["decisions"],
                "because_of": entry["next"],
            }
        )
        if len(chain) >= MAX_DEPTH:
            break
        current = entry["next"]
    lines = []
    for depth, step in enumerate(chain):
        pad = "  " * depth
        lines.append(f"{pad}{step['value']}: {step['spec']}")
        lines += [f"{pad}  - {d['source']}: {d['detail']}" for d in step["decisions"]]
        if step["because_of"]:
            lines.append(f"{pad}  because of input {step['because_of']!r}:")
    reshards = values[value]["reshards"]
    lines += [
        f"note: op {r['op']!r} needs {value!r} as {r['need']}, it arrives as {r['have']}"
        for r in reshards
    ]
    return {
        "plan_id": plan_id,
        "value": value,
        "spec": values[value]["spec"],
        "explanation": chain,
        "reshards": reshards,
        "text": "\n".join(lines),
    }


@router.get("/{plan_id}/collectives", responses=errors(401, 404, 409, 422))
def list_collectives(
    plan_id: PathId, session: SessionDep, principal: PrincipalDep
) -> list[dict[str, Any]]:
    """Every communication op of the program, in program order, and why it exists."""
    plan = built_plan(session, principal.team_id, plan_id)
    ops = artifact(session, plan, "program")["ops"]
    return [collective_json(op) for op in ops if op.get("comm")]


@router.get("/{plan_id}/collectives/{name:path}", responses=errors(401, 404, 409, 422))
def getcollective_json(
    plan_id: PathId, name: str, session: SessionDep, principal: PrincipalDep
) -> dict[str, Any]:
    """One communication op: its full reason, values, and predicted time when costed."""
    plan = built_plan(session, principal.team_id, plan_id)
    program = artifact(session, plan, "program")
    for op in program["ops"]:
        if op["name"] == name and op.get("comm"):
            times = program.get("op_times_s") or {}
            return {
                **collective_json(op),
                "stream": op["stream"],
                "inputs": op["inputs"],
                "outputs": op["outputs"],
                "deps": op["deps"],
                "time_s": times.get(name),
            }
    raise ApiError(
        404,
        "not_found",
        f"plan {plan_id} has no collective {name!r}",
        resource="collective",
        name=name,
    )


@router.get("/{plan_id}/trace", responses=errors(401, 404, 409, 422))
def get_trace(plan_id: PathId, session: SessionDep, principal: PrincipalDep) -> SafeJSONResponse:
    """The predicted step as a Chrome trace (open in https://ui.perfetto.dev); plans
    built without a cluster have none (404)."""
    plan = built_plan(session, principal.team_id, plan_id)
    if plan.cluster is None:
        raise ApiError(
            404,
            "not_found",
            f"plan {plan_id} has no trace: it was built without a cluster",
            resource="trace",
            plan_id=plan_id,
        )
    data = artifact(session, plan, "trace")
    headers = {"Content-Disposition": f'attachment; filename="plan-{plan_id}-trace.json"'}
    return SafeJSONResponse(data, headers=headers)
