"""The schedule of a pipelined plan (its timeline: slots by stage) and the ops of one unit.

Reads the `schedule` and `schedule_units` artifacts the worker stores for costed pipelined
plans (`shardlab.export.schedule_view`). A plan that is not pipelined answers 404 naming
its timeline instead; one planned without a cluster 404 (no cost); one not built yet 409.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path
from sqlalchemy.orm import Session

from backend.deps import PrincipalDep, SessionDep
from backend.errors import ApiError
from backend.orm import Plan
from backend.routers.plans import artifact, costed_plan
from backend.schemas.common import PathId, errors

router = APIRouter(prefix="/api/plans", tags=["plans"])

ChunkPath = Annotated[int, Path(ge=0, le=1_000_000, description="A global model chunk.")]
PhasePath = Annotated[Literal["F", "B"], Path(description="F (forward) or B (backward).")]


def _pipelined(session: Session, team_id: int, plan_id: int, kind: str) -> tuple[Plan, Any]:
    """The built, costed, pipelined plan and its `kind` artifact (module docstring)."""
    plan = costed_plan(session, team_id, plan_id, kind)
    if not (plan.summary or {}).get("pipeline"):
        raise ApiError(
            404,
            "not_found",
            f"plan {plan_id} is not pipelined (no mesh axis pp): its step is at "
            f"/api/plans/{plan_id}/timeline",
            resource=kind,
            plan_id=plan_id,
        )
    return plan, artifact(session, plan, kind)


@router.get("/{plan_id}/schedule", responses=errors(401, 404, 409, 422))
def get_schedule(plan_id: PathId, session: SessionDep, principal: PrincipalDep) -> dict[str, Any]:
    """A pipelined plan's step as schedule slots: per stage, columnar `phase`, `chunk`,
    `microbatch`, `start`, `end` (seconds) in the order the stage runs them, with its ranks,
    layers, busy time, end, tail (optimizer) and peak memory; and the distinct units
    (`chunk`, `phase`, `seconds`, `ops`), whose ops `/schedule/units/{chunk}/{phase}` lists."""
    _, data = _pipelined(session, principal.team_id, plan_id, "schedule")
    return data  # type: ignore[no-any-return]


@router.get("/{plan_id}/schedule/units/{chunk}/{phase}", responses=errors(401, 404, 409, 422))
def get_unit(
    plan_id: PathId, chunk: ChunkPath, phase: PhasePath, session: SessionDep,
    principal: PrincipalDep,
) -> dict[str, Any]:  # fmt: skip
    """The ops one unit runs (model chunk `chunk`, forward `F` or backward `B`, one
    micro-batch) with their simulated start and end inside the unit, columnar."""
    _, units = _pipelined(session, principal.team_id, plan_id, "schedule_units")
    unit = units.get(f"{chunk}:{phase}")
    if unit is None:
        raise ApiError(
            404,
            "not_found",
            f"plan {plan_id} has no unit {phase} of model chunk {chunk} (chunks 0.."
            f"{max((int(k.split(':')[0]) for k in units), default=0)})",
            chunk=chunk,
            phase=phase,
        )
    return unit  # type: ignore[no-any-return]
