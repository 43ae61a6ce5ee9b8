"""Reviews of plans: request reviewers, threaded comments anchored to plan objects, resolve,
approve or request changes, the history; the team's members; "waiting for my review".

Who may do what is written in `backend/reviews.py`; what an anchor may name, and where its
permalink leads, in `backend/anchors.py`. Every change is one transaction that also appends
to the plan's history; a refused request stores nothing.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Response
from sqlalchemy import select
from sqlalchemy.orm import Session

from backend import reviews
from backend.anchors import check_anchor
from backend.deps import PrincipalDep, SessionDep
from backend.errors import ApiError, not_found
from backend.ledger import iso
from backend.orm import Model, Plan, ReviewComment, ReviewRequest, Strategy, User
from backend.pagination import Page
from backend.routers.plan_graph import plan_index
from backend.routers.plans import owned
from backend.schemas.common import PathId, errors
from backend.schemas.reviews import (
    CommentCreate,
    DecisionCreate,
    MemberOut,
    ReviewOut,
    ReviewRequestCreate,
    ReviewRequestOut,
    ThreadOut,
    ThreadResolve,
)

router = APIRouter(tags=["reviews"])


def _plan(session: Session, team_id: int, plan_id: int) -> Plan:
    plan: Plan = owned(session, Plan, team_id, plan_id, "plan")
    return plan


@router.get("/api/plans/{plan_id}/review", response_model=ReviewOut, responses=errors(401, 404))
def get_review(plan_id: PathId, session: SessionDep, principal: PrincipalDep) -> dict[str, Any]:
    """The plan's review: state, author, reviewers, threads (with permalinks), history."""
    return reviews.review_json(session, _plan(session, principal.team_id, plan_id))


@router.post(
    "/api/plans/{plan_id}/review/requests",
    status_code=201,
    response_model=ReviewOut,
    responses=errors(401, 403, 404, 422),
)
def request_review(
    plan_id: PathId, body: ReviewRequestCreate, session: SessionDep, principal: PrincipalDep
) -> dict[str, Any]:
    """Ask team members to review the plan (asking again leaves their decision as it is);
    422 naming a reviewer who is not in the team or is the plan's author."""
    plan = _plan(session, principal.team_id, plan_id)
    actor = reviews.reviewer_id(principal)
    members = {
        u.name: u
        for u in session.scalars(
            select(User).where(User.team_id == principal.team_id, User.name.in_(body.reviewers))
        )
    }
    for name in body.reviewers:
        user = members.get(name)
        if user is None:
            raise ApiError(422, "invalid_review", f"no member of your team is called {name!r}",
                           field="reviewers", reviewer=name)  # fmt: skip
        if user.id == plan.author_id:
            raise ApiError(422, "invalid_review", f"{name!r} wrote plan {plan.id}: an author "
                           "does not review their own plan", field="reviewers",
                           reviewer=name)  # fmt: skip
    asked = {
        r.reviewer_id
        for r in session.scalars(select(ReviewRequest).where(ReviewRequest.plan_id == plan.id))
    }
    added = [members[name] for name in body.reviewers if members[name].id not in asked]
    for user in added:
        session.add(ReviewRequest(team_id=plan.team_id, plan_id=plan.id, reviewer_id=user.id,
                                  requested_by=actor))  # fmt: skip
    if added:
        reviews.record(session, plan, actor, "requested", reviewers=[u.name for u in added])
    reviews.refresh_state(session, plan)
    session.commit()
    return reviews.review_json(session, plan)


