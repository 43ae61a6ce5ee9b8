"""Who may do what, the service's one set of rules (the README's "Security" states them).

- Reading and creating: every member of a team, its team tokens too, within the team.
- Deleting a resource or revoking a token: its author or an admin of its team
  (`may_remove`). The author of a model, cluster or plan is the person who made it; of a
  comment or a baseline, the author of the plan it belongs to; of a token, the person it
  acts for. What a team token made (no person) has the team's tokens as its author, so a
  CI job cleans up after itself, while no member's token removes what a person made.
- Adding people and admins to a team: an admin of that team; to any team (creating it):
  a service admin, who alone makes service admins (`may_add_user`).
- Teams' limits protect every team's share of the workers: a service admin sets them;
  a team admin reads their own team's (`may_read_limits`, `may_set_limits`).
"""

from __future__ import annotations

from backend.auth import Principal
from backend.errors import ApiError


def may_remove(principal: Principal, author_id: int | None) -> bool:
    """Whether `principal` may delete (or revoke) what `author_id` made, in its own team."""
    return principal.is_admin or principal.user_id == author_id


def require_removal(
    principal: Principal, author_id: int | None, what: str, verb: str = "delete"
) -> None:
    """403 `forbidden` unless `may_remove`; the message names `what` and who may."""
    if not may_remove(principal, author_id):
        raise ApiError(403, "forbidden", f"only an admin of the team or the author of {what} "
                       f"may {verb} it", author_id=author_id)  # fmt: skip


def may_add_user(principal: Principal, own_team: str, team: str, service_admin: bool) -> bool:
    """Whether `principal` (of team `own_team`) may add a person to `team` (a service admin
    if `service_admin`)."""
    if service_admin or team != own_team:
        return principal.is_service_admin
    return principal.is_admin


def may_read_limits(principal: Principal, own_team: str, team: str) -> bool:
    return principal.is_service_admin or (principal.is_admin and team == own_team)


def may_set_limits(principal: Principal) -> bool:
    return principal.is_service_admin
