"""Schemas of the admin's per-team limits (`/api/admin/teams/{team}/limits`)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from backend.schemas.common import StrictRequest

#: the most a team may be given, and the least (an engine process needs about 250 MiB to
#: start: numpy and the engine's modules)
MAX_RUNNING_JOBS = 1000
MAX_QUEUED_JOBS = 100_000
MAX_REQUESTS_PER_MINUTE = 1_000_000
MAX_JOB_DEADLINE_S = 7 * 24 * 3600.0
MIN_JOB_MEMORY_BYTES = 256 * 1024**2
MAX_JOB_MEMORY_BYTES = 1024**4


class TeamLimitsUpdate(StrictRequest):
    """New limits of a team. A field left out keeps its value; `null` returns it to the
    service's default."""

    max_running_jobs: int | None = Field(default=None, ge=1, le=MAX_RUNNING_JOBS)
    max_queued_jobs: int | None = Field(default=None, ge=1, le=MAX_QUEUED_JOBS)
    requests_per_minute: int | None = Field(default=None, ge=1, le=MAX_REQUESTS_PER_MINUTE)
    job_deadline_s: float | None = Field(
        default=None, ge=1.0, le=MAX_JOB_DEADLINE_S, allow_inf_nan=False
    )
    job_memory_bytes: int | None = Field(
        default=None, ge=MIN_JOB_MEMORY_BYTES, le=MAX_JOB_MEMORY_BYTES
    )


class IntLimit(BaseModel):
    """One limit in force: its value, whether the team's own or the default, and the
    default."""

    value: int
    source: Literal["team", "default"]
    default: int


class FloatLimit(BaseModel):
    """One limit in force (seconds): its value, whether the team's own or the default, and
    the default."""

    value: float
    source: Literal["team", "default"]
    default: float


class TeamLimitsOut(BaseModel):
    """A team's limits in force (`backend/tenancy.py` says what each limits)."""

    team: str
    max_running_jobs: IntLimit
    max_queued_jobs: IntLimit
    requests_per_minute: IntLimit
    job_deadline_s: FloatLimit
    job_memory_bytes: IntLimit
    #: when an admin last changed them (None: never)
    updated_at: datetime | None
