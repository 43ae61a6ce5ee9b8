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
    #: default wall-clock limit of a job
    job_deadline_s: float = 3600.0
    #: lifetime of a browser session and of the one-time login link
    session_ttl_s: float = 14 * 24 * 3600.0
    login_link_ttl_s: float = 24 * 3600.0

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
            "session_ttl_s",
            "login_link_ttl_s",
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
