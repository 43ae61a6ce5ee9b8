"""Logging in (one-time links, browser sessions), who am I, API tokens, admin user creation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.responses import RedirectResponse
from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError

from backend.auth import SESSION_COOKIE, Principal, create_token, digest, ensure_team, new_secret
from backend.bootstrap import issue_login_link, login_path
from backend.deps import PrincipalDep, SessionDep, SettingsDep
from backend.errors import ApiError, not_found
from backend.orm import ApiToken, BrowserSession, LoginLink, Team, User
from backend.ownership import may_add_user, require_removal
from backend.schemas.auth import (
    MAX_TOKEN_DAYS,
    Me,
    TokenCreate,
    TokenCreated,
    TokenInfo,
    UserCreate,
    UserCreated,
)
from backend.schemas.common import errors

router = APIRouter(tags=["auth"])

#: ids are 32-bit INTEGER columns; larger numbers are a 422, not a database overflow
TokenId = Annotated[int, Path(ge=1, le=2**31 - 1, description="The token's id.")]


def _utc(moment: datetime) -> datetime:
    """SQLite returns naive datetimes; they are stored in UTC."""
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _token_info(token: ApiToken) -> TokenInfo:
    return TokenInfo(
        id=token.id,
        name=token.name,
        prefix=token.prefix,
        created_at=_utc(token.created_at),
        revoked_at=_utc(token.revoked_at) if token.revoked_at else None,
        expires_at=_utc(token.expires_at) if token.expires_at else None,
    )


@router.get(
    "/api/auth/login",
    status_code=303,
    response_class=RedirectResponse,
    responses={303: {"description": "Logged in: session cookie set"}, **errors(401, 422)},
)
def login(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    link: str = Query(min_length=1, max_length=200, description="The one-time link's secret."),
) -> RedirectResponse:
    """Consume a one-time login link: start a browser session (cookie) and go to the UI."""
    row = session.scalar(select(LoginLink).where(LoginLink.link_hash == digest(link)))
    now = datetime.now(UTC)
    if row is None:
        raise ApiError(401, "invalid_login_link", "unknown login link", reason="unknown")
    if row.used_at is not None:
        raise ApiError(401, "invalid_login_link", "this login link was already used", reason="used")
    if _utc(row.expires_at) <= now:
        raise ApiError(401, "invalid_login_link", "this login link has expired", reason="expired")
    # consume atomically: of two concurrent requests with one link, only one logs in
    taken = session.execute(
        update(LoginLink)
        .where(LoginLink.id == row.id, LoginLink.used_at.is_(None))
        .values(used_at=now)
    )
    if getattr(taken, "rowcount", 0) != 1:
        session.rollback()
        raise ApiError(401, "invalid_login_link", "this login link was already used", reason="used")
    secret = new_secret()
    session.add(
        BrowserSession(
            user_id=row.user_id,
            session_hash=digest(secret),
            expires_at=now + timedelta(seconds=settings.session_ttl_s),
        )
    )
    session.commit()
    response = RedirectResponse("/", status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        secret,
        max_age=int(settings.session_ttl_s),
        path="/",
        httponly=True,
        samesite="lax",
        secure=request.url.scheme == "https",
    )
    return response


@router.post("/api/auth/logout", status_code=204, responses=errors(422))
def logout(request: Request, session: SessionDep) -> Response:
    """End this browser's session (if any) and clear its cookie."""
    cookie = request.cookies.get(SESSION_COOKIE)
    if cookie:
        row = session.scalar(
            select(BrowserSession).where(BrowserSession.session_hash == digest(cookie))
        )
        if row is not None:
            session.delete(row)
            session.commit()
    response = Response(status_code=204)
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="lax")
    return response


@router.get("/api/me", responses=errors(401))
def me(principal: PrincipalDep, session: SessionDep) -> Me:
    """The caller: user name (None for a team token), team, admin flags, how it logged in."""
    team = session.get(Team, principal.team_id)
    user = session.get(User, principal.user_id) if principal.user_id is not None else None
    return Me(
        user=user.name if user else None,
        team=team.name if team else "",
        is_admin=principal.is_admin,
        is_service_admin=principal.is_service_admin,
        via="session" if principal.via == "session" else "token",
    )


