"""Alembic migrations against both databases: up, down, up again, no drift from the ORM, and
concurrent upgrades taking turns under the migration lock."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text

from backend import migrate
from backend.db import make_engine
from backend.orm import Base

ORM_TABLES = set(Base.metadata.tables)


def _tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return set(inspect(conn).get_table_names())
    finally:
        engine.dispose()


def _diff(url: str) -> list[Any]:
    """The autogenerate diff between the migrated database and the ORM (empty: no drift)."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn, opts={"compare_type": True, "compare_server_default": True}
            )
            return list(compare_metadata(context, Base.metadata))
    finally:
        engine.dispose()


def test_orm_has_the_expected_tables() -> None:
    assert {"teams", "users", "api_tokens", "browser_sessions", "login_links", "jobs"} <= ORM_TABLES


def test_upgrade_downgrade_upgrade(db_url: str) -> None:
    # the fixture migrated the database; start from an empty one
    migrate.downgrade(db_url, "base")
    assert _tables(db_url) <= {"alembic_version"}
    assert migrate.current(db_url) is None

    migrate.upgrade(db_url)
    assert _tables(db_url) >= ORM_TABLES
    assert _tables(db_url) - ORM_TABLES == {"alembic_version"}
    assert migrate.current(db_url) is not None

    migrate.downgrade(db_url, "base")
    assert _tables(db_url) <= {"alembic_version"}

    migrate.upgrade(db_url, "head")
    assert ORM_TABLES | {"alembic_version"} == _tables(db_url)


def test_migrated_schema_matches_the_orm(db_url: str) -> None:
    assert _diff(db_url) == []


def test_upgrade_is_idempotent(db_url: str) -> None:
    revision = migrate.current(db_url)
    migrate.upgrade(db_url)
    assert migrate.current(db_url) == revision
    assert _diff(db_url) == []


def _empty(url: str) -> None:
    """Make the database at `url` fresh: no tables at all, not even `alembic_version`."""
    migrate.downgrade(url, "base")
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text("DROP TABLE alembic_version"))
    finally:
        engine.dispose()
    assert _tables(url) == set()


def test_concurrent_upgrades_of_a_fresh_database_both_succeed(db_url: str, tmp_path: Path) -> None:
    # two servers starting together both migrate: the lock makes them take turns
    _empty(db_url)
    env = {**os.environ, "SHARDLAB_DATABASE_URL": db_url, "SHARDLAB_DATA_DIR": str(tmp_path)}
    command = [sys.executable, "-m", "backend", "db", "upgrade"]
    procs = [
        subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err.decode()
    head = ScriptDirectory.from_config(migrate.alembic_config(db_url)).get_current_head()
    assert migrate.current(db_url) == head
    assert ORM_TABLES | {"alembic_version"} == _tables(db_url)
    assert _diff(db_url) == []


def test_migration_lock_is_exclusive(db_url: str) -> None:
    # while one process holds the lock, another cannot take it (it would wait)
    script = (
        "import sys\n"
        "from backend.migrate import migration_lock\n"
        "with migration_lock(sys.argv[1]):\n"
        "    print('locked', flush=True)\n"
        "    sys.stdin.readline()\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", script, db_url], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert holder.stdout is not None and holder.stdin is not None
    try:
        assert holder.stdout.readline() == b"locked\n"
        done = threading.Event()

        def take() -> None:
            with migrate.migration_lock(db_url):
                done.set()

        taker = threading.Thread(target=take, daemon=True)
        taker.start()
        assert not done.wait(1.0)  # blocked by the other process
        holder.stdin.write(b"\n")
        holder.stdin.flush()
        assert done.wait(30.0)  # taken once released
    finally:
        holder.kill()
        holder.wait()
