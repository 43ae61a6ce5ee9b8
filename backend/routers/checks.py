"""CI checks: `POST /api/checks` queues the plan of a model under a strategy version on a
cluster, with budgets; `GET /api/checks/{id}` answers, once the plan is built, the verdict
of `shardlab.check` (every budget with its limit, the plan's figure, pass or fail) and its
Markdown for a pull-request comment; `GET /api/checks/{id}/junit` the JUnit XML report.

The check's job is its plan's; the verdict is judged when asked, from the stored summaries
of the plan and of its baseline, so it never disagrees with them.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response
from sqlalchemy.orm import Session

from backend import ledger
from backend.deps import PrincipalDep, SessionDep, SettingsDep
from backend.errors import ApiError
from backend.orm import Check, Job, Model, Plan, Strategy
from backend.routers.clusters import resolve_cluster
from backend.routers.plans import built_plan, check_plan, job_fields, job_of, owned
from backend.schemas.common import PathId, errors
from backend.schemas.jobs import CheckCreate, CheckOut, Created
from shardlab.check import Budgets, CheckError, Verdict, figures, judge

router = APIRouter(prefix="/api/checks", tags=["checks"])


@router.post("", status_code=202, response_model=Created, responses=errors(401, 404, 422))
def create_check(
    body: CheckCreate, session: SessionDep, principal: PrincipalDep, settings: SettingsDep
) -> dict[str, Any]:
    """Queue a check: its plan is built by a job, then judged against `budgets` (422 at once
    for a mesh larger than the cluster, a regression budget without a baseline, a baseline
    that is not a built plan of the team, or `verify`, which checks cannot do yet)."""
    team = principal.team_id
    budgets = body.budgets
    if budgets.verify:
        raise ApiError(422, "invalid_check", "budgets.verify: numeric verification is not "
                       "available in checks yet (POST /api/verifications)",
                       field="verify")  # fmt: skip
    if budgets.max_regression_pct is not None and body.baseline_plan_id is None:
        raise ApiError(422, "invalid_check", "budgets.max_regression_pct needs a "
                       "baseline_plan_id", field="baseline_plan_id")  # fmt: skip
    if body.baseline_plan_id is not None:
        baseline = built_plan(session, team, body.baseline_plan_id)
        try:
            figures(baseline.summary or {})
        except CheckError:
            raise ApiError(422, "invalid_check", f"baseline plan {baseline.id} was built without "
                           "a cluster: it has no step to compare with",
                           field="baseline_plan_id") from None  # fmt: skip
    model = owned(session, Model, team, body.model_id, "model")
    strategy = owned(session, Strategy, team, body.strategy_id, "strategy")
    spec = resolve_cluster(session, team, body.cluster)
    check_plan(model, strategy, spec)
    plan = Plan(team_id=team, model_id=model.id, strategy_id=strategy.id, cluster=body.cluster,
                job_id=0)  # fmt: skip
    job = ledger.enqueue(session, settings, team, "plan", {"cluster": spec})
    plan.job_id = job.id
    session.add(plan)
    session.flush()
    job.payload = {"plan_id": plan.id, "cluster": spec}
    check = Check(team_id=team, plan_id=plan.id, baseline_plan_id=body.baseline_plan_id,
                  budgets=budgets.model_dump(exclude={"verify"}))  # fmt: skip
    session.add(check)
    session.commit()
    return {"id": check.id, "job_id": job.id, "status": job.status}


@router.get("/{check_id}", response_model=CheckOut, responses=errors(401, 404, 422))
def get_check(check_id: PathId, session: SessionDep, principal: PrincipalDep) -> dict[str, Any]:
    """A check with its plan job's state and, once the plan is built, the verdict."""
    check, plan, job = _owned_check(session, principal.team_id, check_id)
    verdict = _verdict(session, check, plan) if job.status == "succeeded" else None
    return {
        "id": check.id,
        "plan_id": plan.id,
        "baseline_plan_id": check.baseline_plan_id,
        "budgets": check.budgets,
        "job_id": job.id,
        **job_fields(job),
        "passed": verdict.passed if verdict else None,
        "verdict": verdict.to_json() if verdict else None,
        "markdown": verdict.markdown(link=_plan_url(plan)) if verdict else None,
        "plan_url": _plan_url(plan),
        "created_at": ledger.iso(check.created_at),
    }


@router.get("/{check_id}/junit", responses=errors(401, 404, 409, 422))
def get_junit(check_id: PathId, session: SessionDep, principal: PrincipalDep) -> Response:
    """The verdict as a JUnit XML report (409 until the plan is built)."""
    check, plan, job = _owned_check(session, principal.team_id, check_id)
    if job.status != "succeeded":
        raise ApiError(409, "not_ready", f"check {check.id}'s plan is {job.status}",
                       job_status=job.status)  # fmt: skip
    return Response(_verdict(session, check, plan).junit(), media_type="application/xml")


def _owned_check(session: Session, team_id: int, check_id: int) -> tuple[Check, Plan, Job]:
    """The team's check (404 otherwise), its plan and the plan's job."""
    check: Check = owned(session, Check, team_id, check_id, "check")
    plan = session.get(Plan, check.plan_id)
    assert plan is not None  # the plan's deletion deletes its checks
    return check, plan, job_of(session, plan.job_id)


def _verdict(session: Session, check: Check, plan: Plan) -> Verdict:
    baseline = session.get(Plan, check.baseline_plan_id) if check.baseline_plan_id else None
    try:
        return judge(plan.summary or {}, Budgets(**check.budgets),
                     baseline.summary if baseline is not None else None)  # fmt: skip
    except CheckError as exc:
        raise ApiError(422, exc.code, exc.message, **exc.detail) from None


def _plan_url(plan: Plan) -> str:
    return f"/#/plans/{plan.id}"
