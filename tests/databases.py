"""Migrated, empty databases for the service and worker tests, made fast.

Migrating costs about 0.15 s on SQLite and 0.4 s on PostgreSQL, and hundreds of tests each
want a fresh database. So the schema is migrated once per test process and then:
- SQLite: the migrated file (`sqlite_template`) is copied for each test;
- PostgreSQL: this process's schema of the `test` database (`SCHEMA`, so that parallel runs
  never touch each other's tables) is emptied with `TRUNCATE ... RESTART IDENTITY`, unless
  a test left it at another revision (the migration tests downgrade), in which case it is
  dropped and migrated again.

The two fixtures are registered by `tests/conftest.py`; `fresh_database` is the entry point.
`SHARDLAB_SKIP_POSTGRES=1` skips the PostgreSQL cases; otherwise an unreachable server is an
error (make test starts it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, text

from backend import migrate
from backend.db import make_engine

POSTGRES_URL = os.environ.get(
    "SHARDLAB_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
#: this test process's schema of the shared `test` database
SCHEMA = f"shardlab_test_{os.getpid()}"


def postgres_url() -> str:
    """The test database URL with this process's schema as the search path."""
    sep = "&" if "?" in POSTGRES_URL else "?"
    return f"{POSTGRES_URL}{sep}options=-csearch_path%3D{SCHEMA}"


def skip_postgres() -> bool:
    return os.environ.get("SHARDLAB_SKIP_POSTGRES") == "1"


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated, empty SQLite file to copy."""
    path = tmp_path_factory.mktemp("template") / "shardlab.db"
    migrate.upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture(scope="session")
def postgres_admin() -> Iterator[Engine]:
    """A connection pool to the `test` database; this process's schema goes at the end."""
    engine = make_engine(POSTGRES_URL)
    yield engine
    # the server may have gone away: nothing left to clean then
    with contextlib.suppress(Exception), engine.begin() as conn:
        conn.execute(text(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE'))
    engine.dispose()


def _head_revision() -> str:
    head = ScriptDirectory.from_config(migrate.alembic_config(POSTGRES_URL)).get_current_head()
    assert head is not None
    return head


def _empty_postgres(engine: Engine) -> str:
    """Empty this process's schema (migrating it first if it is missing or not at head)."""
    with engine.begin() as conn:
        tables = [
            row[0]
            for row in conn.execute(
                text("SELECT tablename FROM pg_tables WHERE schemaname = :s"), {"s": SCHEMA}
            )
        ]
        at_head = False
        if "alembic_version" in tables:
            version = conn.execute(text(f'SELECT version_num FROM "{SCHEMA}".alembic_version'))
            at_head = [row[0] for row in version] == [_head_revision()]
        if at_head:
            data = ", ".join(f'"{SCHEMA}"."{t}"' for t in tables if t != "alembic_version")
            if data:
                conn.execute(text(f"TRUNCATE {data} RESTART IDENTITY CASCADE"))
            return postgres_url()
        conn.execute(text(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE'))
        conn.execute(text(f'CREATE SCHEMA "{SCHEMA}"'))
    migrate.upgrade(postgres_url())
    return postgres_url()


def fresh_database(request: pytest.FixtureRequest, kind: str, tmp_path: Path) -> str:
    """The URL of a migrated, empty database of `kind` (sqlite | postgresql)."""
    if kind == "sqlite":
        path = tmp_path / "shardlab.db"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        return f"sqlite:///{path}"
    if skip_postgres():
        pytest.skip("SHARDLAB_SKIP_POSTGRES=1")
    return _empty_postgres(request.getfixturevalue("postgres_admin"))
