"""Schemas of the auth endpoints: who am I, API tokens, admin user creation."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

#: names of tokens, users and teams: printable, no leading or trailing blanks
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9 ._@-]*$"


class Me(BaseModel):
    """The caller: its user (None for a team API token), team and how it authenticated."""

    user: str | None
    team: str
    is_admin: bool
    via: Literal["token", "session"]


class TokenCreate(BaseModel):
    """A new API token's name (for people to tell tokens apart)."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=100, pattern=NAME_PATTERN)


class TokenInfo(BaseModel):
    """A token as listed: never the secret nor its hash, only the first characters."""

    id: int
    name: str
    prefix: str
    created_at: datetime
    revoked_at: datetime | None


class TokenCreated(BaseModel):
    """A new token: `token` is the secret, shown this once and stored only as a hash."""

    id: int
    name: str
    prefix: str
    token: str
    created_at: datetime


class UserCreate(BaseModel):
    """A user to create in `team` (the team is created if missing)."""

    model_config = ConfigDict(extra="forbid")
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
