"""Measurements: time a plan's step on real torch ranks (202), then read it against the
prediction.

`POST /api/plans/{id}/measurements` queues a `measure` job (checked by
`backend/measuring.py`; 422 naming `plan_id`, `nproc` or `device`, nothing stored); a worker
with the devices runs it (`worker/engine.run_measure`) and stores the plan's `measured`
artifact, read at `GET /api/plans/{id}/measured`, and the measured Chrome trace
(`GET /api/plans/{id}/measured/trace`). `GET /api/plans/{id}/measurements` lists the plan's
measurement jobs, newest first, so a client can follow one still running.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from sqlalchemy import select

from backend.deps import PrincipalDep, SessionDep, SettingsDep
from backend.json_response import SafeJSONResponse
from backend.ledger import ledger_row_json
from backend.measuring import check_measurable, queue_measurement
from backend.orm import Job, Plan
from backend.routers.plans import artifact, built_plan, owned
from backend.schemas.common import PathId, errors
from backend.schemas.jobs import JobOut, MeasurementCreate, MeasurementCreated

router = APIRouter(prefix="/api/plans", tags=["measurements"])

#: measurement jobs of a team looked at for one plan's list (the newest)
LIST_SCAN = 200


@router.post(
    "/{plan_id}/measurements",
    status_code=202,
    response_model=MeasurementCreated,
    responses=errors(401, 404, 409, 422, 429),
)
def create_measurement(
    plan_id: PathId,
    body: MeasurementCreate,
    session: SessionDep,
    principal: PrincipalDep,
    settings: SettingsDep,
) -> dict[str, Any]:
    """Queue a measurement of the built plan: `steps` steps (after one warm-up) on `nproc`
    torch ranks (the mesh size) on `device`, claimed only by a worker with the devices; the
    result (predicted against measured: step, compute, communication, per op kind and layer;
    every rank's measured op spans) becomes the plan's `measured` view. 409 before the plan is
    built (after the 422s); 422 naming `plan_id` for a plan without a cluster or a model too
    large to run, `nproc` or `device` for a run that cannot be."""
    plan = owned(session, Plan, principal.team_id, plan_id, "plan")
    run = check_measurable(session, plan, body)
    built_plan(session, principal.team_id, plan_id)  # 409 `not_ready` until it is built
    job = queue_measurement(session, settings, principal.team_id, plan, body, run)
    session.commit()
    return {"plan_id": plan_id, "job_id": job.id, "status": job.status,
            "requires": {"device": job.requires_device, "nproc": job.requires_nproc}}  # fmt: skip


@router.get(
    "/{plan_id}/measurements", response_model=list[JobOut], responses=errors(401, 404, 409, 422)
)
def list_measurements(
    plan_id: PathId, session: SessionDep, principal: PrincipalDep
) -> list[dict[str, Any]]:
    """The plan's measurement jobs, newest first (of the team's latest measurements)."""
    built_plan(session, principal.team_id, plan_id)
    jobs = session.scalars(
        select(Job)
        .where(Job.team_id == principal.team_id, Job.kind == "measure")
        .order_by(Job.id.desc())
        .limit(LIST_SCAN)
    )
    return [ledger_row_json(job) for job in jobs if job.payload.get("plan_id") == plan_id]


@router.get("/{plan_id}/measured", responses=errors(401, 404, 409, 422))
def get_measured(plan_id: PathId, session: SessionDep, principal: PrincipalDep) -> dict[str, Any]:
    """The plan's latest measurement (404 before one succeeded): `steps`, `nproc`, `device`,
    `backend`, the measured and predicted step, `rows` (name, group: step | total | kind |
    layer, predicted_s, measured_s, error_pct = (predicted - measured) / measured * 100) and
    every rank's median step as op spans (`ops`: the op table; per rank `op` indices into it,
    `start_s` and `end_s` since the step's start, `step_s`)."""
    plan = built_plan(session, principal.team_id, plan_id)
    data: dict[str, Any] = artifact(session, plan, "measured")
    return {"plan_id": plan_id, **data}


@router.get("/{plan_id}/measured/trace", responses=errors(401, 404, 409, 422))
def get_measured_trace(
    plan_id: PathId, session: SessionDep, principal: PrincipalDep
) -> SafeJSONResponse:
    """The latest measured step as a Chrome trace, one process per rank (open it in
    https://ui.perfetto.dev); 404 before a measurement succeeded."""
    plan = built_plan(session, principal.team_id, plan_id)
    data = artifact(session, plan, "measured_trace")
    headers = {"Content-Disposition": f'attachment; filename="plan-{plan_id}-measured.json"'}
    return SafeJSONResponse(data, headers=headers)
