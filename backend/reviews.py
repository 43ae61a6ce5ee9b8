"""Plan reviews as data: who may do what, the review state a plan's reviewers add up to, the
history every change appends to, and the JSON view of a plan's review.

Rules (the routers in `backend/routers/reviews.py` apply them):
- reviews are by people: the caller must be a user (a browser session, or an API token made
  by a user), not a bare team token;
- any member of the plan's team may request reviews, comment, resolve, approve or request
  changes; a plan's author may not approve their own plan;
- only an admin or the plan's author may delete (a comment thread, a plan);
- other teams' plans do not exist (404), as everywhere in the API.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.anchors import anchor_text, permalink
from backend.auth import Principal
from backend.errors import ApiError
from backend.ledger import iso
from backend.orm import Plan, ReviewComment, ReviewEvent, ReviewRequest, User
from backend.ownership import may_remove


def now() -> datetime:
    return datetime.now(UTC)


def reviewer_id(principal: Principal) -> int:
    """The caller's user id; 403 for a team token that belongs to no user."""
    if principal.user_id is None:
        raise ApiError(
            403,
            "forbidden",
            "reviews are by people: log in, or use an API token made by a user "
            "(this token belongs to the team, not to a user)",
            field="authorization",
        )
    return principal.user_id


def member_id(session: Session, principal: Principal, name: str) -> int:
    """The id of the team member called `name` (`me`: the caller); 422 naming it."""
    if name == "me":
        return reviewer_id(principal)
    user_id = session.scalar(
        select(User.id).where(User.team_id == principal.team_id, User.name == name)
    )
    if user_id is None:
        raise ApiError(422, "invalid_request", f"no member of your team is called {name!r}",
                       field="reviewer")  # fmt: skip
    return int(user_id)


def may_delete(principal: Principal, plan: Plan) -> bool:
    """Admins and the plan's author may delete the plan, its threads and its baseline
    (`backend.ownership.may_remove`: what belongs to a plan counts the plan's author as
    its author)."""
    return may_remove(principal, plan.author_id)


def review_state(states: Iterable[str]) -> str:
    """What a plan's reviewers' latest decisions add up to: `changes_requested` if any asks
    for changes, else `approved` if any approved, else `pending` if any was asked, else
    `none`."""
    seen = set(states)
    for state in ("changes_requested", "approved", "pending"):
        if state in seen:
            return state
    return "none"


def refresh_state(session: Session, plan: Plan) -> str:
    """Recompute and store the plan's review state from its review requests."""
    session.flush()
    states = session.scalars(select(ReviewRequest.state).where(ReviewRequest.plan_id == plan.id))
    plan.review_state = review_state(states)
    return plan.review_state


def record(session: Session, plan: Plan, actor: int | None, kind: str, **detail: Any) -> None:
    """Append an event to the plan's review history."""
    session.add(
        ReviewEvent(team_id=plan.team_id, plan_id=plan.id, actor_id=actor, kind=kind, detail=detail)
    )


def user_names(session: Session, ids: Iterable[int | None]) -> dict[int, str]:
    """User id -> name for the ids given (one query)."""
    wanted = {i for i in ids if i is not None}
    if not wanted:
        return {}
    rows = session.execute(select(User.id, User.name).where(User.id.in_(wanted)))
    return {int(i): str(name) for i, name in rows}


def thread_json(
    root: ReviewComment, replies: list[ReviewComment], names: dict[int, str]
) -> dict[str, Any]:
    """One thread: its anchor, permalink, resolution and comments oldest first."""
    comments = [root, *replies]
    return {
        "id": root.id,
        "anchor": root.anchor,
        "anchor_text": anchor_text(root.anchor),
        "permalink": permalink(root.plan_id, root.anchor),
        "resolved": root.resolved_at is not None,
        "resolved_by": names.get(root.resolved_by) if root.resolved_by else None,
        "comments": [
            {
                "id": c.id,
                "author": names.get(c.author_id) if c.author_id else None,
                "body": c.body,
                "created_at": iso(c.created_at),
            }
            for c in comments
        ],
    }


def threads_of(session: Session, plan_id: int) -> list[tuple[ReviewComment, list[ReviewComment]]]:
    """The plan's threads (root, replies), oldest first."""
    rows = session.scalars(
        select(ReviewComment).where(ReviewComment.plan_id == plan_id).order_by(ReviewComment.id)
    ).all()
    roots = [c for c in rows if c.thread_id is None]
    replies: dict[int, list[ReviewComment]] = {c.id: [] for c in roots}
    for c in rows:
        if c.thread_id is not None and c.thread_id in replies:
            replies[c.thread_id].append(c)
    return [(root, replies[root.id]) for root in roots]


def review_json(session: Session, plan: Plan) -> dict[str, Any]:
    """The plan's review: state, author, reviewers, threads and history."""
    requests = session.scalars(
        select(ReviewRequest).where(ReviewRequest.plan_id == plan.id).order_by(ReviewRequest.id)
    ).all()
    threads = threads_of(session, plan.id)
    events = session.scalars(
        select(ReviewEvent).where(ReviewEvent.plan_id == plan.id).order_by(ReviewEvent.id)
    ).all()
    ids: list[int | None] = [plan.author_id]
    ids += [r.reviewer_id for r in requests] + [r.requested_by for r in requests]
    ids += [e.actor_id for e in events]
    for root, replies in threads:
        ids += [root.resolved_by] + [c.author_id for c in (root, *replies)]
    names = user_names(session, ids)
    return {
        "plan_id": plan.id,
        "state": plan.review_state,
        "author": names.get(plan.author_id) if plan.author_id else None,
        "reviewers": [
            {
                "user": names.get(r.reviewer_id, "?"),
                "state": r.state,
                "requested_by": names.get(r.requested_by) if r.requested_by else None,
                "decided_at": iso(r.decided_at),
            }
            for r in requests
        ],
        "threads": [thread_json(root, replies, names) for root, replies in threads],
        "open_threads": sum(1 for root, _ in threads if root.resolved_at is None),
        "history": [
            {
                "id": e.id,
                "kind": e.kind,
                "actor": names.get(e.actor_id) if e.actor_id else None,
                "detail": e.detail,
                "created_at": iso(e.created_at),
            }
            for e in events
        ],
    }
