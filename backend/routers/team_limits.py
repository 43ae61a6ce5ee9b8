"""Teams' limits (jobs running and queued, requests a minute, job deadline and memory; see
`backend/tenancy.py`): a service admin reads and sets any team's; a team admin reads their
own team's (`backend.ownership`).

Anyone else gets 403 `forbidden` on these paths, whichever team they name (existing or
not): an admin path tells them nothing about other teams. A service admin naming an unknown
team gets 404.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from backend import ledger
from backend.auth import Principal
from backend.deps import PrincipalDep, SessionDep, SettingsDep
from backend.errors import ApiError, not_found
from backend.orm import Team, TeamLimits, utcnow
from backend.ownership import may_read_limits, may_set_limits
from backend.rate_limit import RateLimiter
from backend.schemas.common import errors
from backend.schemas.team_limits import TeamLimitsOut, TeamLimitsUpdate
from backend.settings import Settings
from backend.tenancy import FIELDS, defaults, effective

router = APIRouter(prefix="/api/admin/teams", tags=["admin"])

TeamName = Annotated[str, Path(min_length=1, max_length=100, description="The team's name.")]


def require_reader(session: Session, principal: Principal, team: str) -> None:
    """403 unless the caller is a service admin or an admin of `team`."""
    own = session.get(Team, principal.team_id)
    if not may_read_limits(principal, own.name if own is not None else "", team):
        raise ApiError(403, "forbidden", "only a service admin, or an admin of the team, may "
                       "see a team's limits")  # fmt: skip


def require_setter(principal: Principal) -> None:
    """403 unless the caller is a service admin."""
    if not may_set_limits(principal):
        raise ApiError(403, "forbidden", "only a service admin may set a team's limits")


def _team(session: Session, name: str) -> Team:
    team = session.scalar(select(Team).where(Team.name == name))
    if team is None:
        raise not_found("team", name)
    return team


def limits_json(settings: Settings, team: Team, row: TeamLimits | None) -> dict[str, Any]:
    """The team's limits in force, each with its source and the default."""
    limits = effective(settings, row)
    standard = defaults(settings)
    out: dict[str, Any] = {"team": team.name}
    for name in FIELDS:
        out[name] = {
            "value": getattr(limits, name),
            "source": limits.sources[name],
            "default": standard[name],
        }
    out["updated_at"] = ledger.iso(row.updated_at) if row is not None else None
    return out


@router.get("/{team}/limits", response_model=TeamLimitsOut, responses=errors(401, 403, 404, 422))
def get_team_limits(
    team: TeamName, principal: PrincipalDep, session: SessionDep, settings: SettingsDep
) -> dict[str, Any]:
    """The team's limits in force: its own where a service admin set one, else the default
    (a service admin, or an admin of the team)."""
    require_reader(session, principal, team)
    row = _team(session, team)
    return limits_json(settings, row, session.get(TeamLimits, row.id))


@router.put(
    "/{team}/limits", response_model=TeamLimitsOut, responses=errors(401, 403, 404, 409, 422)
)
def put_team_limits(
    team: TeamName,
    body: TeamLimitsUpdate,
    request: Request,
    principal: PrincipalDep,
    session: SessionDep,
    settings: SettingsDep,
) -> dict[str, Any]:
    """Set some of the team's limits (fields left out keep theirs, `null` means the default);
    answers the limits now in force. Jobs already queued keep the deadline they were given;
    running and queued counts, the request rate and memory apply from now on. A service
    admin only."""
    require_setter(principal)
    found = _team(session, team)
    row = session.get(TeamLimits, found.id)
    if row is None:
        row = TeamLimits(team_id=found.id)
        session.add(row)
    for name in body.model_fields_set:
        setattr(row, name, getattr(body, name))
    row.updated_at = utcnow()
    try:
        session.commit()
    except IntegrityError:  # another admin gave the team its first limits at the same time
        session.rollback()
        raise ApiError(
            409, "conflict", f"the limits of team {team!r} changed meanwhile: try again"
        ) from None
    limiter: RateLimiter = request.app.state.rate_limiter
    limiter.forget(found.id)
    return limits_json(settings, found, row)
