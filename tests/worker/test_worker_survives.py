"""A worker survives any one job's failure (issue 40): a job whose outcome the database
refuses (the lone surrogate of a Hugging Face `_name_or_path` once raised UnicodeEncodeError
out of the worker, and every worker that took the job over died the same way) fails as an
`internal_error` with a reference, and the same worker goes on to the next job."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from backend import ledger
from backend.db import transaction
from backend.orm import Job, Plan
from backend.settings import Settings
from tests.worker.conftest import job_row, queue_plan, settings_for
from worker.main import Worker


def _another_plan(factory: sessionmaker[Session], settings: Settings, plan_id: int) -> int:
    """A second plan of the same model, strategy and cluster, queued: its job's id."""
    with transaction(factory) as session:
        first = session.get(Plan, plan_id)
        assert first is not None
        job = ledger.enqueue(session, settings, first.team_id, "plan", {})
        plan = Plan(
            team_id=first.team_id,
            model_id=first.model_id,
            strategy_id=first.strategy_id,
            cluster=first.cluster,
            job_id=job.id,
        )
        session.add(plan)
        session.flush()
        first_job = session.get(Job, first.job_id)
        assert first_job is not None
        job.payload = {**first_job.payload, "plan_id": plan.id}
        return job.id


def test_a_job_whose_outcome_cannot_be_stored_fails_and_the_worker_goes_on(
    db_url: str,
    factory: sessionmaker[Session],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = settings_for(db_url, tmp_path)
    plan_id, poisoned = queue_plan(factory, settings, preset="mlp_demo", mesh="dp=2")
    healthy = _another_plan(factory, settings, plan_id)
    finish = ledger.finish

    def refusing(factory: Any, job_id: int, *args: Any, **kwargs: Any) -> bool:
        if job_id == poisoned:  # what psycopg and sqlite3 raise on a lone surrogate
            raise UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")
        return finish(factory, job_id, *args, **kwargs)

    monkeypatch.setattr(ledger, "finish", refusing)
    worker = Worker(settings, worker_id="w")
    try:
        with caplog.at_level(logging.ERROR, logger="shardlab.worker"):
            assert worker.run_until_empty() == 2
    finally:
        worker.close()
    failed = job_row(factory, poisoned)
    assert failed.status == "failed" and failed.error is not None
    assert failed.error["code"] == "internal_error"
    reference = failed.error["detail"]["reference"]
    assert any(reference in r.getMessage() and "UnicodeEncodeError" in r.getMessage()
               for r in caplog.records)  # fmt: skip
    assert job_row(factory, healthy).status == "succeeded"


def test_the_worker_loop_goes_on_after_an_error_outside_any_job(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = settings_for(db_url, tmp_path)
    claims = []
    claim = ledger.claim

    def failing_once(*args: Any, **kwargs: Any) -> Any:
        claims.append(1)
        if len(claims) == 1:
            raise RuntimeError("a bug in claiming")
        worker.stop()
        return claim(*args, **kwargs)

    monkeypatch.setattr(ledger, "claim", failing_once)
    worker = Worker(settings, worker_id="w", poll_s=0.01)
    try:
        worker.run()  # returns once stopped: the error did not end the loop
    finally:
        worker.close()
    assert len(claims) == 2
