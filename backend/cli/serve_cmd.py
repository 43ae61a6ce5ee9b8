"""`shardlab serve`: migrate, bootstrap the first admin, keep a worker running
(`worker_keeper`), serve the API and UI."""

from __future__ import annotations

import signal
from types import FrameType
from typing import Annotated, NoReturn

import typer

from backend.cli.worker_keeper import WorkerKeeper
from shardlab.cli.common import app


def public_host(host: str) -> str:
    """The host to print in URLs: a wildcard bind address is reached through localhost."""
    return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
    no_worker: Annotated[
        bool, typer.Option("--no-worker", help="Do not start a job worker alongside.")
    ] = False,
    demo: Annotated[
        bool,
        typer.Option("--demo", help="Add demo models, strategies and plans to the admin's team."),
    ] = False,
) -> None:
    """Start the web service (API under /api, UI at /) with one job worker.

    The database (SHARDLAB_DATABASE_URL, or SQLite in SHARDLAB_DATA_DIR) is migrated first;
    on a fresh one the first admin's one-time login link is printed.
    """
    import uvicorn

    from backend import migrate
    from backend.app import create_app
    from backend.bootstrap import ADMIN_TEAM, admin_team_id, first_admin_link
    from backend.db import make_engine, session_factory, transaction
    from backend.redact import uvicorn_log_config
    from backend.settings import Settings

    try:
        settings = Settings.from_env()
        migrate.upgrade(settings.database_url)
    except Exception as exc:  # bad settings or an unreachable database: one line
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    engine = make_engine(settings.database_url)
    try:
        factory = session_factory(engine)
        link = first_admin_link(factory, settings)
        if link is not None:
            typer.echo(
                "shardlab: first start; log in as admin (one-time link, valid "
                f"{settings.login_link_ttl_s / 3600:g} h):\n"
                f"  http://{public_host(host)}:{port}{link}",
                err=True,
            )
        if demo:
            from backend.auth import ensure_team
            from backend.demo import seed_demo

            team_id = admin_team_id(factory)
            if team_id is None:
                with transaction(factory, immediate=True) as session:
                    team_id = ensure_team(session, ADMIN_TEAM).id
            added = seed_demo(factory, team_id, settings)
            if added:
                typer.echo(f"shardlab: demo data added: {', '.join(added)}", err=True)
    finally:
        engine.dispose()

    worker = None
    if not no_worker:  # kept running: restarted with backoff whenever it dies
        worker = WorkerKeeper(lambda line: typer.echo(line, err=True))
        worker.start()
    typer.echo(f"shardlab: serving on http://{public_host(host)}:{port}/", err=True)
    # uvicorn shuts down gracefully on SIGTERM, then raises it again with the previous
    # handler; make that an exception (not an instant death) so the worker is stopped too
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        uvicorn.run(
            create_app(settings),
            host=host,
            port=port,
            log_level="info",
            log_config=uvicorn_log_config(),  # no login-link secrets in the access log
        )
    finally:
        if worker is not None:
            worker.stop()


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> NoReturn:
    raise SystemExit(128 + signum)
