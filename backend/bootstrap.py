"""The first administrator and one-time login links.

On a database without users, `first_admin_link` creates team `default`, user `admin` and a
login link; `shardlab serve` prints it. Links (like sessions and tokens) are stored only as
SHA-256 hashes, so a link can be shown once and never recovered from the database.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from backend.auth import digest, ensure_team, new_secret
from backend.db import transaction
from backend.orm import LoginLink, User
from backend.settings import Settings

LOGIN_PATH = "/api/auth/login"
ADMIN_TEAM = "default"
ADMIN_USER = "admin"


def login_path(secret: str) -> str:
    """The URL path (with query) that consumes the login link `secret`."""
    return f"{LOGIN_PATH}?link={secret}"


def issue_login_link(session: Session, user_id: int, ttl_s: float) -> tuple[str, datetime]:
    """A new one-time login link for the user: (its secret, when it expires)."""
    secret = new_secret()
    expires = datetime.now(UTC) + timedelta(seconds=ttl_s)
    session.add(LoginLink(user_id=user_id, link_hash=digest(secret), expires_at=expires))
    session.flush()
    return secret, expires


def first_admin_link(factory: sessionmaker[Session], settings: Settings) -> str | None:
    """On a database without users: create the first admin and return its login link path.

    Returns `/api/auth/login?link=...` (valid `settings.login_link_ttl_s` seconds), or None
    when the database already has users.
    """
    with transaction(factory, immediate=True) as session:
        if session.scalar(select(func.count()).select_from(User)):
            return None
        team = ensure_team(session, ADMIN_TEAM)
        admin = User(team_id=team.id, name=ADMIN_USER, is_admin=True, is_service_admin=True)
        session.add(admin)
        session.flush()
        secret, _ = issue_login_link(session, admin.id, settings.login_link_ttl_s)
    return login_path(secret)


def admin_team_id(factory: sessionmaker[Session]) -> int | None:
    """The team of the first administrator (the oldest admin user), or None."""
    with factory() as session:
        return session.scalar(
            select(User.team_id).where(User.is_admin.is_(True)).order_by(User.id).limit(1)
        )
