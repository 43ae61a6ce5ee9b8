"""The job ledger: jobs are rows; the web process only enqueues, reads and flags them.

Workers (`worker/`) claim, run, beat and finish jobs through the functions here, so every
state change of a job is written in one place.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from backend.orm import Job
from backend.settings import Settings

#: Job states; the last four are final.
STATES = ("queued", "running", "succeeded", "failed", "cancelled", "timed_out")
FINAL = frozenset(STATES[2:])
KINDS = ("plan", "verify", "compare")


def enqueue(
    session: Session,
    settings: Settings,
    team_id: int,
    kind: str,
    payload: dict[str, Any],
    deadline_s: float | None = None,
) -> Job:
    """Add a queued job (flushed, not committed: the caller commits it with its resource)."""
    assert kind in KINDS, kind
    job = Job(
        team_id=team_id,
        kind=kind,
        payload=payload,
        max_attempts=settings.max_attempts,
        deadline_s=settings.job_deadline_s if deadline_s is None else deadline_s,
    )
    session.add(job)
    session.flush()
    return job
