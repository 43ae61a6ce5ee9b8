"""A worker's devices: discovered (or given by SHARDLAB_WORKER_DEVICES), logged and
registered when it starts; and a real worker process verifying a plan on torch ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from backend.app import create_app
from backend.db import make_engine, session_factory
from backend.devices import CudaDevice, Devices, Requirement, can_serve
from backend.orm import WorkerRow
from backend.workers import live
from tests.api.conftest import token_for
from tests.worker.conftest import settings_for
from worker.devices import ENV, cpu_cores, discover, from_env
from worker.main import Worker

GIB = 1024**3
TWO_GPUS = {
    "cpu_cores": 8,
    "cuda": [{"index": i, "name": "NVIDIA H100", "memory_bytes": 80 * GIB} for i in range(2)],
    "torch": "2.13.0",
}


def test_discovery_finds_this_machine() -> None:
    found = discover({})
    assert found.cpu_cores == cpu_cores() >= 1
    torch = pytest.importorskip("torch")
    assert found.torch == torch.__version__.split("+")[0]
    assert len(found.cuda) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)


def test_the_environment_overrides_discovery() -> None:
    given = discover({ENV: json.dumps(TWO_GPUS)})
    assert given == Devices(8, tuple(CudaDevice(i, "NVIDIA H100", 80 * GIB) for i in range(2)),
                            "2.13.0")  # fmt: skip
    assert Devices.from_json(given.to_json()) == given
    assert given.describe() == "8 CPU cores, 2 x NVIDIA H100 (80 GiB), torch 2.13.0"
    assert from_env({}) is None
    for bad in ("[]", "{}", '{"cpu_cores": 0}', "not json", '{"cpu_cores": 1, "cuda": [{}]}'):
        with pytest.raises(ValueError, match=ENV):
            from_env({ENV: bad})


def test_the_claim_rule() -> None:
    cpu = Devices(2, (), "2.13.0")
    assert cpu.max_cpu_ranks == 8 and Devices(4, (), "2").max_cpu_ranks == 16
    assert can_serve(cpu, None) and can_serve(Devices(1), None)
    assert can_serve(cpu, Requirement("cpu", 8)) and not can_serve(cpu, Requirement("cpu", 9))
    assert not can_serve(cpu, Requirement("cuda", 1))
    assert not can_serve(Devices(64), Requirement("cpu", 1))  # no torch
    gpus = Devices.from_json(TWO_GPUS)
    assert can_serve(gpus, Requirement("cuda", 2)) and not can_serve(gpus, Requirement("cuda", 3))


def test_a_worker_registers_its_devices_and_leaves(sqlite_url: str, tmp_path: Path) -> None:
    settings = settings_for(sqlite_url, tmp_path)
    worker = Worker(settings, "w-gpu", devices=Devices.from_json(TWO_GPUS))
    assert worker.run_one() is None  # registers first
    engine = make_engine(sqlite_url)
    try:
        with session_factory(engine)() as session:
            [seen] = live(session, settings)
            assert (seen.id, seen.devices, seen.engine) == ("w-gpu", worker.devices, "local")
        worker.close()
        with session_factory(engine)() as session:
            assert session.get(WorkerRow, "w-gpu") is None
    finally:
        engine.dispose()


@pytest.fixture
def worker_process(
    sqlite_url: str, tmp_path: Path
) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    env = {
        **os.environ,
        "SHARDLAB_DATABASE_URL": sqlite_url,
        "SHARDLAB_DATA_DIR": str(tmp_path / "data"),
        "SHARDLAB_HEARTBEAT_INTERVAL_S": "0.5",
    }
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "backend", "worker", "--id", "real", "--poll-s", "0.2"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield proc, log
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(20)


def _until(client: TestClient, url: str, timeout: float) -> dict[str, Any]:
    end = time.monotonic() + timeout
    while True:
        body: dict[str, Any] = client.get(url).json()
        if body["status"] not in ("queued", "running") or time.monotonic() > end:
            return body
        time.sleep(0.2)


def test_a_worker_process_verifies_on_torch_ranks(
    sqlite_url: str, tmp_path: Path, worker_process: tuple[subprocess.Popen[bytes], Path]
) -> None:
    pytest.importorskip("torch")
    settings = settings_for(sqlite_url, tmp_path)
    app = create_app(settings)
    try:
        with TestClient(app) as client:
            client.headers["Authorization"] = f"Bearer {token_for(settings, 'alpha')}"
            tiny = {"layers": 1, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128,
                    "vocab": 256, "seq": 16, "batch": 4}  # fmt: skip
            made = {"name": "tiny", "preset": "llama3-8b", "overrides": tiny}
            model = client.post("/api/models", json=made).json()
            dp = {"name": "dp", "mesh": "dp=2", "templates": ["dp"]}
            strategy = client.post("/api/strategies", json=dp).json()
            planned = {"model_id": model["id"], "strategy_id": strategy["id"]}
            plan = client.post("/api/plans", json=planned).json()
            body = {"plan_id": plan["id"], "backend": "torch", "nproc": 2, "device": "cpu"}
            created = client.post("/api/verifications", json=body)
            assert created.status_code == 202, created.text
            ver = _until(client, f"/api/verifications/{created.json()['id']}", 120)
            log = worker_process[1].read_text()
            assert ver["status"] == "succeeded", (ver, log)
            assert ver["report"]["ok"] is True and ver["backend"] == "torch"
            assert "real (local engine): " in log and "CPU core" in log
            [seen] = client.get("/api/workers").json()
            assert seen["id"] == "real" and seen["devices"]["torch"]
    finally:
        app.state.engine.dispose()
