"""Demo data: `shardlab serve --demo` seeds models, strategies and plans the worker builds."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import select

from backend.auth import ensure_team
from backend.db import transaction
from backend.demo import DEMO_MODELS, DEMO_PLANS, DEMO_STRATEGIES, seed_demo
from backend.orm import Model, Plan, Strategy
from backend.planning import check_plan
from backend.routers.clusters import resolve_cluster
from backend.settings import Settings
from worker.main import Worker


def test_demo_is_seeded_once_and_its_first_plan_builds(
    app: FastAPI, client: TestClient, settings: Settings
) -> None:
    with transaction(app.state.sessions) as session:
        team_id = ensure_team(session, "alpha").id
    added = seed_demo(app.state.sessions, team_id, settings)
    assert len(added) == len(DEMO_MODELS) + len(DEMO_STRATEGIES) + len(DEMO_PLANS)
    assert seed_demo(app.state.sessions, team_id, settings) == []

    plans = client.get("/api/plans").json()
    assert len(plans) == len(DEMO_PLANS) and {p["status"] for p in plans} == {"queued"}
    first = min(plans, key=lambda p: p["id"])
    worker = Worker(settings, "demo-test")
    try:
        claimed = worker.run_one()
        assert claimed is not None and claimed.id == first["job_id"]
    finally:
        worker.close()
    built = client.get(f"/api/plans/{first['id']}").json()
    assert built["status"] == "succeeded", built
    assert built["cluster"] == DEMO_PLANS[0].cluster
    assert built["summary"]["mesh"] == "dp=2,tp=2" and built["summary"]["cost"]["step_time_s"] > 0


def test_every_demo_plan_passes_the_checks_of_post_plans(app: FastAPI, settings: Settings) -> None:
    """The demo queues its plans without POST /api/plans: they must pass its checks (a
    template that does not divide a dim would only fail in the worker)."""
    with transaction(app.state.sessions) as session:
        team_id = ensure_team(session, "alpha").id
    seed_demo(app.state.sessions, team_id, settings)
    with transaction(app.state.sessions) as session:
        plans = session.scalars(select(Plan)).all()
        assert len(plans) == len(DEMO_PLANS)
        for plan in plans:
            model = session.get(Model, plan.model_id)
            strategy = session.get(Strategy, plan.strategy_id)
            assert model is not None and strategy is not None and plan.cluster is not None
            check_plan(model, strategy, resolve_cluster(session, team_id, plan.cluster))
