"""Per-team limits: what an admin set for a team (`team_limits`), else the service's default.

Each team has five limits (`FIELDS`); a None in its `team_limits` row, or no row at all,
means the default from `Settings` (`DEFAULT_SETTING` names the setting of each):

- `max_running_jobs`: the team's jobs running at once; workers skip its queued jobs beyond
  it (`ledger.claim`).
- `max_queued_jobs`: the team's jobs queued or running; creating one more is a 429
  `too_many_jobs` (`ledger.enqueue`).
- `requests_per_minute`: the team's API requests, per API process (`backend/rate_limit.py`).
- `job_deadline_s`: the wall-clock limit given to each new job (`Job.deadline_s`).
- `job_memory_bytes`: the address space of the engine process of each job (`worker/child.py`).

The API reads them when a job is created and on every request (cached a few seconds), the
workers when they claim a job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from sqlalchemy.orm import Session

from backend.orm import TeamLimits
from backend.settings import Settings

FIELDS = (
    "max_running_jobs",
    "max_queued_jobs",
    "requests_per_minute",
    "job_deadline_s",
    "job_memory_bytes",
)
#: the `Settings` field holding each limit's service default
DEFAULT_SETTING = {
    "max_running_jobs": "team_max_running_jobs",
    "max_queued_jobs": "team_max_queued_jobs",
    "requests_per_minute": "team_requests_per_minute",
    "job_deadline_s": "job_deadline_s",
    "job_memory_bytes": "job_memory_bytes",
}
Source = Literal["team", "default"]


@dataclass(frozen=True, slots=True)
class Limits:
    """A team's effective limits, and where each comes from (`sources`: team or default)."""

    max_running_jobs: int
    max_queued_jobs: int
    requests_per_minute: int
    job_deadline_s: float
    job_memory_bytes: int
    sources: dict[str, Source] = field(default_factory=dict)


def defaults(settings: Settings) -> dict[str, int | float]:
    """The service's default of every limit."""
    return {name: getattr(settings, DEFAULT_SETTING[name]) for name in FIELDS}


def effective(settings: Settings, row: TeamLimits | None) -> Limits:
    """The limits of a team whose own are `row` (None: it has none)."""
    values: dict[str, int | float] = {}
    sources: dict[str, Source] = {}
    for name, default in defaults(settings).items():
        own = getattr(row, name) if row is not None else None
        values[name], sources[name] = (default, "default") if own is None else (own, "team")
    return Limits(
        max_running_jobs=int(values["max_running_jobs"]),
        max_queued_jobs=int(values["max_queued_jobs"]),
        requests_per_minute=int(values["requests_per_minute"]),
        job_deadline_s=float(values["job_deadline_s"]),
        job_memory_bytes=int(values["job_memory_bytes"]),
        sources=sources,
    )


def team_limits(session: Session, settings: Settings, team_id: int) -> Limits:
    """The effective limits of team `team_id`."""
    return effective(settings, session.get(TeamLimits, team_id))
