"""Who is asking: API tokens (bearer, for CI) and browser sessions (cookie), both stored as
SHA-256 hashes; the secret itself is shown once and never stored."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from backend.orm import ApiToken, BrowserSession, Team, User

TOKEN_PREFIX = "shl_"
SESSION_COOKIE = "shardlab_session"


@dataclass(frozen=True, slots=True)
class Principal:
    """The authenticated caller: whose team's data it may read and change, and as whom.

    `user_id` None is a team token (no person). `is_admin`: an admin of the caller's team;
    `is_service_admin`: an admin of the whole service (every team). `expires_at`: when the
    caller's token stops working (None: a browser session, or a token that never expires);
    a token it mints never outlives it."""

    team_id: int
    user_id: int | None
    is_admin: bool
    via: str  # token | session
    is_service_admin: bool = False
    expires_at: datetime | None = None


def bearer_secret(header: str) -> str | None:
    """The token of an `Authorization: Bearer <token>` header's value, else None (another
    scheme, or an empty credential)."""
    scheme, _, secret = header.strip().partition(" ")
    secret = secret.strip()
    return secret if scheme.lower() == "bearer" and secret else None


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


class TokenExpired(Exception):
    """The API token is known and not revoked, but its `expires_at` has passed."""

    def __init__(self, expired_at: datetime) -> None:
        super().__init__(f"API token expired at {expired_at.isoformat()}")
        self.expired_at = expired_at


def create_token(
    session: Session,
    team_id: int,
    name: str,
    user_id: int | None = None,
    expires_at: datetime | None = None,
) -> str:
    """A new API token for the team, valid until `expires_at` (None: no expiry); returns the
    secret (only its hash is stored)."""
    secret = new_secret(TOKEN_PREFIX)
    session.add(
        ApiToken(
            team_id=team_id,
            user_id=user_id,
            name=name,
            token_hash=digest(secret),
            prefix=secret[: len(TOKEN_PREFIX) + 6],
            expires_at=expires_at,
        )
    )
    session.flush()
    return secret


#: a token's principal, built once (every API request runs it)
TOKEN_QUERY = (
    select(ApiToken.team_id, ApiToken.user_id, ApiToken.revoked_at, ApiToken.expires_at,
           User.is_admin, User.is_service_admin)
    .outerjoin(User, User.id == ApiToken.user_id)
    .where(ApiToken.token_hash == bindparam("digest"))
)  # fmt: skip


def principal_from_token(session: Session, secret: str) -> Principal | None:
    """The principal of a live (not revoked) API token, or None; TokenExpired once its
    `expires_at` has passed. One Core query (token and user): every API request runs it."""
    row = session.connection().execute(TOKEN_QUERY, {"digest": digest(secret)}).first()
    if row is None or row.revoked_at is not None:
        return None
    expires_at = _aware(row.expires_at) if row.expires_at is not None else None
    if expires_at is not None and expires_at <= datetime.now(UTC):
        raise TokenExpired(expires_at)
    admin = bool(row.is_admin)
    return Principal(row.team_id, row.user_id, admin, "token",
                     is_service_admin=admin and bool(row.is_service_admin),
                     expires_at=expires_at)  # fmt: skip


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
    return Principal(user.team_id, user.id, user.is_admin, "session",
                     is_service_admin=user.is_admin and user.is_service_admin)  # fmt: skip


def _aware(moment: datetime) -> datetime:
    """SQLite returns naive datetimes; they are stored in UTC."""
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
