"""Database migrations (Alembic, scripts in `alembic/`): `shardlab db upgrade` and friends.

Upgrades and downgrades hold a lock for their whole run, so that two at once (two servers
starting together: `serve` migrates on start) take turns and the second finds the schema
at head: a PostgreSQL advisory lock (`pg_advisory_lock`), or on SQLite an exclusive
`flock` on a file next to the database (`<database>.migrate.lock`).
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic.config import Config
from sqlalchemy import make_url, text

from alembic import command
from backend.db import make_engine, normalize_url

SCRIPTS = Path(__file__).resolve().parent.parent / "alembic"
#: the advisory lock's key (any constant bigint shared by every Shardlab process)
ADVISORY_LOCK_KEY = 0x5348_4152_444C_4142  # "SHARDLAB"


@contextmanager
def migration_lock(url: str) -> Iterator[None]:
    """Hold the database's migration lock for the block (waiting for it if taken)."""
    parsed = make_url(normalize_url(url))
    backend = parsed.get_backend_name()
    if backend == "postgresql":
        with advisory_lock(url):
            yield
        return
    lock_file = sqlite_lock_file(parsed.database) if backend == "sqlite" else None
    if lock_file is None:
        yield
        return
    with file_lock(lock_file):
        yield


@contextmanager
def advisory_lock(url: str) -> Iterator[None]:
    """PostgreSQL's session-level advisory lock `ADVISORY_LOCK_KEY`, on a connection of its own
    (held across commits until unlocked; released by the server if the process dies)."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": ADVISORY_LOCK_KEY})
            conn.commit()
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": ADVISORY_LOCK_KEY})
                conn.commit()
    finally:
        engine.dispose()


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive `flock` on `path` (created if missing; released if the process dies)."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def sqlite_lock_file(database: str | None) -> Path | None:
    """The lock file of a SQLite database file (None: in memory, or no such directory)."""
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    path = Path(database)
    if not path.parent.is_dir():
        return None
    return path.with_name(path.name + ".migrate.lock")


def alembic_config(url: str) -> Config:
    """An Alembic config for the database at `url`, with the project's migration scripts."""
    config = Config()
    config.set_main_option("script_location", str(SCRIPTS))
    config.set_main_option("sqlalchemy.url", normalize_url(url).replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the database at `url` up to `revision` (default: the newest), under the lock."""
    with migration_lock(url):
        command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    """Take the database at `url` down to `revision` (`base`: no tables), under the lock."""
    with migration_lock(url):
        command.downgrade(alembic_config(url), revision)


def current(url: str) -> str | None:
    """The revision the database at `url` is at (None: not migrated)."""
    from alembic.runtime.migration import MigrationContext

    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
