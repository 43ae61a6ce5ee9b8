"""Measurements over REST: `POST /api/plans/{id}/measurements` queues a `measure` job that
only a worker with the devices claims, and refuses (422 naming the field, nothing stored) a
run that cannot be: `nproc` other than the mesh size, a `device` there is none of, a plan
without a cluster or a model too large to run (`backend/measuring.py`). The job's run itself
is `tests/worker/test_measure_job.py`."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from backend.db import make_engine, session_factory
from backend.orm import Artifact, Job
from backend.settings import Settings
from tests.api.conftest import assert_error
from tests.api.test_plans import TINY, run_jobs, setup_plan


@pytest.fixture
def factory(settings: Settings) -> Any:
    engine = make_engine(settings.database_url)
    yield session_factory(engine)
    engine.dispose()


def _counts(factory: sessionmaker[Session]) -> tuple[int, int]:
    with factory() as session:
        jobs = session.scalar(select(func.count()).select_from(Job)) or 0
        artifacts = session.scalar(select(func.count()).select_from(Artifact)) or 0
        return jobs, artifacts


def _plan(client: TestClient, name: str, overrides: dict[str, Any], cluster: str | None) -> int:
    """A plan of a llama with `overrides` under dp=2 (queued, not built)."""
    model = client.post("/api/models", json={"name": name, "preset": "llama3-8b",
                                             "overrides": overrides})  # fmt: skip
    assert model.status_code == 201, model.text
    strategy = client.post("/api/strategies", json={"name": name, "mesh": "dp=2",
                                                    "templates": ["dp"]}).json()  # fmt: skip
    body = {"model_id": model.json()["id"], "strategy_id": strategy["id"], "cluster": cluster}
    return int(client.post("/api/plans", json=body).json()["id"])


def test_a_measurement_is_queued_for_a_worker_with_the_devices(
    client: TestClient, settings: Settings
) -> None:
    plan = setup_plan(client)  # dp=2,tp=2 on h100-sxm-8x8: 4 ranks
    early = client.post(f"/api/plans/{plan}/measurements", json={})
    assert_error(early, 409, "not_ready", "queued")
    assert run_jobs(settings) == 1
    answer = client.post(f"/api/plans/{plan}/measurements", json={})
    assert answer.status_code == 202, answer.text
    created = answer.json()
    assert created["plan_id"] == plan and created["status"] == "queued"
    assert created["requires"] == {"device": "cpu", "nproc": 4}
    job = client.get(f"/api/jobs/{created['job_id']}").json()
    assert job["kind"] == "measure" and job["requires"] == {"device": "cpu", "nproc": 4}
    assert job["payload"] == {"plan_id": plan, "steps": 5, "nproc": 4, "device": "cpu"}

    cuda = client.post(f"/api/plans/{plan}/measurements",
                       json={"steps": 2, "nproc": 4, "device": "cuda"})  # fmt: skip
    assert cuda.status_code == 202, cuda.text
    assert cuda.json()["requires"] == {"device": "cuda", "nproc": 4}
    listed = client.get(f"/api/plans/{plan}/measurements").json()
    assert [j["id"] for j in listed] == [cuda.json()["job_id"], created["job_id"]]
    missing = client.get(f"/api/plans/{plan}/measured")
    assert_error(missing, 404, "not_found", "measured")


@pytest.mark.parametrize(
    ("body", "code", "field"),
    [
        ({"nproc": 2}, "invalid_measurement", "nproc"),  # the mesh has 4 ranks
        ({"device": "tpu"}, "invalid_request", "device"),
        ({"steps": 21}, "invalid_request", "steps"),
        ({"steps": 0}, "invalid_request", "steps"),
        ({"backend": "torch"}, "invalid_request", "backend"),  # no such field
    ],
)
def test_a_run_that_cannot_be_is_refused_naming_the_field(
    client: TestClient,
    factory: sessionmaker[Session],
    body: dict[str, Any],
    code: str,
    field: str,
) -> None:
    plan = setup_plan(client)
    before = _counts(factory)
    answer = client.post(f"/api/plans/{plan}/measurements", json=body)
    assert_error(answer, 422, code, field)
    assert _counts(factory) == before  # nothing stored


def test_a_plan_that_cannot_be_measured_is_refused_naming_plan_id(
    client: TestClient, other_client: TestClient, factory: sessionmaker[Session]
) -> None:
    uncosted = _plan(client, "uncosted", TINY, None)
    huge = _plan(client, "huge", {**TINY, "layers": 1, "hidden": 4096, "heads": 32, "kv_heads": 8,
                          "ffn": 14336, "vocab": 128256}, "h100-sxm-8x8")  # fmt: skip
    before = _counts(factory)
    error = assert_error(client.post(f"/api/plans/{uncosted}/measurements", json={}), 422,
                         "invalid_measurement", "plan_id", "cluster")  # fmt: skip
    assert error["detail"]["field"] == "plan_id"
    error = assert_error(client.post(f"/api/plans/{huge}/measurements", json={}), 422,
                         "invalid_measurement", "plan_id", "GiB")  # fmt: skip
    assert error["detail"]["bytes"] > error["detail"]["limit"]
    theirs = other_client.post(f"/api/plans/{huge}/measurements", json={})
    assert_error(theirs, 404, "not_found", "plan")
    assert_error(client.post("/api/plans/999999/measurements", json={}), 404, "not_found")
    assert _counts(factory) == before  # nothing stored
