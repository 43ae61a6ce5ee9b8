"""Who is asking: API tokens (bearer, for CI) and browser sessions (cookie), both stored as
SHA-256 hashes; the secret itself is shown once and never stored."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.orm import ApiToken, BrowserSession, Team, User

TOKEN_PREFIX = "shl_"
SESSION_COOKIE = "shardlab_session"


@dataclass(frozen=True, slots=True)
class Principal:
    """The authenticated caller: whose team's data it may read and change."""

    team_id: int
    user_id: int | None
    is_admin: bool
    via: str  # token | session


def digest(secret: str) -> str:
    """The SHA-256 hex digest stored in place of a secret."""
    return hashlib.sha256(secret.encode()).hexdigest()


def new_secret(prefix: str = "") -> str:
    return prefix + secrets.token_urlsafe(32)


def ensure_team(session: Session, name: str) -> Team:
    """The team called `name`, created if missing."""
    team = session.scalar(select(Team).where(Team.name == name))
    if team is None:
        team = Team(name=name)
        session.add(team)
        session.flush()
    return team


def create_token(session: Session, team_id: int, name: str, user_id: int | None = None) -> str:
    """A new API token for the team; returns the secret (only its hash is stored)."""
    secret = new_secret(TOKEN_PREFIX)
    session.add(
        ApiToken(
            team_id=team_id,
            user_id=user_id,
            name=name,
            token_hash=digest(secret),
            prefix=secret[: len(TOKEN_PREFIX) + 6],
        )
    )
    session.flush()
    return secret


def principal_from_token(session: Session, secret: str) -> Principal | None:
    """The principal of a live (not revoked) API token, or None."""
    token = session.scalar(select(ApiToken).where(ApiToken.token_hash == digest(secret)))
    if token is None or token.revoked_at is not None:
        return None
    admin = False
    if token.user_id is not None:
        user = session.get(User, token.user_id)
        admin = bool(user and user.is_admin)
    return Principal(token.team_id, token.user_id, admin, "token")


def principal_from_session(session: Session, secret: str) -> Principal | None:
    """The principal of a live browser session, or None."""
    row = session.scalar(
        select(BrowserSession).where(BrowserSession.session_hash == digest(secret))
    )
    if row is None or _aware(row.expires_at) <= datetime.now(UTC):
        return None
    user = session.get(User, row.user_id)
    if user is None:
        return None
    return Principal(user.team_id, user.id, user.is_admin, "session")


def _aware(moment: datetime) -> datetime:
    """SQLite returns naive datetimes; they are stored in UTC."""
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
