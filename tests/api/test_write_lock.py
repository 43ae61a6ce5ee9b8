"""Heavy checks run outside the write lock: while the engine checks a new plan (seconds for a
200,000-op model), SQLite's write lock is free, so other requests and the workers can write.
Checked by taking the write lock from another connection, with no wait, during the check."""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest
from fastapi.testclient import TestClient

from backend.routers import plans as plans_router
from backend.settings import Settings
from tests.api.test_plans import TINY


def test_the_engine_checks_a_plan_before_the_write_lock(
    client: TestClient, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not settings.database_url.startswith("sqlite"):
        pytest.skip("PostgreSQL has no database-wide write lock")
    path = settings.database_url.removeprefix("sqlite:///")
    model = client.post("/api/models", json={"name": "m", "preset": "llama3-8b",
                                             "overrides": TINY}).json()  # fmt: skip
    strategy = client.post("/api/strategies", json={"name": "s", "mesh": "dp=2",
                                                     "templates": ["dp"]}).json()  # fmt: skip
    checked = plans_router.check_plan
    free: list[bool] = []

    def check_while_probing(*args: Any) -> None:
        other = sqlite3.connect(path, timeout=0, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")  # fails at once if this request held the lock
            other.execute("ROLLBACK")
            free.append(True)
        finally:
            other.close()
        checked(*args)

    monkeypatch.setattr(plans_router, "check_plan", check_while_probing)
    made = client.post("/api/plans", json={"model_id": model["id"],
                                           "strategy_id": strategy["id"]})  # fmt: skip
    assert made.status_code == 202, made.text
    assert free == [True]
