"""The ledger on both databases: exclusive claims, takeover of a dead worker's job, the
attempts limit, and that a worker that lost its job can no longer finish it."""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from backend import ledger
from backend.auth import ensure_team
from backend.db import transaction
from backend.orm import Job, utcnow
from backend.settings import Settings
from tests.worker.conftest import job_row, settings_for


def _queue(factory: sessionmaker[Session], settings: Settings, n: int) -> list[int]:
    with transaction(factory) as session:
        team = ensure_team(session, "alpha")
        return [ledger.enqueue(session, settings, team.id, "plan", {"n": i}).id for i in range(n)]


def _age_heartbeat(factory: sessionmaker[Session], job_id: int, seconds: float) -> None:
    """Pretend the job's worker has been silent for `seconds`."""
    with transaction(factory) as session:
        old = utcnow() - timedelta(seconds=seconds)
        session.execute(update(Job).where(Job.id == job_id).values(heartbeat_at=old))


def test_concurrent_claims_never_share_a_job(
    factory: sessionmaker[Session], db_url: str, tmp_path: Path
) -> None:
    # one team may run them all at once (its running limit is tested in test_fair_claims)
    settings = settings_for(db_url, tmp_path, team_max_running_jobs="24")
    ids = _queue(factory, settings, 24)
    claimed: dict[str, list[int]] = {"w0": [], "w1": [], "w2": []}
    start = threading.Barrier(len(claimed))

    def claimer(name: str) -> None:
        start.wait()
        while (job := ledger.claim(factory, settings, name)) is not None:
            claimed[name].append(job.id)

    threads = [threading.Thread(target=claimer, args=(name,)) for name in claimed]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    everything = [i for got in claimed.values() for i in got]
    assert sorted(everything) == ids, "a job was claimed twice or never"
    with factory() as session:
        rows = session.scalars(select(Job)).all()
        assert {j.status for j in rows} == {"running"} and {j.attempts for j in rows} == {1}
        assert all(j.id in claimed[str(j.worker_id)] for j in rows)


def test_stale_job_is_taken_over_and_the_old_worker_cannot_finish(
    factory: sessionmaker[Session], db_url: str, tmp_path: Path
) -> None:
    settings = settings_for(db_url, tmp_path, heartbeat_timeout_s="30")
    (job_id,) = _queue(factory, settings, 1)
    first = ledger.claim(factory, settings, "a")
    assert first is not None and first.id == job_id
    assert ledger.claim(factory, settings, "b") is None, "a live job must not be taken"
    assert ledger.heartbeat(factory, job_id, "a", 0.5, "completion")
    _age_heartbeat(factory, job_id, 60)

    taken = ledger.claim(factory, settings, "b")
    assert taken is not None and taken.id == job_id and taken.attempts == 2
    assert taken.worker_id == "b"
    assert not ledger.heartbeat(factory, job_id, "a", 0.9, "cost")
    stored: list[str] = []
    assert not ledger.finish(factory, job_id, "a", {"by": "a"}, lambda s, j: stored.append("a"))
    assert not ledger.fail(factory, job_id, "a", {"code": "x", "message": "x", "detail": {}})
    assert ledger.finish(factory, job_id, "b", {"by": "b"}, lambda s, j: stored.append("b"))
    assert not ledger.finish(factory, job_id, "b", {"by": "b"}, lambda s, j: stored.append("b"))
    assert stored == ["b"]
    job = job_row(factory, job_id)
    assert job.status == "succeeded" and job.result == {"by": "b"} and job.attempts == 2


def test_attempts_limit_marks_the_job_failed(
    factory: sessionmaker[Session], db_url: str, tmp_path: Path
) -> None:
    settings = settings_for(db_url, tmp_path, max_attempts="2")
    (job_id,) = _queue(factory, settings, 1)
    for worker in ("a", "b"):
        job = ledger.claim(factory, settings, worker)
        assert job is not None and job.worker_id == worker
        _age_heartbeat(factory, job_id, 3600)
    assert ledger.claim(factory, settings, "c") is None
    job = job_row(factory, job_id)
    assert job.status == "failed" and job.attempts == 2 and job.finished_at is not None
    assert job.error is not None and job.error["code"] == "worker_lost"
    assert "2 attempts" in job.error["message"]


def test_cancel_queued_at_once_and_running_through_the_worker(
    factory: sessionmaker[Session], db_url: str, tmp_path: Path
) -> None:
    settings = settings_for(db_url, tmp_path)
    queued, running = _queue(factory, settings, 2)
    assert ledger.claim(factory, settings, "a") is not None  # the oldest: `queued`
    with transaction(factory) as session:
        first, second = session.get(Job, queued), session.get(Job, running)
        assert first is not None and second is not None
        ledger.request_cancel(session, second)  # still queued
        ledger.request_cancel(session, first)  # running under "a"
    assert job_row(factory, running).status == "cancelled"
    assert job_row(factory, queued).cancel_requested
    assert not ledger.heartbeat(factory, queued, "a", 0.1, "completion")
    assert ledger.cancel(factory, queued, "a")
    job = job_row(factory, queued)
    assert job.status == "cancelled" and ledger.ledger_row_json(job)["finished_at"]
    with factory() as session:
        assert session.scalar(select(func.count()).select_from(Job)) == 2


def test_time_out_and_release(factory: sessionmaker[Session], db_url: str, tmp_path: Path) -> None:
    settings = settings_for(db_url, tmp_path)
    a, b = _queue(factory, settings, 2)
    assert ledger.claim(factory, settings, "w") is not None
    assert ledger.time_out(factory, a, "w", 1.0)
    job = job_row(factory, a)
    assert job.status == "timed_out" and "1 s" in job.message
    assert ledger.claim(factory, settings, "w") is not None
    assert ledger.release(factory, b, "w")
    job = job_row(factory, b)
    assert job.status == "queued" and job.attempts == 0 and job.worker_id is None
