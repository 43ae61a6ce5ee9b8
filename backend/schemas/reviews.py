"""Schemas of plan reviews (requests, threaded comments anchored to plan objects, decisions,
history) and of baselines. Requests forbid unknown fields."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field, field_validator

from backend.schemas.auth import NAME_PATTERN
from backend.schemas.common import RowId, StrictRequest

ReviewState = Literal["none", "pending", "changes_requested", "approved"]
AnchorKind = Literal["op", "value", "collective", "scope", "pass", "timeline"]


class _Request(StrictRequest):
    """Base of this module's request bodies (`StrictRequest`)."""


class Anchor(_Request):
    """The plan object a thread is about: `name` for an op, value, collective, scope or pass;
    `start_s`/`end_s` (seconds into the predicted step) for a timeline range."""

    kind: AnchorKind
    name: str | None = Field(None, min_length=1, max_length=500)
    start_s: float | None = Field(None, ge=0, le=1e9)
    end_s: float | None = Field(None, ge=0, le=1e9)


class ReviewRequestCreate(_Request):
    """Ask team members (by user name) to review the plan."""

    reviewers: list[str] = Field(min_length=1, max_length=20)

    @field_validator("reviewers")
    @classmethod
    def _names(cls, names: list[str]) -> list[str]:
        for name in names:
            if not name.strip():
                raise ValueError("a reviewer's name is empty")
        return list(dict.fromkeys(name.strip() for name in names))


class CommentCreate(_Request):
    """A new thread (with an optional `anchor`) or, with `thread_id`, a reply to one."""

    free_text: ClassVar[frozenset[str]] = frozenset({"body"})
    body: str = Field(min_length=1, max_length=10_000)
    anchor: Anchor | None = None
    thread_id: RowId | None = None

    @field_validator("body")
    @classmethod
    def _not_blank(cls, body: str) -> str:
        if not body.strip():
            raise ValueError("the comment is empty")
        return body


class ThreadResolve(_Request):
    """Resolve a thread (`resolved: true`) or reopen it (`false`)."""

    resolved: bool = True


class DecisionCreate(_Request):
    """A reviewer's verdict on the plan, with an optional summary comment."""

    free_text: ClassVar[frozenset[str]] = frozenset({"body"})
    decision: Literal["approve", "request_changes"]
    body: str | None = Field(None, max_length=10_000)


class CommentOut(BaseModel):
    id: int
    author: str | None
    body: str
    created_at: str | None


class ThreadOut(BaseModel):
    """A thread: its anchor (None: about the whole plan), the permalink that opens the
    anchored object in the UI, its comments oldest first, and whether it is resolved."""

    id: int
    anchor: dict[str, Any] | None
    anchor_text: str
    permalink: str
    resolved: bool
    resolved_by: str | None
    comments: list[CommentOut]


class ReviewerOut(BaseModel):
    user: str
    state: Literal["pending", "approved", "changes_requested"]
    requested_by: str | None
    decided_at: str | None


class EventOut(BaseModel):
    id: int
    kind: str
    actor: str | None
    detail: dict[str, Any]
    created_at: str | None


class ReviewOut(BaseModel):
    """A plan's review: its state, author, reviewers, threads and the full history."""

    plan_id: int
    state: ReviewState
    author: str | None
    reviewers: list[ReviewerOut]
    threads: list[ThreadOut]
    open_threads: int
    history: list[EventOut]


class ReviewRequestOut(BaseModel):
    """A request to review a plan (the "waiting for my review" list)."""

    plan_id: int
    reviewer: str
    state: Literal["pending", "approved", "changes_requested"]
    requested_by: str | None
    plan_state: ReviewState
    plan_author: str | None
    model: str | None
    strategy: str | None
    cluster: str | None
    created_at: str | None


class MemberOut(BaseModel):
    """A member of the caller's team (people one can ask for a review)."""

    id: int
    name: str
    is_admin: bool


class BaselineCreate(_Request):
    """Make an approved, costed plan the baseline of its model and cluster (the default
    name) or of `name`; an existing baseline of that name moves to this plan."""

    plan_id: RowId
    name: str | None = Field(None, min_length=1, max_length=200, pattern=NAME_PATTERN)


class BaselineOut(BaseModel):
    id: int
    name: str
    plan_id: int
    model_id: int
    cluster: str
    set_by: str | None
    created_at: str | None
    updated_at: str | None
