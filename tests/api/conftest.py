"""API test fixtures: the same suite against SQLite and PostgreSQL.

`db_url` is parametrized: a fresh SQLite file per test, and the `test` database on
127.0.0.1:5432 (trust auth) in a schema of this process's own, emptied for each test
(`tests/databases.py`). The PostgreSQL cases are skipped only when
`SHARDLAB_SKIP_POSTGRES=1`; otherwise an unreachable server is an error (make test starts it).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from backend.app import create_app
from backend.auth import create_token, ensure_team
from backend.db import make_engine, session_factory, transaction
from backend.orm import User
from backend.settings import Settings
from tests.databases import fresh_database


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated, empty database of each kind (`tests/databases.py`)."""
    return fresh_database(request, request.param, tmp_path)


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
    """A fresh API token of `team` (created if missing), in a transaction that takes
    SQLite's write lock at BEGIN: a served app's worker may commit between its read and its
    write, which fails a deferred transaction at once ("database is locked")."""
    engine = make_engine(settings.database_url)
    try:
        with transaction(session_factory(engine), immediate=True) as session:
            return create_token(session, ensure_team(session, team).id, name)
    finally:
        engine.dispose()


def user_token(
    settings: Settings, team: str, user: str, admin: bool = False, service_admin: bool = False
) -> str:
    """An API token of a new user `user` of `team` (reviews are by people, not teams): a
    member, a team admin (`admin`) or a service admin (`service_admin`, an admin too)."""
    engine = make_engine(settings.database_url)
    try:
        with transaction(session_factory(engine)) as session:
            row = User(team_id=ensure_team(session, team).id, name=user,
                       is_admin=admin or service_admin, is_service_admin=service_admin)  # fmt: skip
            session.add(row)
            session.flush()
            return create_token(session, row.team_id, f"{user}'s", user_id=row.id)
    finally:
        engine.dispose()


@pytest.fixture
def user_client(app: FastAPI, settings: Settings) -> Iterator[Any]:
    """`user_client(team, user, admin=False, service_admin=False)`: a client with a new
    user's token."""
    with ExitStack() as stack:

        def make(
            team: str, user: str, admin: bool = False, service_admin: bool = False
        ) -> TestClient:
            c = stack.enter_context(TestClient(app))
            token = user_token(settings, team, user, admin, service_admin)
            c.headers["Authorization"] = f"Bearer {token}"
            return c

        yield make


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


def assert_error(response: Any, status: int, code: str, *named: str) -> dict[str, Any]:
    """The response is `status` with `{code, message, detail}` and the message names `named`."""
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    assert set(body) == {"code", "message", "detail"} and body["code"] == code, body
    for culprit in named:
        assert culprit in body["message"], (culprit, body["message"])
    return body
