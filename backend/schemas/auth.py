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
    """The caller: its user (None for a team API token), team and how it authenticated."""

    user: str | None
    team: str
    is_admin: bool
    via: Literal["token", "session"]


class TokenCreate(StrictRequest):
    """A new API token's name (for people to tell tokens apart) and optional expiry: in
    `expires_in_days` days, or at `expires_at` (UTC when no offset is given); neither: never."""

    name: str = Field(min_length=1, max_length=100, pattern=NAME_PATTERN)
    expires_in_days: int | None = Field(default=None, ge=1, le=MAX_TOKEN_DAYS)
    #: not strict: JSON gives a timestamp as ISO 8601 text
    expires_at: datetime | None = Field(default=None, strict=False)

    @model_validator(mode="after")
    def _one_expiry(self) -> TokenCreate:
        if self.expires_in_days is not None and self.expires_at is not None:
            raise ValueError("give expires_in_days or expires_at, not both")
        if self.expires_at is not None:
            if self.expires_at.tzinfo is None:
                self.expires_at = self.expires_at.replace(tzinfo=UTC)
            if self.expires_at <= datetime.now(UTC):
                raise ValueError("expires_at must be in the future")
        return self

    def expiry(self) -> datetime | None:
        """When the token stops working (None: never)."""
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
    """A user to create in `team` (the team is created if missing)."""

    name: str = Field(min_length=1, max_length=100, pattern=NAME_PATTERN)
    team: str = Field(min_length=1, max_length=100, pattern=NAME_PATTERN)
    is_admin: bool = False


class UserCreated(BaseModel):
    """A new user and the path of its one-time login link (valid until `link_expires_at`)."""

    id: int
    name: str
    team: str
    is_admin: bool
    login_link: str
    link_expires_at: datetime
