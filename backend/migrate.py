"""Database migrations (Alembic, scripts in `alembic/`): `shardlab db upgrade` and friends."""

from __future__ import annotations

from pathlib import Path

from alembic.config import Config

from alembic import command
from backend.db import normalize_url

SCRIPTS = Path(__file__).resolve().parent.parent / "alembic"


def alembic_config(url: str) -> Config:
    """An Alembic config for the database at `url`, with the project's migration scripts."""
    config = Config()
    config.set_main_option("script_location", str(SCRIPTS))
    config.set_main_option("sqlalchemy.url", normalize_url(url).replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the database at `url` up to `revision` (default: the newest)."""
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    """Take the database at `url` down to `revision` (`base`: no tables)."""
    command.downgrade(alembic_config(url), revision)


def current(url: str) -> str | None:
    """The revision the database at `url` is at (None: not migrated)."""
    from alembic.runtime.migration import MigrationContext

    from backend.db import make_engine

    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