def token_expiry(principal: Principal, body: TokenCreate) -> datetime:
    """When a token `principal` asks for expires: as asked, else when the caller's own
    token does, else in `MAX_TOKEN_DAYS` days; 422 naming the field when asked for later
    than the caller's token lasts (a token never outlives its parent)."""
    asked = body.expiry()
    parent = principal.expires_at
    if asked is None:
        return parent or datetime.now(UTC) + timedelta(days=MAX_TOKEN_DAYS)
    if parent is not None and asked > parent:
        field = "expires_at" if body.expires_at is not None else "expires_in_days"
        raise ApiError(422, "invalid_request", f"body.{field}: the new token would expire at "
                       f"{asked.isoformat()}, after the token asking for it "
                       f"({parent.isoformat()}): a token never outlives the token that made it",
                       field=field, parent_expires_at=parent.isoformat())  # fmt: skip
    return asked


@router.post("/api/tokens", status_code=201, responses=errors(401, 422))
def create_api_token(
    body: TokenCreate, principal: PrincipalDep, session: SessionDep
) -> TokenCreated:
    """A new API token acting as the caller (its team, and its person if any), expiring as
    asked (`expires_in_days` or `expires_at`, at most 3650 days ahead), by default when the
    caller's token does, or in 3650 days; never after the caller's token (422). The secret
    is in this answer only."""
    expires_at = token_expiry(principal, body)
    secret = create_token(
        session, principal.team_id, body.name, principal.user_id, expires_at=expires_at
    )
    token = session.scalar(select(ApiToken).where(ApiToken.token_hash == digest(secret)))
    assert token is not None
    session.commit()
    return TokenCreated(
        id=token.id,
        name=token.name,
        prefix=token.prefix,
        token=secret,
        created_at=_utc(token.created_at),
        expires_at=_utc(token.expires_at) if token.expires_at else None,
    )


@router.get("/api/tokens", responses=errors(401))
def list_api_tokens(principal: PrincipalDep, session: SessionDep) -> list[TokenInfo]:
    """The team's tokens, revoked and expired ones included (with `revoked_at`, `expires_at`);
    never the secrets."""
    rows = session.scalars(
        select(ApiToken).where(ApiToken.team_id == principal.team_id).order_by(ApiToken.id)
    )
    return [_token_info(t) for t in rows]


@router.delete("/api/tokens/{token_id}", status_code=204, responses=errors(401, 404, 422))
def revoke_api_token(token_id: TokenId, principal: PrincipalDep, session: SessionDep) -> Response:
    """Revoke a token of the team (it gets 401 from now on); revoking twice is harmless. Only
    the person it acts for (a team token: the team's tokens) or an admin may (403)."""
    token = session.get(ApiToken, token_id)
    if token is None or token.team_id != principal.team_id:
        raise not_found("token", token_id)
    require_removal(principal, token.user_id, f"token {token_id}", "revoke")
    if token.revoked_at is None:
        token.revoked_at = datetime.now(UTC)
        session.commit()
    return Response(status_code=204)


@router.post("/api/admin/users", status_code=201, responses=errors(401, 403, 409, 422))
def create_user(
    body: UserCreate, principal: PrincipalDep, session: SessionDep, settings: SettingsDep
) -> UserCreated:
    """Add a person to `team` and answer their one-time login link path. A team admin adds
    members and admins to their own team; a service admin to any team (created if missing),
    and service admins (403 otherwise)."""
    own = session.get(Team, principal.team_id)
    own_name = own.name if own is not None else ""
    if not may_add_user(principal, own_name, body.team, body.is_service_admin):
        what = ("make a service admin" if body.is_service_admin
                else f"add people to team {body.team!r}")  # fmt: skip
        who = "a service admin" if body.is_service_admin or body.team != own_name else "an admin"
        raise ApiError(403, "forbidden", f"only {who} may {what}", team=body.team)
    if session.scalar(select(User.id).where(User.name == body.name)) is not None:
        raise ApiError(409, "conflict", f"user {body.name!r} already exists", user=body.name)
    try:
        team = ensure_team(session, body.team)
        user = User(team_id=team.id, name=body.name, is_service_admin=body.is_service_admin,
                    is_admin=body.is_admin or body.is_service_admin)  # fmt: skip
        session.add(user)
        session.flush()
    except IntegrityError:  # created concurrently by another request
        session.rollback()
        raise ApiError(
            409, "conflict", f"user {body.name!r} already exists", user=body.name
        ) from None
    secret, expires = issue_login_link(session, user.id, settings.login_link_ttl_s)
    session.commit()
    return UserCreated(
        id=user.id,
        name=user.name,
        team=team.name,
        is_admin=user.is_admin,
        is_service_admin=user.is_service_admin,
        login_link=login_path(secret),
        link_expires_at=expires,
    )
