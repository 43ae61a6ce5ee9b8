"""Typed FastAPI dependencies: settings, a database session, the authenticated principal."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from backend.auth import SESSION_COOKIE, Principal, principal_from_session, principal_from_token
from backend.bootstrap import LOGIN_PATH
from backend.errors import ApiError
from backend.settings import Settings


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


#: GET requests that write (consuming a one-time login link)
WRITING_GETS = frozenset({LOGIN_PATH})


def get_session(request: Request) -> Iterator[Session]:
    """A session per request; the router commits what it wants kept, the rest rolls back.

    Requests that write take SQLite's write lock at BEGIN (`BEGIN IMMEDIATE`, waiting out the
    busy timeout): a deferred transaction that reads and then writes while a worker commits
    would fail at once with "database is locked". PostgreSQL ignores the option.
    """
    writes = request.method not in ("GET", "HEAD", "OPTIONS") or request.url.path in WRITING_GETS
    with request.app.state.sessions() as session:
        if writes:
            session.connection(execution_options={"sqlite_immediate": True})
        yield session


def current_principal(
    request: Request, session: Annotated[Session, Depends(get_session)]
) -> Principal:
    """The caller from `Authorization: Bearer <token>` or the session cookie; 401 if neither."""
    header = request.headers.get("authorization", "")
    if header:
        scheme, _, secret = header.partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            raise ApiError(401, "unauthorized", "Authorization must be 'Bearer <token>'")
        found = principal_from_token(session, secret.strip())
        if found is None:
            raise ApiError(401, "unauthorized", "unknown or revoked API token")
        return found
    cookie = request.cookies.get(SESSION_COOKIE)
    if cookie:
        found = principal_from_session(session, cookie)
        if found is not None:
            return found
    raise ApiError(
        401, "unauthorized", "log in (browser) or send 'Authorization: Bearer <token>' (API)"
    )


SessionDep = Annotated[Session, Depends(get_session)]
PrincipalDep = Annotated[Principal, Depends(current_principal)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
