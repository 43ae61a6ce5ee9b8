"""`shardlab worker`: run queued jobs (plans, verifications, comparisons) from the database."""

from __future__ import annotations

import logging
import signal
from typing import Annotated, Any

import typer

from shardlab.cli.common import app


@app.command("worker")
def worker_cmd(
    once: Annotated[
        bool, typer.Option("--once", help="Process at most one job, then exit.")
    ] = False,
    worker_id: Annotated[
        str | None, typer.Option("--id", help="Worker name in the ledger (default host-pid).")
    ] = None,
    poll_s: Annotated[float, typer.Option(help="Seconds between looks at an empty queue.")] = 0.5,
) -> None:
    """Claim jobs from the database (SHARDLAB_DATABASE_URL) and run each in a child process,
    until SIGTERM or SIGINT (the running job then goes back to the queue)."""
    from backend.settings import Settings
    from worker.main import Worker

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    worker = Worker(Settings.from_env(), worker_id, poll_s)

    def _stop(signum: int, frame: Any) -> None:
        worker.stop()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    typer.echo(f"shardlab worker {worker.worker_id}: waiting for jobs", err=True)
    try:
        worker.run(once=once)
    finally:
        worker.close()