@router.post(
    "/api/plans/{plan_id}/review/decision",
    response_model=ReviewOut,
    responses=errors(401, 403, 404, 422),
)
def decide(
    plan_id: PathId, body: DecisionCreate, session: SessionDep, principal: PrincipalDep
) -> dict[str, Any]:
    """Approve the plan or request changes, with an optional summary kept in the history (a
    member not asked becomes a reviewer); the plan's author may not decide on it (403,
    field `decision`)."""
    plan = _plan(session, principal.team_id, plan_id)
    actor = reviews.reviewer_id(principal)
    if actor == plan.author_id:
        raise ApiError(403, "forbidden", f"you wrote plan {plan.id}: its author cannot "
                       f"{body.decision.replace('_', ' ')} it; ask a reviewer",
                       field="decision")  # fmt: skip
    state = "approved" if body.decision == "approve" else "changes_requested"
    request = session.scalar(
        select(ReviewRequest).where(
            ReviewRequest.plan_id == plan.id, ReviewRequest.reviewer_id == actor
        )
    )
    if request is None:
        request = ReviewRequest(team_id=plan.team_id, plan_id=plan.id, reviewer_id=actor)
        session.add(request)
    request.state, request.decided_at = state, reviews.now()
    comment = (body.body or "").strip()
    reviews.record(session, plan, actor, state, comment=comment or None)
    reviews.refresh_state(session, plan)
    session.commit()
    return reviews.review_json(session, plan)


@router.post(
    "/api/plans/{plan_id}/comments",
    status_code=201,
    response_model=ThreadOut,
    responses=errors(401, 403, 404, 409, 422),
)
def add_comment(
    plan_id: PathId, body: CommentCreate, session: SessionDep, principal: PrincipalDep
) -> dict[str, Any]:
    """Start a thread (anchored to an op, value, collective, scope, pass or timeline range
    of the built plan, or to the whole plan) or reply to one (`thread_id`). 422 names an
    anchor the plan does not have; 409 while the plan is not built."""
    plan = _plan(session, principal.team_id, plan_id)
    actor = reviews.reviewer_id(principal)
    anchor: dict[str, Any] | None = None
    root: ReviewComment | None = None
    if body.thread_id is not None:
        if body.anchor is not None:
            raise ApiError(422, "invalid_comment", "a reply takes its thread's anchor: send "
                           "either thread_id or anchor", field="anchor")  # fmt: skip
        root = session.get(ReviewComment, body.thread_id)
        if root is None or root.plan_id != plan.id or root.thread_id is not None:
            raise ApiError(422, "invalid_comment", f"plan {plan.id} has no thread "
                           f"{body.thread_id}", field="thread_id")  # fmt: skip
    elif body.anchor is not None:
        _, index = plan_index(session, principal, plan.id)
        anchor = check_anchor(body.anchor.model_dump(), plan.id, index, plan.summary or {})
    comment = ReviewComment(team_id=plan.team_id, plan_id=plan.id, author_id=actor,
                            anchor=anchor, body=body.body.strip(),
                            thread_id=root.id if root else None)  # fmt: skip
    session.add(comment)
    session.flush()
    if root is not None:
        reviews.record(session, plan, actor, "replied", thread_id=root.id, comment_id=comment.id)
    else:
        reviews.record(session, plan, actor, "commented", thread_id=comment.id, anchor=anchor)
    session.commit()
    return _thread(session, plan, root or comment)


@router.post(
    "/api/plans/{plan_id}/comments/{thread_id}/resolve",
    response_model=ThreadOut,
    responses=errors(401, 403, 404, 422),
)
def resolve_thread(
    plan_id: PathId,
    thread_id: PathId,
    body: ThreadResolve,
    session: SessionDep,
    principal: PrincipalDep,
) -> dict[str, Any]:
    """Resolve a thread, or reopen it with `{"resolved": false}`."""
    plan = _plan(session, principal.team_id, plan_id)
    actor = reviews.reviewer_id(principal)
    root = _root(session, plan, thread_id)
    if body.resolved != (root.resolved_at is not None):
        root.resolved_at = reviews.now() if body.resolved else None
        root.resolved_by = actor if body.resolved else None
        reviews.record(session, plan, actor, "resolved" if body.resolved else "reopened",
                       thread_id=root.id)  # fmt: skip
        session.commit()
    return _thread(session, plan, root)


