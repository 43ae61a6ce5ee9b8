"""Baselines: make an approved plan the team's reference for its model and cluster (or for a
name the team picks); list, read and remove them.

New plans of the same model and cluster show their comparison with the baseline
(`backend.baselines.comparison`, in every plan's `baseline` field), checks can name one, and
a new version of a baseline's strategy is planned against it automatically
(`backend/routers/strategies.py`).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Response
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from backend import reviews
from backend.baselines import baseline_json, default_name
from backend.deps import PrincipalDep, SessionDep
from backend.errors import ApiError
from backend.orm import Baseline, Model, Plan
from backend.pagination import Page
from backend.routers.plans import built_plan, owned
from backend.schemas.common import MAX_ROW_ID, PathId, errors
from backend.schemas.reviews import BaselineCreate, BaselineOut

router = APIRouter(prefix="/api/baselines", tags=["baselines"])


@router.post("", status_code=201, response_model=BaselineOut, responses=errors(401, 404, 409, 422))
def set_baseline(body: BaselineCreate, session: SessionDep, principal: PrincipalDep) -> Any:
    """Make an approved plan built on a cluster the baseline of its model and cluster (or of
    `name`); a baseline of that name moves to this plan. 422 for a plan not approved or
    without a cluster."""
    plan = built_plan(session, principal.team_id, body.plan_id)
    actor = reviews.reviewer_id(principal)
    if plan.review_state != "approved":
        state = plan.review_state.replace("_", " ")
        raise ApiError(422, "invalid_baseline", f"plan {plan.id} is {state}: only an approved "
                       "plan can be a baseline", field="plan_id",
                       review_state=plan.review_state)  # fmt: skip
    if plan.cluster is None:
        raise ApiError(422, "invalid_baseline", f"plan {plan.id} was planned without a cluster: "
                       "it has no step time to compare with", field="plan_id")  # fmt: skip
    model = session.get(Model, plan.model_id)
    assert model is not None
    name = body.name or default_name(model, plan.cluster)
    row = session.scalar(
        select(Baseline).where(Baseline.team_id == principal.team_id, Baseline.name == name)
    )
    previous = row.plan_id if row else None
    if row is None:
        row = Baseline(team_id=principal.team_id, name=name, plan_id=plan.id,
                       model_id=plan.model_id, cluster=plan.cluster, set_by=actor)  # fmt: skip
        session.add(row)
    else:
        row.plan_id, row.model_id, row.cluster = plan.id, plan.model_id, plan.cluster
        row.set_by, row.updated_at = actor, reviews.now()
    reviews.record(session, plan, actor, "baseline_set", name=name, replaced_plan_id=previous)
    try:
        session.commit()
    except IntegrityError:  # the same name set concurrently
        session.rollback()
        raise ApiError(409, "conflict", f"baseline {name!r} was just set by someone else; "
                       "try again", name=name) from None  # fmt: skip
    return baseline_json(row, reviews.user_names(session, [row.set_by]))


@router.get("", response_model=list[BaselineOut], responses=errors(401, 422))
def list_baselines(
    session: SessionDep,
    principal: PrincipalDep,
    page: Page,
    model_id: Annotated[
        int | None, Query(ge=1, le=MAX_ROW_ID, description="Only this model's.")
    ] = None,
    cluster: Annotated[str | None, Query(max_length=100)] = None,
) -> list[dict[str, Any]]:
    """The team's baselines by name, a page at a time."""
    query = select(Baseline).where(Baseline.team_id == principal.team_id)
    if model_id is not None:
        query = query.where(Baseline.model_id == model_id)
    if cluster is not None:
        query = query.where(Baseline.cluster == cluster)
    rows = page.rows(session, query.order_by(Baseline.name))
    names = reviews.user_names(session, [b.set_by for b in rows])
    return [baseline_json(b, names) for b in rows]


@router.get("/{baseline_id}", response_model=BaselineOut, responses=errors(401, 404, 422))
def get_baseline(baseline_id: PathId, session: SessionDep, principal: PrincipalDep) -> Any:
    """One baseline."""
    row: Baseline = owned(session, Baseline, principal.team_id, baseline_id, "baseline")
    return baseline_json(row, reviews.user_names(session, [row.set_by]))


@router.delete("/{baseline_id}", status_code=204, responses=errors(401, 403, 404, 422))
def delete_baseline(baseline_id: PathId, session: SessionDep, principal: PrincipalDep) -> Response:
    """Remove a baseline (its plan stays); only an admin or its plan's author may."""
    row: Baseline = owned(session, Baseline, principal.team_id, baseline_id, "baseline")
    plan = session.get(Plan, row.plan_id)
    assert plan is not None
    if not reviews.may_delete(principal, plan):
        raise ApiError(403, "forbidden", "only an admin or the plan's author may remove its "
                       "baseline", field="baseline_id")  # fmt: skip
    session.delete(row)
    reviews.record(session, plan, principal.user_id, "baseline_removed", name=row.name)
    session.commit()
    return Response(status_code=204)
