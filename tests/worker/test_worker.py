"""Real `python -m backend worker` processes: a killed worker's job is taken over after its
heartbeat goes stale and finished once; a running job is cancelled; a deadline stops one.

The job is the plan of llama3-70b (80 layers) on dp=8 x tp=8 with dp, megatron_tp and
sequence_parallel, costed on h100-sxm-8x8: about 7 s of engine work, long enough to
interrupt mid-way.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from backend.db import make_engine, session_factory
from backend.ledger import request_cancel
from backend.orm import Artifact, Job, Plan
from tests.worker.conftest import job_row, queue_plan, settings_for

T = TypeVar("T")
FAST = {"heartbeat_timeout_s": "3", "heartbeat_interval_s": "0.5"}


class Workers:
    """Starts worker processes on one database; kills what is left at the end."""

    def __init__(self, url: str, tmp_path: Path) -> None:
        self.url, self.tmp_path = url, tmp_path
        self.procs: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(self, name: str) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            "SHARDLAB_DATABASE_URL": self.url,
            "SHARDLAB_DATA_DIR": str(self.tmp_path / "data"),
            **{f"SHARDLAB_{k.upper()}": v for k, v in FAST.items()},
        }
        log = self.tmp_path / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "backend", "worker", "--id", name, "--poll-s", "0.2"],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.procs.append((proc, log))
        return proc

    def engine_pid(self, proc: subprocess.Popen[bytes]) -> int:
        log = next(log for p, log in self.procs if p is proc)
        found = wait_for(lambda: re.search(r"engine pid (\d+)", log.read_text()), 20, "engine pid")
        return int(found.group(1))

    def close(self) -> None:
        for proc, _ in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)


@pytest.fixture
def factory_of() -> Iterator[Callable[[str], sessionmaker[Session]]]:
    engines = []

    def make(url: str) -> sessionmaker[Session]:
        engines.append(make_engine(url))
        return session_factory(engines[-1])

    yield make
    for engine in engines:
        engine.dispose()


def wait_for(check: Callable[[], T], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie no longer counts)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def _final(factory: sessionmaker[Session], job_id: int, timeout: float) -> Job:
    def done() -> Job | None:
        job = job_row(factory, job_id)
        return job if job.status not in ("queued", "running") else None

    return wait_for(done, timeout, f"job {job_id} to finish")


def test_killed_worker_job_is_taken_over_once(
    db_url: str, tmp_path: Path, factory_of: Callable[[str], sessionmaker[Session]]
) -> None:
    url = db_url
    factory = factory_of(url)
    plan_id, job_id = queue_plan(factory, settings_for(url, tmp_path))
    workers = Workers(url, tmp_path)
    try:
        first = workers.start("first")
        child = workers.engine_pid(first)
        wait_for(lambda: job_row(factory, job_id).progress > 0, 20, "progress")
        assert job_row(factory, job_id).status == "running"
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        wait_for(lambda: not alive(child), 5, "the orphaned engine to exit")
        workers.start("second")
        job = _final(factory, job_id, 40)
    finally:
        workers.close()
    assert job.status == "succeeded", job.error
    assert job.attempts == 2 and job.worker_id == "second"
    with factory() as session:
        kinds = session.scalars(
            select(Artifact.kind).where(Artifact.owner == "plan", Artifact.owner_id == plan_id)
        ).all()
        plan = session.get(Plan, plan_id)
        assert plan is not None and plan.summary is not None
        assert plan.summary["cost"]["step_time_s"] > 0
    assert sorted(kinds) == [
        "memory",
        "passes",
        "placements",
        "plan",
        "program",
        "timelines",
        "trace",
    ]


def test_running_job_is_cancelled(
    sqlite_url: str, tmp_path: Path, factory_of: Callable[[str], sessionmaker[Session]]
) -> None:
    url = sqlite_url
    factory = factory_of(url)
    _, job_id = queue_plan(factory, settings_for(url, tmp_path))
    workers = Workers(url, tmp_path)
    try:
        worker = workers.start("w")
        child = workers.engine_pid(worker)
        wait_for(lambda: job_row(factory, job_id).status == "running", 20, "running")
        with factory() as session, session.begin():
            job = session.get(Job, job_id)
            assert job is not None
            request_cancel(session, job)
        job = _final(factory, job_id, 10)
        assert job.status == "cancelled", job.message
        wait_for(lambda: not alive(child), 5, "the engine to be killed")
        assert worker.poll() is None, "the worker keeps serving"
    finally:
        workers.close()


def test_deadline_times_the_job_out(
    sqlite_url: str, tmp_path: Path, factory_of: Callable[[str], sessionmaker[Session]]
) -> None:
    url = sqlite_url
    factory = factory_of(url)
    plan_id, job_id = queue_plan(factory, settings_for(url, tmp_path), deadline_s=1.0)
    workers = Workers(url, tmp_path)
    try:
        child = workers.engine_pid(workers.start("w"))
        job = _final(factory, job_id, 20)
        wait_for(lambda: not alive(child), 5, "the engine to be killed")
    finally:
        workers.close()
    assert job.status == "timed_out" and "1 s" in job.message
    assert job.error is not None and job.error["code"] == "timed_out"
    with factory() as session:
        assert session.scalars(select(Artifact).where(Artifact.owner_id == plan_id)).all() == []
