"""Schemas of the auth endpoints: who am I, API tokens, admin user creation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from backend.schemas.common import StrictRequest

#: names of tokens, users and teams: printable, no leading or trailing blanks
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9 ._@-]*$"
#: the longest a token may be made to last, in days (ten years)
MAX_TOKEN_DAYS = 3650


class Me(BaseModel):
    """The caller: its user (None for a team API token), team, role and how it
    authenticated."""

    user: str | None
    team: str
    is_admin: bool
    is_service_admin: bool
    via: Literal["token", "session"]


class TokenCreate(StrictRequest):
    """A new API token's name (for people to tell tokens apart) and expiry: in
    `expires_in_days` days, or at `expires_at` (an offset is converted to UTC; none means
    UTC), at most `MAX_TOKEN_DAYS` days ahead; neither: when the token asking for it
    expires, else in `MAX_TOKEN_DAYS` days. A token never outlives the token that made it."""

    name: str = Field(min_length=1, max_length=100, pattern=NAME_PATTERN)
    expires_in_days: int | None = Field(default=None, ge=1, le=MAX_TOKEN_DAYS)
    #: not strict: JSON gives a timestamp as ISO 8601 text
    expires_at: datetime | None = Field(default=None, strict=False)

    @model_validator(mode="after")
    def _one_expiry(self) -> TokenCreate:
        if self.expires_in_days is not None and self.expires_at is not None:
            raise ValueError("give expires_in_days or expires_at, not both")
        if self.expires_at is not None:
            moment = self.expires_at
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=UTC)
            now = datetime.now(UTC)
            if moment <= now:
                raise ValueError("expires_at must be in the future")
            if moment > now + timedelta(days=MAX_TOKEN_DAYS):  # compared before converting:
                raise ValueError(  # year 9999 at -14:00 is past the last UTC datetime
                    f"expires_at {self.expires_at.isoformat()} is more than {MAX_TOKEN_DAYS} "
                    "days ahead, the longest a token may last"
                )
            self.expires_at = moment.astimezone(UTC)
        return self

    def expiry(self) -> datetime | None:
        """When the caller asked the token to stop working, in UTC (None: not said)."""
        if self.expires_in_days is not None:
            return datetime.now(UTC) + timedelta(days=self.expires_in_days)
        return self.expires_at


class TokenInfo(BaseModel):
    """A token as listed: never the secret nor its hash, only the first characters."""

    id: int
    name: str
    prefix: str
    created_at: datetime
    revoked_at: datetime | None
    expires_at: datetime | None


class TokenCreated(BaseModel):
    """A new token: `token` is the secret, shown this once and stored only as a hash."""

    id: int
    name: str
    prefix: str
    token: str
    created_at: datetime
    expires_at: datetime | None


class UserCreate(StrictRequest):
    """A user to create in `team` (the team is created if missing): a member, a team admin
    (`is_admin`) or a service admin (`is_service_admin`, an admin of every team). A team
    admin adds people to their own team; only a service admin to another team, or a service
    admin (README "Security")."""

    name: str = Field(min_length=1, max_length=100, pattern=NAME_PATTERN)
    team: str = Field(min_length=1, max_length=100, pattern=NAME_PATTERN)
    is_admin: bool = False
    is_service_admin: bool = False


class UserCreated(BaseModel):
    """A new user and the path of its one-time login link (valid until `link_expires_at`)."""

    id: int
    name: str
    team: str
    is_admin: bool
    is_service_admin: bool
    login_link: str
    link_expires_at: datetime
