"""Comparisons: queue `shardlab.compare` of two plans (202), then read the result."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from sqlalchemy import select
from sqlalchemy.orm import Session

from backend import ledger
from backend.deps import PrincipalDep, SessionDep, SettingsDep
from backend.errors import ApiError
from backend.orm import Comparison, Plan
from backend.routers.plans import job_fields, job_of, owned
from backend.schemas.common import PathId, errors
from backend.schemas.jobs import ComparisonCreate, ComparisonOut, Created

router = APIRouter(prefix="/api/comparisons", tags=["comparisons"])


def _out(session: Session, comp: Comparison) -> dict[str, Any]:
    job = job_of(session, comp.job_id)
    return {
        "id": comp.id,
        "plan_a_id": comp.plan_a_id,
        "plan_b_id": comp.plan_b_id,
        "job_id": comp.job_id,
        **job_fields(job),
        "result": comp.result if job.status == "succeeded" else None,
        "created_at": ledger.iso(comp.created_at),
    }


@router.post("", status_code=202, response_model=Created, responses=errors(401, 404, 422))
def create_comparison(
    body: ComparisonCreate, session: SessionDep, principal: PrincipalDep, settings: SettingsDep
) -> dict[str, Any]:
    """Queue the comparison of plan B against plan A (deltas are B - A); 422 for a plan
    compared with itself."""
    team = principal.team_id
    if body.plan_a_id == body.plan_b_id:
        raise ApiError(
            422,
            "invalid_comparison",
            f"plan_a_id and plan_b_id are both {body.plan_a_id}: compare two different plans",
            field="plan_b_id",
            plan_id=body.plan_a_id,
        )
    owned(session, Plan, team, body.plan_a_id, "plan")
    owned(session, Plan, team, body.plan_b_id, "plan")
    job = ledger.enqueue(session, settings, team, "compare", {})
    comp = Comparison(
        team_id=team, plan_a_id=body.plan_a_id, plan_b_id=body.plan_b_id, job_id=job.id
    )
    session.add(comp)
    session.flush()
    job.payload = {"comparison_id": comp.id}
    session.commit()
    return {"id": comp.id, "job_id": job.id, "status": job.status}


@router.get("", response_model=list[ComparisonOut], responses=errors(401, 422))
def list_comparisons(session: SessionDep, principal: PrincipalDep) -> list[dict[str, Any]]:
    """The team's comparisons, newest first."""
    rows = session.scalars(
        select(Comparison)
        .where(Comparison.team_id == principal.team_id)
        .order_by(Comparison.id.desc())
    )
    return [_out(session, comp) for comp in rows]


@router.get("/{comparison_id}", response_model=ComparisonOut, responses=errors(401, 404, 422))
def get_comparison(
    comparison_id: PathId, session: SessionDep, principal: PrincipalDep
) -> dict[str, Any]:
    """A comparison with its job's state and, once done, the result."""
    comp = owned(session, Comparison, principal.team_id, comparison_id, "comparison")
    return _out(session, comp)
