"""Baselines as data: the approved plan a team measures new plans of a model on a cluster
against, and the comparison a plan shows with it.

A new version of a strategy is planned against every baseline an earlier version of it made,
on that baseline's model and cluster: checked by the engine before the edit's write
transaction (`check_against_baselines`), then queued in it (`plan_against_baselines`).

A baseline has a name; the default one is its model's and cluster's (`default_name`), so
"the baseline of llama3-8b on h100-sxm-8x8" needs no name. A plan's comparison is judged when
asked, from the two stored summaries (as checks are), so it never disagrees with them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, defer, sessionmaker

from backend.errors import ApiError
from backend.ledger import iso
from backend.orm import Baseline, Job, Model, Plan
from backend.orm import Strategy as StrategyRow
from backend.planning import check_strategy, model_graph, plan_deadline, queue_plan
from backend.routers.clusters import resolve_cluster
from backend.settings import Settings
from shardlab.check import CheckError, figures
from shardlab.errors import ShardlabError
from shardlab.strategy import Strategy


def default_name(model: Model, cluster: str) -> str:
    """The name of the baseline of `model` on `cluster` when the team picks none."""
    return f"{model.name} on {cluster}"


def baseline_for(session: Session, plan: Plan) -> Baseline | None:
    """The baseline a plan is compared with: its model's on its cluster, never itself."""
    if plan.cluster is None:
        return None
    return baseline_of(session, plan.team_id, plan.model_id, plan.cluster, besides=plan.id)


def baseline_of(
    session: Session, team_id: int, model_id: int, cluster: str, besides: int | None = None
) -> Baseline | None:
    """The team's baseline of a model on a cluster (the default-named one first, then the
    most recently set), other than plan `besides`; None if there is none."""
    query = select(Baseline).where(
        Baseline.team_id == team_id, Baseline.model_id == model_id, Baseline.cluster == cluster
    )
    if besides is not None:
        query = query.where(Baseline.plan_id != besides)
    rows = session.scalars(query.order_by(Baseline.updated_at.desc(), Baseline.id.desc())).all()
    if not rows:
        return None
    model = session.get(Model, model_id)
    default = default_name(model, cluster) if model else None
    return next((b for b in rows if b.name == default), rows[0])


def baseline_names(session: Session, plan: Plan) -> list[str]:
    """The names of the baselines `plan` is."""
    query = select(Baseline.name).where(Baseline.plan_id == plan.id).order_by(Baseline.name)
    return list(session.scalars(query))


def comparison(session: Session, plan: Plan, summary: dict[str, Any] | None) -> dict[str, Any]:
    """The plan against its baseline: step, MFU, peak memory and tokens/s of both with the
    change in percent (positive step change = slower); `{}` when there is no baseline, and
    only the baseline's identity while either plan lacks a cost."""
    baseline = baseline_for(session, plan)
    if baseline is None:
        return {}
    out: dict[str, Any] = {
        "baseline_id": baseline.id,
        "name": baseline.name,
        "plan_id": baseline.plan_id,
        "set_at": iso(baseline.updated_at),
    }
    reference = session.get(Plan, baseline.plan_id)
    job = session.get(Job, plan.job_id)
    if reference is None or summary is None or job is None or job.status != "succeeded":
        return out
    try:
        now, before = figures(summary), figures(reference.summary or {})
    except CheckError:
        return out
    rows = []
    for key, label, better in (
        ("step_time_s", "step time", "lower"),
        ("mfu", "MFU", "higher"),
        ("tokens_per_s", "tokens / s", "higher"),
        ("peak_memory_bytes", "peak memory / rank", "lower"),
    ):
        a, b = before.get(key), now.get(key)
        if not isinstance(a, int | float) or not isinstance(b, int | float):
            continue
        change = (b / a - 1.0) * 100.0 if a else 0.0
        worse = change > 0 if better == "lower" else change < 0
        rows.append({"figure": key, "label": label, "baseline": a, "plan": b,
                     "change_pct": change, "better": better,
                     "regression": bool(worse and abs(change) > 0.05)})  # fmt: skip
    out["figures"] = rows
    out["step_change_pct"] = next(
        (r["change_pct"] for r in rows if r["figure"] == "step_time_s"), None
    )
    return out


