"""Verifications: queue a run of `shardlab.verify` on a plan (202), then read its report.

Where it runs (simulated, or real torch ranks on a worker with the devices) is checked and
queued by `backend/verifying.py`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from sqlalchemy import select
from sqlalchemy.orm import Session, defer

from backend import ledger
from backend.deps import PrincipalDep, SessionDep, SettingsDep
from backend.orm import Model, Plan, Strategy, Verification
from backend.planning import engine_strategy
from backend.routers.plans import job_fields, job_of, owned
from backend.schemas.common import PathId, errors
from backend.schemas.jobs import Created, VerificationCreate, VerificationOut
from backend.verifying import check_dtype, queue_verification, run_on
from shardlab.check import check_verifiable
from shardlab.runtime.twin import has_twin
from shardlab.strategy import Strategy as EngineStrategy

router = APIRouter(prefix="/api/verifications", tags=["verifications"])


def _out(session: Session, ver: Verification) -> dict[str, Any]:
    job = job_of(session, ver.job_id)
    return {
        "id": ver.id,
        "plan_id": ver.plan_id,
        "compute_dtype": ver.compute_dtype,
        "backend": job.payload.get("backend", "simulated"),
        "nproc": job.payload.get("nproc"),
        "device": job.payload.get("device"),
        "job_id": ver.job_id,
        **job_fields(job),
        "report": ver.report if job.status == "succeeded" else None,
        "created_at": ledger.iso(ver.created_at),
    }


@router.post("", status_code=202, response_model=Created, responses=errors(401, 404, 422))
def create_verification(
    body: VerificationCreate, session: SessionDep, principal: PrincipalDep, settings: SettingsDep
) -> dict[str, Any]:
    """Queue one training step of the plan, distributed (on the simulated mesh, or with
    `backend: torch` on real ranks: `nproc` processes on `device`, claimed only by a worker
    with the devices), against one device. 422, storing nothing, naming `plan_id` for a
    model too large to verify here that has no scaled-down twin, or with `twin: false`
    (`shardlab.check.check_verifiable`: a full-size model's run would take gigabytes of
    memory and minutes; the worker verifies a transformer preset's twin instead), or
    `nproc`, `device` or `backend` for a run that cannot be (`backend/verifying.py`)."""
    team = principal.team_id
    plan: Plan = owned(session, Plan, team, body.plan_id, "plan")
    strategy = _check_verifiable(session, plan, body.compute_dtype, body.twin)
    run = run_on(strategy, body)
    check_dtype(body.compute_dtype, run)
    ver = queue_verification(
        session, settings, team, body.plan_id, body.compute_dtype, run, twin=body.twin
    )
    session.commit()
    job = job_of(session, ver.job_id)
    return {"id": ver.id, "job_id": job.id, "status": job.status}


def _check_verifiable(session: Session, plan: Plan, dtype: str, twin: bool) -> EngineStrategy:
    """Refuse a plan whose verification would hold more than the limit, at once, unless its
    model has a scaled-down twin the worker verifies instead (`twin`, a transformer preset);
    the plan's engine strategy."""
    model = session.get(Model, plan.model_id, options=[defer(Model.graph_blob)])
    strategy = session.get(Strategy, plan.strategy_id)
    assert model is not None and strategy is not None  # a plan keeps its model and strategy
    engine = engine_strategy(strategy.mesh, strategy.templates, strategy.annotations,
                             strategy.options)  # fmt: skip
    if not (twin and has_twin(model.preset)):
        check_verifiable(int(model.summary.get("params", 0)), engine.mesh.size, dtype=dtype,
                         field="plan_id")  # fmt: skip
    return engine


@router.get("", response_model=list[VerificationOut], responses=errors(401, 422))
def list_verifications(session: SessionDep, principal: PrincipalDep) -> list[dict[str, Any]]:
    """The team's verifications, newest first."""
    rows = session.scalars(
        select(Verification)
        .where(Verification.team_id == principal.team_id)
        .order_by(Verification.id.desc())
    )
    return [_out(session, ver) for ver in rows]


@router.get("/{verification_id}", response_model=VerificationOut, responses=errors(401, 404, 422))
def get_verification(
    verification_id: PathId, session: SessionDep, principal: PrincipalDep
) -> dict[str, Any]:
    """A verification with its job's state and, once done, its report."""
    ver = owned(session, Verification, principal.team_id, verification_id, "verification")
    return _out(session, ver)
