"""CI checks: `POST /api/checks` queues the plan of a model under a strategy version on a
cluster, with budgets; `GET /api/checks/{id}` answers, once the plan is built, the verdict
of `shardlab.check` (every budget with its limit, the plan's figure, pass or fail) and its
Markdown for a pull-request comment; `GET /api/checks/{id}/junit` the JUnit XML report.

The model and strategy are stored ones (`model_id`, `strategy_id`) or given inline (`model`: a
preset with overrides, `graph`: a graph document, `strategy`: mesh, templates, annotations,
options), so a CI job of a fresh team needs only a token: what is given inline reuses the
team's identical model or strategy version, or is stored in the check's one commit.

The check's job is its plan's; the verdict is judged when asked, from the stored summaries
of the plan and of its baseline, so it never disagrees with them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request, Response
from sqlalchemy import select
from sqlalchemy.orm import Session, defer, sessionmaker

from backend import ledger
from backend.baselines import baseline_of
from backend.blobs import unpack
from backend.deps import PrincipalDep, SessionDep, SettingsDep
from backend.errors import STATUS_BY_CODE, ApiError, not_found
from backend.orm import Baseline, Check, Model, Plan, Strategy, Verification
from backend.planning import (
    check_strategy,
    engine_strategy,
    model_graph,
    plan_deadline,
    queue_plan,
)
from backend.routers.clusters import resolve_cluster
from backend.routers.models import (
    BuiltModel,
    add_new_model,
    commit_or_conflict,
    document_blob,
    find_document_model,
    find_preset_model,
    new_document_model,
    new_preset_model,
)
from backend.routers.plans import built_plan, job_fields, job_of, owned
from backend.routers.strategies import latest_or_new_version
from backend.schemas.common import PathId, errors
from backend.schemas.jobs import CheckCreate, CheckCreated, CheckOut, VerifyOn
from backend.schemas.resources import StrategyUpdate
from backend.settings import Settings
from backend.verifying import queue_verification, run_on
from shardlab.check import Budgets, CheckError, Verdict, check_verifiable, figures, judge
from shardlab.errors import ShardlabError
from shardlab.graph_json import graph_from_json
from shardlab.ir import Graph
from shardlab.runtime.twin import has_twin
from shardlab.strategy import Strategy as EngineStrategy

router = APIRouter(prefix="/api/checks", tags=["checks"])


@router.post(
    "", status_code=202, response_model=CheckCreated, responses=errors(401, 404, 409, 413, 422)
)
def create_check(
    body: CheckCreate,
    request: Request,
    session: SessionDep,
    principal: PrincipalDep,
    settings: SettingsDep,
) -> dict[str, Any]:
    """Queue a check: its plan is built by a job, then judged against `budgets`. The model
    and strategy are stored ones or given inline (stored with the check, or reused). 4xx at
    once, storing nothing, for a model or strategy given twice or not at all, a bad preset,
    graph or strategy, a mesh larger than the cluster, annotations that do not fit, a
    regression budget without a baseline, a baseline that is not a built plan of the team,
    or `verify` on a model too large to verify. The model is built and the engine checks the
    plan (seconds for a large model) on what short read sessions loaded, before this
    request's write transaction (on SQLite, the database's write lock) begins; everything is
    then committed at once."""
    team = principal.team_id
    _one_of(body, ("model_id", "model", "graph"), "model")
    _one_of(body, ("strategy_id", "strategy"), "strategy")
    spec, chosen = _checked(request.app.state.sessions, team, body, settings)
    model = _model(session, team, body, chosen, principal.user_id)
    strategy = _strategy(session, team, body)
    baseline_plan_id = _baseline_plan(session, team, body, model)
    plan, job = queue_plan(session, settings, model, strategy, body.cluster, spec,
                           author_id=principal.user_id)  # fmt: skip
    check = Check(team_id=team, plan_id=plan.id, baseline_plan_id=baseline_plan_id,
                  budgets=body.budgets.model_dump())  # fmt: skip
    if body.budgets.verify:
        check.verification_id = _queue_verification(
            session, settings, model, strategy, plan, body.verify_on or VerifyOn()
        )
    session.add(check)
    commit_or_conflict(session, "a concurrent request stored the same model or strategy; "
                       "retry the check")  # fmt: skip
    return {"id": check.id, "job_id": job.id, "status": job.status, "model_id": model.id,
            "strategy_id": strategy.id}  # fmt: skip


# -- before the write transaction: what the check names, checked by the engine ---------------


@dataclass(frozen=True)
class _Chosen:
    """The model a check names, resolved before its write transaction: its graph (what the
    engine checks) and either the stored model's id or a new model built in memory (with the
    name it is stored under unless taken)."""

    graph: Graph
    stored_id: int | None = None
    new: tuple[str, BuiltModel] | None = None


def _checked(
    sessions: sessionmaker[Session], team: int, body: CheckCreate, settings: Settings
) -> tuple[dict[str, Any] | None, _Chosen]:
    """The check's budgets, cluster, model and strategy, resolved in short read sessions and
    checked by the engine (`check_strategy`) outside any transaction, in the order a
    refusal names them: budgets, cluster, model, strategy. The cluster's spec and the model."""
    with sessions() as reading:
        _check_budgets(reading, team, body)
        with _about("cluster"):
            spec = resolve_cluster(reading, team, body.cluster)
        deadline = plan_deadline(reading, settings, team)
    chosen = _chosen_model(sessions, team, body, settings.max_graph_ops)
    with sessions() as reading:
        strategy = _engine_strategy(reading, team, body)
    with _about("strategy"):  # a mesh larger than the cluster, annotations that do not fit
        check_strategy(chosen.graph, strategy, spec, deadline)
    return spec, chosen


