"""The Ray engine: a device job runs as a Ray task in a placement group of its ranks, on a
local Ray (`ray.init(num_cpus=2)`: the `local_ray` fixture of tests/conftest.py, one per
test process)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from backend import blobs, ledger
from backend.auth import ensure_team
from backend.db import make_engine, session_factory, transaction
from backend.devices import Requirement
from backend.orm import Job, Model, Plan, Strategy, Verification
from backend.verifying import RunOn, queue_verification
from shardlab.graph_json import graph_to_json
from shardlab.models import build_model
from tests.worker.conftest import settings_for
from worker.main import Worker

ray = pytest.importorskip("ray")

from worker.ray_engine import RayEngine, bundles  # noqa: E402  (needs ray)

TINY = {"layers": 1, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 256,
        "seq": 16, "batch": 4}  # fmt: skip


def test_bundles_are_one_per_rank() -> None:
    assert bundles(Requirement("cpu", 2)) == [{"CPU": 1.0}, {"CPU": 1.0}]
    assert bundles(Requirement("cuda", 1)) == [{"CPU": 1.0, "GPU": 1.0}]


def _queue_torch_verification(url: str, settings: Any, mesh: str, nproc: int) -> int:
    engine = make_engine(url)
    try:
        with transaction(session_factory(engine)) as session:
            team = ensure_team(session, "alpha")
            blob, _ = blobs.pack(graph_to_json(build_model("llama3-8b", TINY)))
            model = Model(team_id=team.id, name="tiny", source="preset", preset="llama3-8b",
                          overrides=TINY, graph_blob=blob)  # fmt: skip
            strategy = Strategy(team_id=team.id, name="dp", mesh=mesh, templates=["dp"])
            session.add_all([model, strategy])
            session.flush()
            job = ledger.enqueue(session, settings, team.id, "plan", {})
            plan = Plan(team_id=team.id, model_id=model.id, strategy_id=strategy.id, job_id=job.id)
            session.add(plan)
            session.flush()
            job.status = "succeeded"  # the verify job builds the plan itself
            ver = queue_verification(session, settings, team.id, plan.id, "float64",
                                     RunOn("torch", nproc, "cpu"))  # fmt: skip
            return ver.id
    finally:
        engine.dispose()


def test_a_device_job_runs_as_a_ray_task(local_ray: Any, sqlite_url: str, tmp_path: Path) -> None:
    settings = settings_for(sqlite_url, tmp_path)
    ver_id = _queue_torch_verification(sqlite_url, settings, "dp=2", 2)
    worker = Worker(settings, "ray-worker", engine="ray")
    try:
        assert isinstance(worker.ray, RayEngine)
        assert worker.devices.cpu_cores == 2 and worker.devices.max_cpu_ranks == 2
        job = worker.run_one()
        assert job is not None and job.requires_device == "cpu"
        with worker.factory() as session:
            ver = session.get(Verification, ver_id)
            assert ver is not None
            done = session.get(Job, ver.job_id)
            assert done is not None and done.status == "succeeded", (done.message, done.error)
            assert ver.report is not None and ver.report["ok"] is True
        end = time.monotonic() + 20  # the group is removed asynchronously
        while local_ray.available_resources().get("CPU") != 2 and time.monotonic() < end:
            time.sleep(0.1)
        assert local_ray.available_resources().get("CPU") == 2  # the group was freed
    finally:
        worker.close()


def test_a_ray_worker_leaves_jobs_wider_than_its_nodes(
    local_ray: Any, sqlite_url: str, tmp_path: Path
) -> None:
    settings = settings_for(sqlite_url, tmp_path)
    _queue_torch_verification(sqlite_url, settings, "dp=4", 4)  # 4 CPU bundles, 2 CPUs
    worker = Worker(settings, "ray-worker", engine="ray")
    try:
        assert worker.run_one() is None
    finally:
        worker.close()
