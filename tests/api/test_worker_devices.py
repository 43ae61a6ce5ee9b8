"""Workers own devices: verifications that need real ranks, checked at POST, stored on the
job row, claimed only by a worker that has the devices, and flagged (then failed) when no
worker has them (`backend/devices.py`, `backend/verifying.py`, `backend/workers.py`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from backend import ledger, workers
from backend.auth import ensure_team
from backend.db import make_engine, session_factory, transaction
from backend.devices import CudaDevice, Devices, Requirement, can_serve
from backend.orm import Job, Verification
from backend.settings import Settings
from tests.api.conftest import assert_error
from tests.api.test_plans import setup_plan

GIB = 1024**3
CPU_ONLY = Devices(2, (), "2.13.0")
TWO_GPUS = Devices(16, (CudaDevice(0, "H100", 80 * GIB), CudaDevice(1, "H100", 80 * GIB)), "2.13")
NO_TORCH = Devices(64)


@pytest.fixture
def factory(settings: Settings) -> Any:
    engine = make_engine(settings.database_url)
    yield session_factory(engine)
    engine.dispose()


def _counts(factory: sessionmaker[Session]) -> tuple[int, int]:
    with factory() as session:
        jobs = session.scalar(select(func.count()).select_from(Job)) or 0
        vers = session.scalar(select(func.count()).select_from(Verification)) or 0
        return jobs, vers


def test_a_torch_verification_stores_its_requirement(
    client: TestClient, factory: sessionmaker[Session]
) -> None:
    plan = setup_plan(client, None)  # mesh dp=2,tp=2: 4 ranks
    created = client.post("/api/verifications", json={"plan_id": plan, "backend": "torch"})
    assert created.status_code == 202, created.text
    ver = client.get(f"/api/verifications/{created.json()['id']}").json()
    assert (ver["backend"], ver["nproc"], ver["device"]) == ("torch", 4, "cpu")
    job = client.get(f"/api/jobs/{created.json()['job_id']}").json()
    assert job["requires"] == {"device": "cpu", "nproc": 4}
    assert job["payload"]["backend"] == "torch"

    cuda = {"plan_id": plan, "backend": "torch", "nproc": 4, "device": "cuda"}
    job_id = client.post("/api/verifications", json=cuda).json()["job_id"]
    assert client.get(f"/api/jobs/{job_id}").json()["requires"] == {"device": "cuda", "nproc": 4}
    simulated = client.post("/api/verifications", json={"plan_id": plan}).json()
    assert client.get(f"/api/jobs/{simulated['job_id']}").json()["requires"] is None


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"backend": "torch", "nproc": 2}, "nproc"),  # the mesh has 4 ranks
        ({"nproc": 4}, "nproc"),  # simulated runs every rank in one process
        ({"device": "cuda"}, "device"),  # cuda needs the torch backend
        ({"compute_dtype": "bfloat16"}, "compute_dtype"),  # mixed precision runs real ranks
    ],
)
def test_a_run_that_cannot_be_is_refused_naming_the_field(
    client: TestClient, factory: sessionmaker[Session], body: dict[str, Any], field: str
) -> None:
    plan = setup_plan(client, None)
    before = _counts(factory)
    answer = client.post("/api/verifications", json={"plan_id": plan, **body})
    error = assert_error(answer, 422, "invalid_verification", field)
    assert error["detail"]["field"] == field
    assert _counts(factory) == before  # nothing stored


def test_a_pipeline_is_queued_for_torch_ranks(client: TestClient) -> None:
    setup_plan(client, None)  # stores the model "tiny"
    models = {m["name"]: m["id"] for m in client.get("/api/models").json()}
    strategy = client.post("/api/strategies", json={"name": "pp", "mesh": "pp=2"}).json()
    plan = client.post(
        "/api/plans", json={"model_id": models["tiny"], "strategy_id": strategy["id"]}
    ).json()
    answer = client.post("/api/verifications", json={"plan_id": plan["id"], "backend": "torch"})
    assert answer.status_code == 202, answer.text
    job = client.get(f"/api/jobs/{answer.json()['job_id']}").json()
    assert job["requires"] == {"device": "cpu", "nproc": 2}


def test_a_check_verifies_where_it_is_told(client: TestClient) -> None:
    body = {
        "model": {"preset": "llama3-8b", "overrides": {"layers": 1, "hidden": 64, "heads": 4,
                  "kv_heads": 2, "ffn": 128, "vocab": 256, "seq": 16, "batch": 4}},
        "strategy": {"mesh": "dp=2", "templates": ["dp"]},
        "cluster": "h100-sxm-8x8",
        "budgets": {"verify": True},
    }  # fmt: skip
    refused = client.post("/api/checks", json={**body, "verify_on": {"backend": "torch",
                                                                      "nproc": 3}})  # fmt: skip
    assert_error(refused, 422, "invalid_verification", "verify_on.nproc")
    no_verify = {**body, "budgets": {}, "verify_on": {"backend": "torch"}}
    assert_error(client.post("/api/checks", json=no_verify), 422, "invalid_check", "verify_on")
    created = client.post("/api/checks", json={**body, "verify_on": {"backend": "torch"}})
    assert created.status_code == 202, created.text
    check = client.get(f"/api/checks/{created.json()['id']}").json()
    ver = client.get(f"/api/verifications/{check['verification_id']}").json()
    assert (ver["backend"], ver["nproc"], ver["device"]) == ("torch", 2, "cpu")


def _queue(factory: sessionmaker[Session], settings: Settings, need: Requirement | None) -> int:
    with transaction(factory) as session:
        team = ensure_team(session, "alpha")
        return ledger.enqueue(session, settings, team.id, "verify", {}, requires=need).id


def test_only_a_worker_with_the_devices_claims_the_job(
    factory: sessionmaker[Session], settings: Settings
) -> None:
    settings = replace(settings, team_max_running_jobs=10)
    cuda = _queue(factory, settings, Requirement("cuda", 2))
    cpu = _queue(factory, settings, Requirement("cpu", 8))
    wide = _queue(factory, settings, Requirement("cpu", 9))  # over 4 x 2 cores
    assert ledger.claim(factory, settings, "no-torch", NO_TORCH) is None
    assert ledger.claim(factory, settings, "unnamed") is None  # no devices: only plain jobs
    got = ledger.claim(factory, settings, "cpu-worker", CPU_ONLY)
    assert got is not None and got.id == cpu
    assert ledger.claim(factory, settings, "cpu-worker", CPU_ONLY) is None  # not cuda, not wide
    first = ledger.claim(factory, settings, "gpu-worker", TWO_GPUS)
    second = ledger.claim(factory, settings, "gpu-worker", TWO_GPUS)
    assert {first.id if first else None, second.id if second else None} == {cuda, wide}
    plain = _queue(factory, settings, None)
    found = ledger.claim(factory, settings, "no-torch", NO_TORCH)
    assert found is not None and found.id == plain


def test_the_sql_rule_is_the_python_rule(
    factory: sessionmaker[Session], settings: Settings
) -> None:
    settings = replace(settings, team_max_running_jobs=100, team_max_queued_jobs=100)
    needs = [None] + [Requirement(d, n) for d in ("cpu", "cuda") for n in (1, 2, 8, 9, 16, 17)]
    ids = {_queue(factory, settings, need): need for need in needs}
    for devices in (CPU_ONLY, TWO_GPUS, NO_TORCH, Devices(4, (), "2.13")):
        with factory() as session:
            stmt = ledger._candidates(session, settings, set(), devices).limit(None)
            servable = {job.id for job in session.scalars(stmt)}
        assert servable == {i for i, need in ids.items() if can_serve(devices, need)}, devices


def test_a_job_no_worker_can_serve_says_so_then_fails(
    factory: sessionmaker[Session], settings: Settings, client: TestClient
) -> None:
    job_id = _queue(factory, settings, Requirement("cuda", 2))
    workers.register(factory, "cpu-box", CPU_ONLY, "local")
    assert workers.sweep_unservable(factory, settings) == []
    job = client.get(f"/api/jobs/{job_id}").json()
    assert job["status"] == "queued"
    assert job["message"] == (
        "waiting: no worker has 2 CUDA devices; workers seen: "
        "cpu-box (2 CPU cores, no CUDA, torch 2.13.0)"
    )
    listed = client.get("/api/workers").json()
    assert [(w["id"], w["devices"]["cpu_cores"]) for w in listed] == [("cpu-box", 2)]

    workers.register(factory, "gpu-box", TWO_GPUS, "ray")  # a capable worker came up
    assert workers.sweep_unservable(factory, replace(settings, unservable_after_s=0)) == []
    assert client.get(f"/api/jobs/{job_id}").json()["message"].startswith("queued")

    workers.forget(factory, "gpu-box")
    assert workers.sweep_unservable(factory, replace(settings, unservable_after_s=0)) == [job_id]
    job = client.get(f"/api/jobs/{job_id}").json()
    assert job["status"] == "failed" and job["error"]["code"] == "no_capable_worker"
    assert "2 CUDA devices" in job["error"]["message"] and "cpu-box" in job["message"]