def _chosen_model(
    sessions: sessionmaker[Session], team: int, body: CheckCreate, limit: int
) -> _Chosen:
    """The stored model `model_id`, or the team's model of `model` (a preset) or `graph`,
    found or built in memory (nothing stored)."""
    if body.model_id is not None:
        with sessions() as reading:
            row: Model = owned(reading, Model, team, body.model_id, "model")
        return _Chosen(model_graph(row), stored_id=row.id)
    if body.model is not None:
        with _about("model"):
            return _chosen_preset(sessions, team, body.model.preset, body.model.overrides, limit)
    with _about("graph"):
        graph, blob = document_blob(body.graph, limit)
        with sessions() as reading:
            found = find_document_model(reading, team, blob)
        if found is not None:
            return _Chosen(graph, stored_id=found.id)
        return _Chosen(graph, new=new_document_model(graph, blob))


def _chosen_preset(
    sessions: sessionmaker[Session], team: int, preset: str, overrides: dict[str, Any], limit: int
) -> _Chosen:
    """The team's model of `preset` with `overrides` (its stored graph), else a new one."""
    with sessions() as reading:
        found = find_preset_model(reading, team, preset, overrides)
        blob = found.graph_blob if found is not None else None  # loads the deferred blob
    if found is not None and blob is not None:
        return _Chosen(graph_from_json(unpack(blob)), stored_id=found.id)
    name, model = new_preset_model(preset, overrides, limit)
    return _Chosen(model.graph, new=(name, model))


def _engine_strategy(reading: Session, team: int, body: CheckCreate) -> EngineStrategy:
    """The engine's strategy of the stored version `strategy_id` or of the inline `strategy`;
    its errors name `strategy`."""
    if body.strategy is None:
        assert body.strategy_id is not None  # `_one_of`
        row: Strategy = owned(reading, Strategy, team, body.strategy_id, "strategy")
        definition = (row.mesh, row.templates, row.annotations, row.options)
    else:
        given = body.strategy
        definition = (given.mesh, given.templates, given.annotations, given.options)
    with _about("strategy"):
        return engine_strategy(*definition)


# -- what a check names: model, strategy, budgets --------------------------------------------


def _one_of(body: CheckCreate, fields: tuple[str, ...], field: str) -> None:
    """422 naming `field` unless exactly one of `fields` is given."""
    given = [name for name in fields if getattr(body, name) is not None]
    if len(given) != 1:
        which = " and ".join(given) if given else "none"
        raise ApiError(422, "invalid_check", f"{field}: give exactly one of "
                       f"{', '.join(fields)} (got {which})", field=field,
                       given=given)  # fmt: skip


def _check_budgets(session: Session, team: int, body: CheckCreate) -> None:
    """422 for a baseline given twice and for a baseline plan built without a cluster;
    404/409 for a baseline plan that is not a built plan of the team."""
    if body.baseline_plan_id is not None and body.baseline is not None:
        raise ApiError(422, "invalid_check", "baseline: give baseline_plan_id or baseline (a "
                       "name), not both", field="baseline")  # fmt: skip
    if body.verify_on is not None and not body.budgets.verify:
        raise ApiError(422, "invalid_check", "verify_on: says where the verification runs, "
                       "but budgets.verify is false", field="verify_on")  # fmt: skip
    if body.baseline_plan_id is not None:
        _costed_baseline(session, team, body.baseline_plan_id, "baseline_plan_id")