@router.delete(
    "/api/plans/{plan_id}/comments/{comment_id}",
    status_code=204,
    responses=errors(401, 403, 404, 422),
)
def delete_comment(
    plan_id: PathId, comment_id: PathId, session: SessionDep, principal: PrincipalDep
) -> Response:
    """Delete a comment (a thread's first comment deletes the thread); only an admin or the
    plan's author may (403)."""
    plan = _plan(session, principal.team_id, plan_id)
    comment = session.get(ReviewComment, comment_id)
    if comment is None or comment.plan_id != plan.id:
        raise not_found("comment", comment_id)
    if not reviews.may_delete(principal, plan):
        raise ApiError(403, "forbidden", "only an admin or the plan's author may delete "
                       "comments", field="comment_id")  # fmt: skip
    if comment.thread_id is None:
        for reply in session.scalars(
            select(ReviewComment).where(ReviewComment.thread_id == comment.id)
        ):
            session.delete(reply)
    session.delete(comment)
    reviews.record(session, plan, principal.user_id, "comment_deleted", comment_id=comment_id,
                   thread=comment.thread_id is None)  # fmt: skip
    session.commit()
    return Response(status_code=204)


@router.get("/api/members", response_model=list[MemberOut], responses=errors(401))
def list_members(session: SessionDep, principal: PrincipalDep) -> list[dict[str, Any]]:
    """The people of the caller's team, by name (whom a review can be asked of)."""
    rows = session.scalars(
        select(User).where(User.team_id == principal.team_id).order_by(User.name)
    )
    return [{"id": u.id, "name": u.name, "is_admin": u.is_admin} for u in rows]


@router.get("/api/reviews", response_model=list[ReviewRequestOut], responses=errors(401, 403, 422))
def list_review_requests(
    session: SessionDep,
    principal: PrincipalDep,
    page: Page,
    reviewer: Annotated[
        str | None, Query(max_length=100, description='A member\'s name, or "me".')
    ] = None,
    state: Annotated[
        Literal["pending", "approved", "changes_requested"] | None,
        Query(description="Only requests in this state."),
    ] = None,
) -> list[dict[str, Any]]:
    """The team's review requests, newest first, a page at a time: `reviewer=me&state=pending`
    is "waiting for my review"."""
    query = select(ReviewRequest).where(ReviewRequest.team_id == principal.team_id)
    if reviewer is not None:
        query = query.where(
            ReviewRequest.reviewer_id == reviews.member_id(session, principal, reviewer)
        )
    if state is not None:
        query = query.where(ReviewRequest.state == state)
    rows = page.rows(session, query.order_by(ReviewRequest.id.desc()))
    plans = {
        p.id: p for p in session.scalars(select(Plan).where(Plan.id.in_([r.plan_id for r in rows])))
    }
    models = dict(
        session.execute(
            select(Model.id, Model.name).where(Model.id.in_([p.model_id for p in plans.values()]))
        ).all()
    )
    strategies = {
        s.id: f"{s.name} v{s.version}"
        for s in session.scalars(
            select(Strategy).where(Strategy.id.in_([p.strategy_id for p in plans.values()]))
        )
    }
    names = reviews.user_names(
        session,
        [r.reviewer_id for r in rows]
        + [r.requested_by for r in rows]
        + [p.author_id for p in plans.values()],
    )
    out = []
    for r in rows:
        plan = plans[r.plan_id]
        out.append({
            "plan_id": r.plan_id,
            "reviewer": names.get(r.reviewer_id, "?"),
            "state": r.state,
            "requested_by": names.get(r.requested_by) if r.requested_by else None,
            "plan_state": plan.review_state,
            "plan_author": names.get(plan.author_id) if plan.author_id else None,
            "model": models.get(plan.model_id),
            "strategy": strategies.get(plan.strategy_id),
            "cluster": plan.cluster,
            "created_at": iso(r.created_at),
        })  # fmt: skip
    return out


def _root(session: Session, plan: Plan, thread_id: int) -> ReviewComment:
    root = session.get(ReviewComment, thread_id)
    if root is None or root.plan_id != plan.id or root.thread_id is not None:
        raise not_found("thread", thread_id)
    return root


def _thread(session: Session, plan: Plan, root: ReviewComment) -> dict[str, Any]:
    for r, replies in reviews.threads_of(session, plan.id):
        if r.id == root.id:
            ids = [r.resolved_by] + [c.author_id for c in (r, *replies)]
            return reviews.thread_json(r, replies, reviews.user_names(session, ids))
    raise not_found("thread", root.id)
