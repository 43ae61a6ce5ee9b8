"""The `shardlab` command as installed: the engine's commands plus the service's.

`serve`, `worker`, `db` and `token` need the service (database, app, job ledger), so they live
here and register on the engine's Typer app: the service depends on the engine, never the
other way round (`shardlab/` imports neither `backend` nor `worker`).
"""

from backend.cli import db_cmd, serve_cmd, token_cmd, worker_cmd  # noqa: F401  (register)
from shardlab.cli import app

__all__ = ["app"]
