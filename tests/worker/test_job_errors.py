"""What a failed job tells its user: an engine bug shows a message and a reference only (the
traceback is in the worker's log under that reference); a user error keeps its code,
message and detail."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from backend.db import transaction
from backend.orm import Plan, Strategy
from backend.settings import Settings
from tests.worker.conftest import job_row, queue_plan, settings_for
from worker.main import Worker


def _queue_with(
    factory: sessionmaker[Session], tmp_path: Path, db_url: str, **strategy: object
) -> tuple[Settings, int]:
    """A plan job whose strategy row is changed to `strategy` behind the API's back."""
    settings = settings_for(db_url, tmp_path)
    plan_id, job_id = queue_plan(factory, settings, preset="llama3-8b", mesh="dp=2")
    with transaction(factory) as session:
        plan = session.get(Plan, plan_id)
        assert plan is not None
        row = session.get(Strategy, plan.strategy_id)
        assert row is not None
        for name, value in strategy.items():
            setattr(row, name, value)
    return settings, job_id


def _run(settings: Settings) -> None:
    worker = Worker(settings, worker_id="w")
    try:
        assert worker.run_one() is not None
    finally:
        worker.close()


def test_engine_bug_shows_a_reference_and_logs_the_traceback(
    db_url: str,
    factory: sessionmaker[Session],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # an annotation that is not a string makes the engine fail with an AttributeError
    settings, job_id = _queue_with(factory, tmp_path, db_url, annotations=[1])
    with caplog.at_level(logging.ERROR, logger="shardlab.worker"):
        _run(settings)
    job = job_row(factory, job_id)
    assert job.status == "failed"
    assert job.error is not None and set(job.error) == {"code", "message", "detail"}
    assert job.error["code"] == "internal_error"
    reference = job.error["detail"]["reference"]
    assert job.error["detail"] == {"reference": reference}
    assert len(reference) == 8 and reference in job.error["message"]
    assert "Traceback" not in str(job.error) and "AttributeError" not in str(job.error)
    assert "Traceback" not in (job.message or "")
    logged = [r for r in caplog.records if r.levelno == logging.ERROR and reference in r.message]
    assert len(logged) == 1
    assert "Traceback (most recent call last)" in logged[0].message
    assert "AttributeError" in logged[0].message


def test_user_error_keeps_its_code_message_and_detail(
    db_url: str, factory: sessionmaker[Session], tmp_path: Path
) -> None:
    settings, job_id = _queue_with(factory, tmp_path, db_url, options={"nope": 1})
    _run(settings)
    job = job_row(factory, job_id)
    assert job.status == "failed" and job.error is not None
    assert job.error["code"] != "internal_error"
    assert "nope" in job.error["message"] and "reference" not in job.error["detail"]
