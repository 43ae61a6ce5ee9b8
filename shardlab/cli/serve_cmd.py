"""`shardlab serve`: the web service."""

from __future__ import annotations

from typing import Annotated

import typer

from shardlab.cli.common import app


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
) -> None:
    """Start the web service (API under /api, UI at /)."""
    import uvicorn

    from backend.app import create_app

    typer.echo(f"shardlab: serving on http://{host}:{port}/", err=True)
    uvicorn.run(create_app(), host=host, port=port, log_level="info")
