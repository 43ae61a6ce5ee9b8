"""The fast read of one plan (`backend/plan_read.py`) answers exactly what the full path
(`routers/plans._plan_out`) answers, queued or built, on SQLite and PostgreSQL; a plan a
baseline concerns takes the full path."""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient

from backend.orm import Plan
from backend.plan_read import fast_plan_json
from backend.routers.plans import _plan_out
from backend.settings import Settings
from tests.api.test_plans import run_jobs, setup_plan


def _both(app: FastAPI, team_id: int, plan_id: int) -> tuple[Any, dict[str, Any]]:
    with app.state.sessions() as session:
        fast = fast_plan_json(session, team_id, plan_id)
        plan = session.get(Plan, plan_id)
        assert plan is not None
        full = json.loads(json.dumps(_plan_out(session, plan, compare=True)))
    return (json.loads(fast) if fast is not None else None), full


def test_the_fast_read_is_the_full_read(
    app: FastAPI, client: TestClient, user_client: Any, settings: Settings
) -> None:
    plan = setup_plan(client, "h100-sxm-1x4")
    team = app.state.sessions().get(Plan, plan).team_id
    fast, full = _both(app, team, plan)
    assert fast == full and fast["status"] == "queued" and fast["summary"] is None
    run_jobs(settings)
    fast, full = _both(app, team, plan)
    assert fast == full and fast["summary"]["cost"]["step_time_s"] > 0
    assert client.get(f"/api/plans/{plan}").json() == full
    assert _both(app, team + 1, plan)[0] is None  # another team's: the full path's 404

    bob = user_client("alpha", "bob")
    bob.post(f"/api/plans/{plan}/review/decision", json={"decision": "approve"})
    assert bob.post("/api/baselines", json={"plan_id": plan}).status_code == 201
    fast, full = _both(app, team, plan)
    assert fast is None and full["baseline_of"] == ["tiny on h100-sxm-1x4"]
    assert client.get(f"/api/plans/{plan}").json()["baseline_of"] == ["tiny on h100-sxm-1x4"]


def test_the_fast_list_is_the_full_list(
    app: FastAPI, client: TestClient, settings: Settings
) -> None:
    plans = [setup_plan(client, "h100-sxm-1x4", name) for name in ("a", "b", "c")]
    run_jobs(settings)
    listed = client.get("/api/plans?limit=2")
    assert listed.headers["X-Total-Count"] == "3" and 'rel="next"' in listed.headers["Link"]
    with app.state.sessions() as session:
        full = [json.loads(json.dumps(_plan_out(session, session.get(Plan, i))))
                for i in sorted(plans, reverse=True)]  # fmt: skip
    assert listed.json() == full[:2]
    assert client.get("/api/plans?limit=2&offset=2").json() == full[2:]
