"""Alembic migrations against both databases: up, down, up again, and no drift from the ORM."""

from __future__ import annotations

from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

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
