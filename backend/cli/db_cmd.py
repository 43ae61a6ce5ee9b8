"""`shardlab db upgrade|downgrade|current`: the service database's schema (Alembic)."""

from __future__ import annotations

from typing import Annotated, NoReturn

import typer

from shardlab.cli.common import app

db_app = typer.Typer(
    help="The service database: migrate it up or down, show its revision. The database is "
    "SHARDLAB_DATABASE_URL, or SQLite in SHARDLAB_DATA_DIR (default ./data).",
    no_args_is_help=True,
)
app.add_typer(db_app, name="db")


def _database_url() -> str:
    from backend.settings import Settings

    return Settings.from_env().database_url


def _fail(exc: Exception) -> NoReturn:
    typer.echo(f"error: {exc}", err=True)
    raise typer.Exit(1)


@db_app.command()
def upgrade(
    revision: Annotated[str, typer.Argument(help="Target revision.")] = "head",
) -> None:
    """Migrate the database up to REVISION (default: the newest)."""
    from backend import migrate

    url = _database_url()
    try:
        migrate.upgrade(url, revision)
    except Exception as exc:  # a bad revision or an unreachable database: one line
        _fail(exc)
    typer.echo(f"database at revision {migrate.current(url) or 'base'}", err=True)


@db_app.command()
def downgrade(
    revision: Annotated[str, typer.Argument(help="Target revision ('base': no tables).")],
) -> None:
    """Migrate the database down to REVISION."""
    from backend import migrate

    url = _database_url()
    try:
        migrate.downgrade(url, revision)
    except Exception as exc:
        _fail(exc)
    typer.echo(f"database at revision {migrate.current(url) or 'base'}", err=True)


@db_app.command()
def current() -> None:
    """Print the database's revision ('base' when not migrated)."""
    from backend import migrate

    try:
        typer.echo(migrate.current(_database_url()) or "base")
    except Exception as exc:
        _fail(exc)