def _costed_baseline(session: Session, team: int, plan_id: int, field: str) -> Plan:
    baseline = built_plan(session, team, plan_id)
    try:
        figures(baseline.summary or {})
    except CheckError:
        raise ApiError(422, "invalid_check", f"baseline plan {baseline.id} was built without "
                       "a cluster: it has no step to compare with",
                       field=field) from None  # fmt: skip
    return baseline


def _baseline_plan(session: Session, team: int, body: CheckCreate, model: Model) -> int | None:
    """The plan `max_regression_pct` compares with: `baseline_plan_id`, the baseline named
    `baseline`, or (for a regression budget) the baseline of the model on the cluster. 422
    naming `baseline` for an unknown name, or a regression budget with no baseline at all."""
    if body.baseline_plan_id is not None:
        return body.baseline_plan_id
    if body.baseline is not None:
        row = session.scalar(
            select(Baseline).where(Baseline.team_id == team, Baseline.name == body.baseline)
        )
        if row is None:
            names = session.scalars(
                select(Baseline.name).where(Baseline.team_id == team).order_by(Baseline.name)
            ).all()
            raise ApiError(422, "invalid_check", f"baseline: the team has no baseline named "
                           f"{body.baseline!r} (it has: {', '.join(names) or 'none'})",
                           field="baseline", baseline=body.baseline)  # fmt: skip
        return row.plan_id
    if body.budgets.max_regression_pct is None:
        return None
    row = baseline_of(session, team, model.id, body.cluster)
    if row is None:
        raise ApiError(422, "invalid_check", "budgets.max_regression_pct needs a baseline: "
                       "baseline_plan_id, baseline (a name), or a baseline of model "
                       f"{model.name!r} on {body.cluster!r} (there is none)",
                       field="baseline")  # fmt: skip
    return row.plan_id


def _queue_verification(
    session: Session,
    settings: Settings,
    model: Model,
    strategy: Strategy,
    plan: Plan,
    verify_on: VerifyOn,
) -> int:
    """Queue the verification `budgets.verify` reads, where `verify_on` says (422 naming
    `verify` for a model too large to verify that has no scaled-down twin,
    `verify_on.<field>` for a run that cannot be: `backend/verifying.py`); its job builds
    the plan itself, so it need not wait for the plan's."""
    engine = engine_strategy(strategy.mesh, strategy.templates, strategy.annotations,
                             strategy.options)  # fmt: skip
    if not has_twin(model.preset):  # a transformer preset too large verifies as its twin
        with _about("budgets"):
            check_verifiable(int(model.summary.get("params", 0)), engine.mesh.size)
    run = run_on(engine, verify_on, prefix="verify_on.")
    verification = queue_verification(session, settings, plan.team_id, plan.id, "float64", run)
    return verification.id


def _model(
    session: Session, team: int, body: CheckCreate, chosen: _Chosen, author_id: int | None
) -> Model:
    """The chosen model's row in the write transaction: the stored one (404 if deleted
    meanwhile), else the team's identical model stored meanwhile, else the new model added
    (flushed, not committed; built already, not built again)."""
    if chosen.stored_id is not None:
        row = session.get(Model, chosen.stored_id, options=[defer(Model.graph_blob)])
        if row is None:
            raise not_found("model", chosen.stored_id)
        return row
    assert chosen.new is not None
    name, model = chosen.new
    with _about("model" if body.model is not None else "graph"):
        if body.model is not None:
            found = find_preset_model(session, team, body.model.preset, body.model.overrides)
        else:
            found = find_document_model(session, team, model.blob)
        return found or add_new_model(session, team, name, model, author_id)


def _strategy(session: Session, team: int, body: CheckCreate) -> Strategy:
    """The stored version `strategy_id`, or the version of the inline `strategy`: the latest
    of its name when identical, else the next one (added, flushed, not committed)."""
    if body.strategy is None:
        assert body.strategy_id is not None  # `_one_of`
        row: Strategy = owned(session, Strategy, team, body.strategy_id, "strategy")
        return row
    given = body.strategy
    name = given.name or _strategy_name(given.mesh, given.templates)
    definition = StrategyUpdate.model_validate(given.model_dump(exclude={"name"}))
    with _about("strategy"):
        return latest_or_new_version(session, team, name, definition)


