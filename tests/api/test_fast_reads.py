"""The fast lane of `GET /api/plans/{id}` (`backend/fast_reads.py`) answers a plan as the
full path does and leaves every other answer to it: 401, another team's 404, a plan a
baseline concerns, a query string, a full lane; a request counts once against the team's
rate whichever path answers it; the security headers are on its answers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from backend.app import create_app
from backend.fast_reads import FastPlanReads
from backend.settings import Settings
from tests.api.conftest import assert_error, token_for
from tests.api.test_plans import run_jobs, setup_plan


@pytest.fixture
def answered(monkeypatch: pytest.MonkeyPatch) -> list[bytes | None]:
    """What the lane answered, per request it looked at (None: left to the full path)."""
    seen: list[bytes | None] = []
    original = FastPlanReads._answer

    def spy(self: FastPlanReads, scope: Any, plan_id: int) -> bytes | None:
        body = original(self, scope, plan_id)
        seen.append(body)
        return body

    monkeypatch.setattr(FastPlanReads, "_answer", spy)
    return seen


def test_the_lane_answers_a_plan_as_the_full_path_does(
    client: TestClient, settings: Settings, answered: list[bytes | None]
) -> None:
    plan = setup_plan(client, "h100-sxm-1x4")
    run_jobs(settings)
    fast = client.get(f"/api/plans/{plan}")
    assert answered and answered[-1] is not None  # the lane answered it
    full = client.get(f"/api/plans/{plan}?via=full")  # a query string: the full path
    assert len(answered) == 1
    assert fast.status_code == full.status_code == 200
    assert fast.json() == full.json() and fast.json()["summary"]["cost"]["step_time_s"] > 0
    assert fast.headers["content-type"] == "application/json"
    for header in ("content-security-policy", "x-frame-options", "x-content-type-options"):
        assert fast.headers[header] == full.headers[header]


def test_what_the_lane_is_not_sure_of_the_full_path_answers(
    client: TestClient,
    other_client: TestClient,
    user_client: Any,
    settings: Settings,
    answered: list[bytes | None],
) -> None:
    plan = setup_plan(client, "h100-sxm-1x4")
    assert_error(other_client.get(f"/api/plans/{plan}"), 404, "not_found", str(plan))
    anonymous = TestClient(client.app)
    assert_error(anonymous.get(f"/api/plans/{plan}"), 401, "unauthorized")
    assert_error(client.get("/api/plans/0"), 422, "invalid_request")
    assert_error(client.get("/api/plans/007"), 404, "not_found")  # not a plain id
    assert answered == [None, None]  # the other team's and the anonymous read reached it
    run_jobs(settings)  # a baseline is a built plan
    bob = user_client("alpha", "bob")
    bob.post(f"/api/plans/{plan}/review/decision", json={"decision": "approve"})
    assert bob.post("/api/baselines", json={"plan_id": plan}).status_code == 201
    got = client.get(f"/api/plans/{plan}")
    assert got.status_code == 200 and got.json()["baseline_of"] == ["tiny on h100-sxm-1x4"]
    assert answered[-1] is None  # a baseline concerns it: the full path compares


def test_a_request_counts_once_whichever_path_answers(
    client: TestClient, settings: Settings, answered: list[bytes | None]
) -> None:
    plan = setup_plan(client, "h100-sxm-1x4")  # by team alpha; beta is rate-limited below
    app = create_app(Settings.from_env({
        "SHARDLAB_DATA_DIR": str(settings.data_dir), "SHARDLAB_DATABASE_URL": settings.database_url,
        "SHARDLAB_TEAM_REQUESTS_PER_MINUTE": "4"}))  # fmt: skip
    try:
        with TestClient(app) as beta:
            beta.headers["Authorization"] = f"Bearer {token_for(settings, 'beta')}"
            own = beta.post("/api/models", json={"name": "m", "preset": "mlp_demo"})
            assert own.status_code == 201  # 1 request
            for _ in range(3):  # the lane passes each on (another team's plan): 404, once each
                assert beta.get(f"/api/plans/{plan}").status_code == 404
            assert_error(beta.get(f"/api/plans/{plan}"), 429, "rate_limited")  # the 5th
    finally:
        app.state.engine.dispose()


def test_a_full_lane_leaves_reads_to_the_full_path(
    db_url: str, tmp_path: Path, answered: list[bytes | None]
) -> None:
    env = {"SHARDLAB_DATA_DIR": str(tmp_path / "data"), "SHARDLAB_DATABASE_URL": db_url,
           "SHARDLAB_FAST_READ_SLOTS": "0"}  # fmt: skip
    settings = Settings.from_env(env)
    app = create_app(settings)
    try:
        with TestClient(app) as client:
            client.headers["Authorization"] = f"Bearer {token_for(settings, 'alpha')}"
            plan = setup_plan(client, "h100-sxm-1x4")
            got = client.get(f"/api/plans/{plan}")
            assert got.status_code == 200 and got.json()["id"] == plan
            assert answered == []  # no slot: the lane never looked
    finally:
        app.state.engine.dispose()
