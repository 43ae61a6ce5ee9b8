"""API test fixtures: the same suite against SQLite and PostgreSQL.

`db_url` is parametrized: a fresh SQLite file per test, and the `test` database on
127.0.0.1:5432 (trust auth), wiped to an empty schema and migrated for each test. The
PostgreSQL cases are skipped only when `SHARDLAB_SKIP_POSTGRES=1`; otherwise an unreachable
server is an error (make test starts it).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import text

from backend import migrate
from backend.app import create_app
from backend.auth import create_token, ensure_team
from backend.db import make_engine, session_factory, transaction
from backend.settings import Settings

POSTGRES_URL = os.environ.get(
    "SHARDLAB_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)


def _wipe_postgres(url: str) -> None:
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated, empty database of each kind."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'shardlab.db'}"
    else:
        if os.environ.get("SHARDLAB_SKIP_POSTGRES") == "1":
            pytest.skip("SHARDLAB_SKIP_POSTGRES=1")
        url = POSTGRES_URL
        _wipe_postgres(url)
    migrate.upgrade(url)
    return url


@pytest.fixture
def settings(db_url: str, tmp_path: Path) -> Settings:
    return Settings.from_env(
        {"SHARDLAB_DATA_DIR": str(tmp_path / "data"), "SHARDLAB_DATABASE_URL": db_url}
    )


@pytest.fixture
def app(settings: Settings) -> Iterator[FastAPI]:
    application = create_app(settings)
    yield application
    application.state.engine.dispose()


def token_for(settings: Settings, team: str, name: str = "test") -> str:
    """A fresh API token of `team` (created if missing)."""
    engine = make_engine(settings.database_url)
    try:
        with transaction(session_factory(engine)) as session:
            return create_token(session, ensure_team(session, team).id, name)
    finally:
        engine.dispose()


@pytest.fixture
def client(app: FastAPI, settings: Settings) -> Iterator[TestClient]:
    """A client authenticated with an API token of team `alpha`."""
    with TestClient(app) as c:
        c.headers["Authorization"] = f"Bearer {token_for(settings, 'alpha')}"
        yield c


@pytest.fixture
def other_client(app: FastAPI, settings: Settings) -> Iterator[TestClient]:
    """A client authenticated with an API token of team `beta`."""
    with TestClient(app) as c:
        c.headers["Authorization"] = f"Bearer {token_for(settings, 'beta')}"
        yield c
