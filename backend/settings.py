"""Service settings, read once from the environment (`SHARDLAB_*`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Settings:
    """Where data lives and the service's limits. Every field has a `SHARDLAB_<FIELD>` variable."""

    data_dir: Path
    database_url: str
    #: largest request body accepted (bytes); larger ones get 413
    max_request_bytes: int = 32 * 1024 * 1024
    #: largest graph accepted (ops of the serial graph)
    max_graph_ops: int = 200_000
    #: seconds without a heartbeat after which a running job is taken over by another worker
    heartbeat_timeout_s: float = 30.0
    #: how often a worker beats while a job runs
    heartbeat_interval_s: float = 2.0
    #: attempts before a job whose workers keep dying is marked failed
    max_attempts: int = 3
    #: default wall-clock limit of a job (a team's `job_deadline_s` limit overrides it)
    job_deadline_s: float = 900.0
    #: a queued job that needs devices (`backend/devices.py`) and that no worker seen in this
    #: many seconds can serve, after waiting as long, fails `no_capable_worker`
    unservable_after_s: float = 300.0
    #: per-team defaults (`backend/tenancy.py`; an admin sets a team's own in `team_limits`):
    #: jobs of a team running at once (workers skip the team's queued jobs beyond it)
    team_max_running_jobs: int = 2
    #: jobs of a team queued or running; a create beyond it is a 429 `too_many_jobs`
    team_max_queued_jobs: int = 50
    #: API requests a minute per team, per API process (a burst of a minute's worth is
    #: allowed); beyond it a 429 `rate_limited`
    team_requests_per_minute: int = 600
    #: address space of the engine process running one job; beyond it `out_of_memory`
    job_memory_bytes: int = 8 * 1024**3
    #: lifetime of a browser session and of the one-time login link
    session_ttl_s: float = 14 * 24 * 3600.0
    login_link_ttl_s: float = 24 * 3600.0
    #: API requests served at once (`backend/admission.py`); the database pool holds as many,
    #: and the fast lane's
    api_slots: int = 16
    #: of those, writes at once (0: 2 on SQLite, which serializes writes, else half)
    api_write_slots: int = 0
    #: longest wait for a slot before a 503 with Retry-After
    api_wait_s: float = 10.0
    #: plan reads served at once by the fast lane beside them (`backend/fast_reads.py`)
    fast_read_slots: int = 4

    @staticmethod
    def from_env(env: dict[str, str] | None = None) -> Settings:
        """Settings from `env` (default: os.environ); the data directory is created."""
        env = dict(os.environ if env is None else env)
        data_dir = Path(env.get("SHARDLAB_DATA_DIR", "data")).expanduser().resolve()
        data_dir.mkdir(parents=True, exist_ok=True)
        url = env.get("SHARDLAB_DATABASE_URL") or f"sqlite:///{data_dir / 'shardlab.db'}"
        defaults = Settings(data_dir, url)
        numbers = {}
        for name in (
            "max_request_bytes",
            "max_graph_ops",
            "heartbeat_timeout_s",
            "heartbeat_interval_s",
            "max_attempts",
            "job_deadline_s",
            "unservable_after_s",
            "team_max_running_jobs",
            "team_max_queued_jobs",
            "team_requests_per_minute",
            "job_memory_bytes",
            "session_ttl_s",
            "login_link_ttl_s",
            "api_slots",
            "api_write_slots",
            "api_wait_s",
            "fast_read_slots",
        ):
            raw = env.get(f"SHARDLAB_{name.upper()}")
            if raw is None:
                continue
            kind = type(getattr(defaults, name))
            try:
                numbers[name] = kind(raw)
            except ValueError as exc:
                raise ValueError(
                    f"SHARDLAB_{name.upper()}={raw!r} is not a {kind.__name__}"
                ) from exc
        return Settings(data_dir, url, **numbers)