def _strategy_name(mesh: str, templates: list[str]) -> str:
    """A readable name for an unnamed inline strategy: 'dp=8,tp=8 dp+megatron_tp'."""
    return " ".join(part for part in (mesh.strip(), "+".join(templates)) if part)[:200]


@contextmanager
def _about(field: str) -> Iterator[None]:
    """Errors of what `field` gave (an ApiError or the engine's) name it: the message starts
    with `field: ` and the detail holds `field`."""
    try:
        yield
    except ApiError as exc:
        raise _named(field, exc.status, exc.code, exc.message, exc.detail) from None
    except ShardlabError as exc:
        status = STATUS_BY_CODE.get(exc.code, 422)
        raise _named(field, status, exc.code, exc.message, exc.detail) from None


def _named(field: str, status: int, code: str, message: str, detail: dict[str, Any]) -> ApiError:
    error = ApiError(status, code, f"{field}: {message}")
    error.detail = {**detail, "field": field}
    return error


@router.get("/{check_id}", response_model=CheckOut, responses=errors(401, 404, 422))
def get_check(check_id: PathId, session: SessionDep, principal: PrincipalDep) -> dict[str, Any]:
    """A check with its jobs' state (the plan's and, with verify, the verification's) and,
    once they are done, the verdict."""
    check, plan, state, report = _owned_check(session, principal.team_id, check_id)
    done = state["status"] == "succeeded"
    verdict = _verdict(session, check, plan, report) if done else None
    return {
        "id": check.id,
        "plan_id": plan.id,
        "model_id": plan.model_id,
        "strategy_id": plan.strategy_id,
        "baseline_plan_id": check.baseline_plan_id,
        "budgets": check.budgets,
        "job_id": plan.job_id,
        "verification_id": check.verification_id,
        **state,
        "passed": verdict.passed if verdict else None,
        "verdict": verdict.to_json() if verdict else None,
        "markdown": verdict.markdown(link=_plan_url(plan)) if verdict else None,
        "plan_url": _plan_url(plan),
        "created_at": ledger.iso(check.created_at),
    }


@router.get("/{check_id}/junit", responses=errors(401, 404, 409, 422))
def get_junit(check_id: PathId, session: SessionDep, principal: PrincipalDep) -> Response:
    """The verdict as a JUnit XML report (409 until the check's jobs are done)."""
    check, plan, state, report = _owned_check(session, principal.team_id, check_id)
    if state["status"] != "succeeded":
        raise ApiError(409, "not_ready", f"check {check.id} is {state['status']}",
                       job_status=state["status"])  # fmt: skip
    return Response(_verdict(session, check, plan, report).junit(), media_type="application/xml")


def _owned_check(
    session: Session, team_id: int, check_id: int
) -> tuple[Check, Plan, dict[str, Any], dict[str, Any] | None]:
    """The team's check (404 otherwise), its plan, the state of its jobs as one (the first
    that failed, else the first still queued or running, else done; the mean progress), and
    its verification report once there is one."""
    check: Check = owned(session, Check, team_id, check_id, "check")
    plan = session.get(Plan, check.plan_id)
    assert plan is not None  # the plan's deletion deletes its checks
    jobs = [job_of(session, plan.job_id)]
    verification = (
        session.get(Verification, check.verification_id) if check.verification_id else None
    )
    if verification is not None:
        jobs.append(job_of(session, verification.job_id))
    failed = next((j for j in jobs if j.status in ("failed", "cancelled", "timed_out")), None)
    busy = next((j for j in jobs if j.status in ("queued", "running")), None)
    state = job_fields(failed or busy or jobs[0])
    state["progress"] = sum(j.progress for j in jobs) / len(jobs)
    return check, plan, state, verification.report if verification is not None else None


def _verdict(session: Session, check: Check, plan: Plan, report: dict[str, Any] | None) -> Verdict:
    """The check judged now; a baseline plan deleted since fails `max_regression_pct` saying
    so (the check stays readable)."""
    baseline = session.get(Plan, check.baseline_plan_id) if check.baseline_plan_id else None
    gone = None
    if baseline is None:
        gone = "no baseline: its plan was deleted after the check was made"
    try:
        return judge(plan.summary or {}, Budgets(**check.budgets),
                     baseline.summary if baseline is not None else None, report,
                     baseline_gone=gone)  # fmt: skip
    except CheckError as exc:
        raise ApiError(422, exc.code, exc.message, **exc.detail) from None


def _plan_url(plan: Plan) -> str:
    return f"/#/plans/{plan.id}"
