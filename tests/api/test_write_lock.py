"""Heavy checks run outside the write lock: while the engine checks a new plan (seconds for a
200,000-op model), SQLite's write lock is free, so other requests and the workers can write.
Checked by taking the write lock from another connection, with no wait, during the check;
likewise for a CI check (its inline model built, its plan checked), a strategy edit (checked
against its baselines) and a new model (packed and summarized)."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import pytest
from fastapi.testclient import TestClient

from backend import planning
from backend.routers import models as models_router
from backend.routers import plans as plans_router
from backend.settings import Settings
from shardlab.graph_json import graph_to_json
from shardlab.models import build_model
from tests.api.test_plans import TINY, run_jobs, setup_plan


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


# -- the same probe around the other heavy work: checks, strategy edits, new models -----------


def _sqlite_path(settings: Settings) -> str:
    """The test database's file; skips the test on PostgreSQL (no database-wide lock)."""
    if not settings.database_url.startswith("sqlite"):
        pytest.skip("PostgreSQL has no database-wide write lock")
    return settings.database_url.removeprefix("sqlite:///")


def _lock_is_free(path: str) -> bool:
    """Whether another connection takes the write lock at once (no wait), then lets it go."""
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:  # "database is locked": a request holds it
        return False
    finally:
        other.close()


def _probing(monkeypatch: pytest.MonkeyPatch, module: Any, name: str, path: str) -> list[bool]:
    """Wrap `module.name` so that each call first probes the write lock; the probes' results
    (True: free) fill the list returned."""
    original = getattr(module, name)
    free: list[bool] = []

    def probed(*args: Any, **kwargs: Any) -> Any:
        free.append(_lock_is_free(path))
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, probed)
    return free


INLINE_MODELS = {
    "preset": {"model": {"preset": "llama3-8b", "overrides": TINY}},
    "graph": {"graph": graph_to_json(build_model("llama3-8b", TINY))},
}


@pytest.mark.parametrize("given", sorted(INLINE_MODELS))
def test_a_check_builds_its_inline_model_and_checks_the_plan_before_the_write_lock(
    client: TestClient, settings: Settings, monkeypatch: pytest.MonkeyPatch, given: str
) -> None:
    """A check given a preset or a graph document and an inline strategy builds and
    summarizes the model, and the engine checks the plan, with the write lock free; so does
    the same check again (the stored model and strategy reused)."""
    path = _sqlite_path(settings)
    summarized = _probing(monkeypatch, models_router, "_summary", path)
    checked = _probing(monkeypatch, planning, "resolve_annotations", path)
    body = {**INLINE_MODELS[given], "strategy": {"mesh": "dp=2", "templates": ["dp"]},
            "cluster": "h100-sxm-1x8"}  # fmt: skip
    first = client.post("/api/checks", json=body)
    assert first.status_code == 202, first.text
    again = client.post("/api/checks", json=body)
    assert again.status_code == 202, again.text
    assert again.json()["model_id"] == first.json()["model_id"]
    assert again.json()["strategy_id"] == first.json()["strategy_id"]
    assert summarized == [True] and checked == [True, True]


def test_a_check_of_stored_ids_checks_the_plan_before_the_write_lock(
    client: TestClient, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _sqlite_path(settings)
    model = client.post("/api/models", json={"name": "m", "preset": "llama3-8b",
                                             "overrides": TINY}).json()  # fmt: skip
    strategy = client.post("/api/strategies", json={"name": "s", "mesh": "dp=2",
                                                     "templates": ["dp"]}).json()  # fmt: skip
    checked = _probing(monkeypatch, planning, "resolve_annotations", path)
    made = client.post("/api/checks", json={"model_id": model["id"], "cluster": "h100-sxm-1x8",
                                            "strategy_id": strategy["id"]})  # fmt: skip
    assert made.status_code == 202, made.text
    assert (made.json()["model_id"], made.json()["strategy_id"]) == (model["id"], strategy["id"])
    assert checked == [True]


def test_a_new_strategy_version_is_checked_against_its_baselines_before_the_write_lock(
    user_client: Any, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Editing a strategy whose earlier version made a baseline: the engine checks the new
    version on the baseline's model and cluster with the write lock free, then queues it."""
    path = _sqlite_path(settings)
    ann, bob = user_client("alpha", "ann"), user_client("alpha", "bob")
    plan = setup_plan(ann, "h100-sxm-1x4", "prod")
    assert run_jobs(settings) == 1
    decided = bob.post(f"/api/plans/{plan}/review/decision", json={"decision": "approve"})
    assert decided.status_code == 200, decided.text
    assert bob.post("/api/baselines", json={"plan_id": plan}).status_code == 201
    strategy = ann.get(f"/api/plans/{plan}").json()["strategy_id"]
    checked = _probing(monkeypatch, planning, "resolve_annotations", path)
    edit = ann.put(f"/api/strategies/{strategy}", json={"mesh": "dp=4", "templates": ["dp"]})
    assert edit.status_code == 200, edit.text
    [queued] = edit.json()["baseline_plans"]
    assert queued["baseline_plan_id"] == plan and queued["plan_id"] is not None
    assert checked == [True]


UPLOADED = graph_to_json(build_model("llama3-8b", TINY))
NEW_MODELS = {
    "preset": ("/api/models", {"json": {"name": "m", "preset": "llama3-8b", "overrides": TINY}}),
    "graph": ("/api/models", {"json": {"name": "m", "graph": UPLOADED}}),
    "upload": ("/api/models/upload?name=m", {"content": json.dumps(UPLOADED)}),
}


@pytest.mark.parametrize("given", sorted(NEW_MODELS))
def test_a_new_model_is_packed_and_summarized_before_the_write_lock(
    client: TestClient, settings: Settings, monkeypatch: pytest.MonkeyPatch, given: str
) -> None:
    path = _sqlite_path(settings)
    packed = _probing(monkeypatch, models_router, "pack", path)
    summarized = _probing(monkeypatch, models_router, "_summary", path)
    url, request = NEW_MODELS[given]
    made = client.post(url, **request)
    assert made.status_code == 201, made.text
    assert packed == [True] and summarized == [True]