def baseline_json(baseline: Baseline, names: dict[int, str]) -> dict[str, Any]:
    return {
        "id": baseline.id,
        "name": baseline.name,
        "plan_id": baseline.plan_id,
        "model_id": baseline.model_id,
        "cluster": baseline.cluster,
        "set_by": names.get(baseline.set_by) if baseline.set_by else None,
        "created_at": iso(baseline.created_at),
        "updated_at": iso(baseline.updated_at),
    }


@dataclass(frozen=True)
class BaselineCheck:
    """A baseline a new strategy version is planned against, checked by the engine before
    the write transaction: its model's cluster spec where the version can plan the model
    there, else the reason it cannot (`error`)."""

    name: str
    plan_id: int
    model_id: int
    cluster: str
    spec: dict[str, Any] | None = None
    error: str | None = None


def check_against_baselines(
    sessions: sessionmaker[Session],
    settings: Settings,
    team_id: int,
    name: str,
    strategy: Strategy,
) -> list[BaselineCheck]:
    """Every team baseline planned with a version of strategy `name` (by baseline name),
    with the engine's check of `strategy` (the new version) on its model and cluster, once
    per model and cluster. What it reads comes from short read sessions; the engine checks
    (seconds for a large model) run outside any transaction, so an edit holds no write lock
    meanwhile."""
    with sessions() as reading:
        rows = [(b.name, b.plan_id, b.model_id, b.cluster)
                for b in _baselines_of(reading, team_id, name)]  # fmt: skip
        deadline = plan_deadline(reading, settings, team_id)
    checked: dict[tuple[int, str], tuple[dict[str, Any] | None, str | None]] = {}
    out = []
    for baseline, plan_id, model_id, cluster in rows:
        if (model_id, cluster) not in checked:
            checked[model_id, cluster] = _check_on(
                sessions, team_id, model_id, cluster, strategy, deadline
            )
        spec, error = checked[model_id, cluster]
        out.append(BaselineCheck(baseline, plan_id, model_id, cluster, spec, error))
    return out


def _baselines_of(session: Session, team_id: int, name: str) -> list[Baseline]:
    """The team's baselines whose plan was made with a version of strategy `name`."""
    return list(
        session.scalars(
            select(Baseline)
            .join(Plan, Plan.id == Baseline.plan_id)
            .join(StrategyRow, StrategyRow.id == Plan.strategy_id)
            .where(Baseline.team_id == team_id, StrategyRow.name == name)
            .order_by(Baseline.name)
        )
    )


def _check_on(
    sessions: sessionmaker[Session],
    team_id: int,
    model_id: int,
    cluster: str,
    strategy: Strategy,
    deadline_s: float,
) -> tuple[dict[str, Any] | None, str | None]:
    """(the cluster's spec, None) where `strategy` can plan the model on `cluster`, else
    (None, the reason): annotations that no longer fit, a mesh larger than the cluster."""
    try:
        with sessions() as reading:
            spec = resolve_cluster(reading, team_id, cluster)
            model = reading.get(Model, model_id)
        assert model is not None  # deleting a model deletes its baselines
        check_strategy(model_graph(model), strategy, spec, deadline_s)
    except (ApiError, ShardlabError) as exc:
        return None, exc.message
    return spec, None


def plan_against_baselines(
    session: Session,
    settings: Settings,
    checks: list[BaselineCheck],
    strategy: StrategyRow,
    author_id: int | None,
) -> list[dict[str, Any]]:
    """Queue the plan of `strategy` (the new version, `checks` of it made before this
    transaction) on the model and cluster of every checked baseline, once per model and
    cluster (not committed). A baseline the version cannot plan gets its reason instead of
    a plan; one whose model was deleted meanwhile (with its baselines) is left out."""
    queued: dict[tuple[int, str], int] = {}
    out: list[dict[str, Any]] = []
    for check in checks:
        entry: dict[str, Any] = {"baseline": check.name, "baseline_plan_id": check.plan_id}
        if check.error is not None:
            out.append({**entry, "plan_id": None, "error": check.error})
            continue
        key = (check.model_id, check.cluster)
        if key not in queued:
            model = session.get(Model, check.model_id, options=[defer(Model.graph_blob)])
            if model is None:
                continue
            plan, job = queue_plan(session, settings, model, strategy, check.cluster,
                                   check.spec, author_id)  # fmt: skip
            queued[key] = plan.id
            entry["job_id"] = job.id
        out.append({**entry, "plan_id": queued[key]})
    return out
