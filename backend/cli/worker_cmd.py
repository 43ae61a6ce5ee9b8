"""`shardlab worker`: run queued jobs (plans, verifications, comparisons) from the database.

It reports its devices when it starts (`worker/devices.py`; `SHARDLAB_WORKER_DEVICES`
overrides them) and claims only the jobs they can serve; `--engine ray` runs device jobs on
a Ray cluster (`worker/ray_engine.py`, the `shardlab[ray]` extra)."""

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
    engine: Annotated[
        str,
        typer.Option(help="Where device jobs run: local (child processes) or ray (Ray tasks)."),
    ] = "local",
    ray_address: Annotated[
        str | None,
        typer.Option(help="With --engine ray: the cluster to join (default: start one here)."),
    ] = None,
) -> None:
    """Claim jobs from the database (SHARDLAB_DATABASE_URL) and run each in a child process,
    until SIGTERM or SIGINT (the running job then goes back to the queue)."""
    from backend.cli.worker_keeper import restarts_from_env
    from backend.settings import Settings
    from worker.main import ENGINES, Worker

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if engine not in ENGINES:
        raise typer.BadParameter(f"{engine!r}: one of {', '.join(ENGINES)}", param_hint="--engine")
    try:
        worker = Worker(Settings.from_env(), worker_id, poll_s, engine=engine,
                        ray_address=ray_address, restarts=restarts_from_env())  # fmt: skip
    except (ValueError, ImportError) as exc:
        typer.echo(f"shardlab worker: {exc}", err=True)
        raise typer.Exit(2) from None

    def _stop(signum: int, frame: Any) -> None:
        worker.stop()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    typer.echo(f"shardlab worker {worker.worker_id}: {worker.devices.describe()}", err=True)
    typer.echo(f"shardlab worker {worker.worker_id}: waiting for jobs", err=True)
    try:
        worker.announce()
        worker.run(once=once)
    finally:
        worker.close()
