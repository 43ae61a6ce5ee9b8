"""Typed FastAPI dependencies: settings, a database session, the authenticated principal
(rate-limited per team)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from backend.auth import (
    SESSION_COOKIE,
    Principal,
    TokenExpired,
    bearer_secret,
    principal_from_session,
    principal_from_token,
)
from backend.bootstrap import LOGIN_PATH
from backend.errors import ApiError
from backend.rate_limit import RateLimiter, rate_limited
from backend.settings import Settings
from backend.tenancy import team_limits


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


#: GET requests that write (consuming a one-time login link)
WRITING_GETS = frozenset({LOGIN_PATH})


async def get_session(request: Request) -> AsyncIterator[Session]:
    """A session per request; the router commits what it wants kept, the rest rolls back.

    The session opens its transaction at its first statement, so a router that checks its
    input first (a large graph, a strategy against the model) holds no lock meanwhile.
    Requests that write take SQLite's write lock at that BEGIN (`BEGIN IMMEDIATE`, waiting
    out the busy timeout): a deferred transaction that reads and then writes while a worker
    commits would fail at once with "database is locked". PostgreSQL ignores the option.

    `async`: making a session does no I/O (the connection comes at the first statement, in
    the endpoint's thread), and closing one is a quick rollback, so this dependency runs in
    the event loop and costs the request no thread hop in and out.
    """
    writes = request.method not in ("GET", "HEAD", "OPTIONS") or request.url.path in WRITING_GETS
    factory = request.app.state.write_sessions if writes else request.app.state.sessions
    with factory() as session:
        yield session


#: set in the ASGI scope of a request already counted against its team's rate (the fast lane
#: of `backend.fast_reads` counts the requests it passes on)
RATE_TAKEN = "shardlab.rate_taken"


def current_principal(request: Request) -> Principal:
    """The caller from `Authorization: Bearer <token>` or the session cookie; 401 if neither.
    Looked up in a short read session of its own, so the request's session (and, for a
    write, SQLite's write lock) starts only when the router first needs it. The request
    counts against the team's requests a minute: 429 `rate_limited` beyond them."""
    with request.app.state.sessions() as session:
        principal = principal_of(request, session)
        if not request.scope.get(RATE_TAKEN):
            check_rate(request, session, principal)
    return principal


def check_rate(request: Request, session: Session, principal: Principal) -> None:
    """Take one of the team's requests this minute (`backend.rate_limit`), or refuse."""
    limiter: RateLimiter = request.app.state.rate_limiter
    team, settings = principal.team_id, get_settings(request)
    per_minute = limiter.limit_of(
        team, lambda: team_limits(session, settings, team).requests_per_minute
    )
    wait_s = limiter.take(team, per_minute)
    if wait_s > 0:
        raise rate_limited(per_minute, wait_s)


def principal_of(request: Request, session: Session) -> Principal:
    """The caller of `request`, looked up in `session` (401 when unknown). A request with an
    `Authorization` header is authenticated by it alone, even when it is empty (then 401):
    it never falls back to the session cookie (`backend.security` relies on that)."""
    header = request.headers.get("authorization")
    if header is not None:
        secret = bearer_secret(header)
        if secret is None:
            raise ApiError(401, "unauthorized", "Authorization must be 'Bearer <token>'")
        try:
            found = principal_from_token(session, secret)
        except TokenExpired as exc:
            raise ApiError(401, "token_expired", f"token expired at "
                           f"{exc.expired_at.isoformat()}: create a new one",
                           expired_at=exc.expired_at.isoformat()) from None  # fmt: skip
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
