"""The fast reads of plans (`GET /api/plans/{id}` and `GET /api/plans`), the service's most
frequent requests.

One Core query, built once, gathers each plan, its job's state, its model's, strategy's and
author's names and whether a baseline concerns it; the stored summary comes back as its
JSON text and is spliced into the answer unparsed. So a read costs one round trip and no
JSON work on summaries: a fifth of the ORM path's CPU. Where a baseline concerns one plan,
its comparison needs both summaries parsed, so the caller takes the full path
(`routers/plans._plan_out`) instead (lists show no comparison); tests hold both paths to
the same answer.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Text, bindparam, cast, exists, select
from sqlalchemy.orm import Session

from backend.ledger import iso
from backend.orm import Baseline, Job, Model, Plan, Strategy, User


def _columns() -> Any:
    """The plans with their job, names, and whether a baseline concerns each (the plan is
    one, or one exists for its model and cluster); filter and order it as needed."""
    concerned = exists().where(
        Baseline.team_id == Plan.team_id,
        (Baseline.plan_id == Plan.id)
        | ((Baseline.model_id == Plan.model_id) & (Baseline.cluster == Plan.cluster)),
    )
    return (
        select(
            Plan.id, Plan.model_id, Plan.strategy_id, Plan.cluster, Plan.job_id,
            Plan.review_state, Plan.created_at, cast(Plan.summary, Text).label("summary"),
            Job.status, Job.progress, Job.message, Job.error,
            Model.name.label("model"), Strategy.name.label("strategy"), Strategy.version,
            User.name.label("author"), concerned.label("concerned"),
        )
        .join(Job, Job.id == Plan.job_id)
        .join(Model, Model.id == Plan.model_id)
        .join(Strategy, Strategy.id == Plan.strategy_id)
        .outerjoin(User, User.id == Plan.author_id)
    )  # fmt: skip


#: every plan row a read needs; `PLANS.where(...)` for lists
PLANS = _columns()
#: one plan of one team
ONE_PLAN = PLANS.where(Plan.id == bindparam("plan_id"), Plan.team_id == bindparam("team_id"))


def fast_plan_json(session: Session, team_id: int, plan_id: int) -> bytes | None:
    """The plan's answer as JSON bytes, or None when the fast path does not apply (no such
    plan of the team, or a baseline concerns it: the full path answers both)."""
    params = {"plan_id": plan_id, "team_id": team_id}
    row = session.connection().execute(ONE_PLAN, params).first()
    if row is None or row.concerned:
        return None
    return _plan_json(row).encode()


def plans_json(session: Session, query: Any) -> bytes:
    """The answer of a list: the plans `query` (a filtered, ordered, paged `PLANS`) selects,
    as a JSON array (no baseline comparisons: a list does not show them)."""
    rows = session.connection().execute(query)
    return ("[" + ",".join(_plan_json(row) for row in rows) + "]").encode()


def _plan_json(row: Any) -> str:
    """One plan as `PlanOut` JSON, its stored summary spliced in as it is stored."""
    fields: dict[str, Any] = {
        "id": row.id,
        "model_id": row.model_id,
        "model": row.model,
        "strategy_id": row.strategy_id,
        "strategy": f"{row.strategy} v{row.version}",
        "cluster": row.cluster,
        "job_id": row.job_id,
        "status": row.status,
        "progress": row.progress,
        "message": row.message,
        "error": row.error,
        "author": row.author,
        "review_state": row.review_state,
        "baseline": None,
        "baseline_of": [],
        "created_at": iso(row.created_at),
    }
    built = row.status == "succeeded" and row.summary not in (None, "null")
    summary = row.summary if built else "null"
    head = json.dumps(fields, separators=(",", ":"))
    return f'{head[:-1]},"summary":{summary}}}'
