"""Strategies: named, versioned (mesh, templates, annotations, options) per team.

Creating gives version 1; editing (`PUT`) adds version + 1 under the same name and leaves the
older versions unchanged (plans keep pointing at the version they were made with).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from backend.baselines import check_against_baselines, plan_against_baselines
from backend.deps import PrincipalDep, SessionDep, SettingsDep
from backend.errors import ApiError, not_found
from backend.orm import Strategy as StrategyRow
from backend.pagination import Page
from backend.planning import engine_strategy
from backend.routers.models import flush_or_conflict
from backend.schemas.common import PathId
from backend.schemas.resources import StrategyCreate, StrategyOut, StrategyUpdate
from shardlab.errors import ShardlabError

router = APIRouter(prefix="/api/strategies", tags=["strategies"])


def owned_strategy(session: Session, team_id: int, strategy_id: int) -> StrategyRow:
    """The team's strategy version `strategy_id`; 404 for a missing one or another team's."""
    row = session.get(StrategyRow, strategy_id)
    if row is None or row.team_id != team_id:
        raise not_found("strategy", strategy_id)
    return row


def strategy_out(row: StrategyRow) -> dict[str, Any]:
    """The response form of one stored version (with the engine's one-line description).

    A version stored before a check got stricter still reads; its description says why the
    engine refuses it now (planning with it answers 422 with the same reason)."""
    try:
        describe = engine_strategy(row.mesh, row.templates, row.annotations, row.options).describe()
    except (ShardlabError, ApiError) as exc:
        describe = f"no longer valid: {exc.message}"
    return {
        "id": row.id,
        "name": row.name,
        "version": row.version,
        "mesh": row.mesh,
        "templates": row.templates,
        "annotations": row.annotations,
        "options": row.options,
        "created_at": row.created_at,
        "describe": describe,
    }


def add_strategy_version(
    session: Session, team_id: int, name: str, version: int, body: StrategyUpdate | StrategyCreate
) -> StrategyRow:
    """Validate `body` with the engine, add it as `version` of strategy `name` and flush it,
    without committing: the caller commits it with whatever else it adds. A version that
    exists already (a concurrent edit) is 409 `conflict`."""
    engine_strategy(body.mesh, body.templates, body.annotations, body.options)
    row = StrategyRow(
        team_id=team_id,
        name=name,
        version=version,
        mesh=body.mesh,
        templates=body.templates,
        annotations=body.annotations,
        options=body.options,
    )
    session.add(row)
    flush_or_conflict(
        session, f"strategy {name!r} version {version} already exists", name=name, version=version
    )
    return row


def latest_or_new_version(
    session: Session, team_id: int, name: str, definition: StrategyUpdate
) -> StrategyRow:
    """The latest version of strategy `name` when it is `definition` (mesh, templates,
    annotations, options), else the next version of it, added and flushed (not committed):
    what names a strategy inline (a check, a search's candidate) stores nothing new when
    asked again."""
    latest = session.scalars(
        select(StrategyRow)
        .where(StrategyRow.team_id == team_id, StrategyRow.name == name)
        .order_by(StrategyRow.version.desc())
        .limit(1)
    ).first()
    same = latest is not None and (
        latest.mesh,
        list(latest.templates),
        list(latest.annotations),
        dict(latest.options),
    ) == (definition.mesh, definition.templates, definition.annotations, definition.options)
    if latest is not None and same:
        return latest
    version = latest.version + 1 if latest is not None else 1
    return add_strategy_version(session, team_id, name, version, definition)


def _versions(session: Session, team_id: int, name: str) -> list[StrategyRow]:
    query = (
        select(StrategyRow)
        .where(StrategyRow.team_id == team_id, StrategyRow.name == name)
        .order_by(StrategyRow.version)
    )
    return list(session.scalars(query))


@router.post("", status_code=201, response_model=StrategyOut)
def create_strategy(
    body: StrategyCreate, session: SessionDep, principal: PrincipalDep
) -> dict[str, Any]:
    """Create version 1 of a named strategy; 409 if the name exists in the team."""
    if _versions(session, principal.team_id, body.name):
        raise ApiError(
            409,
            "conflict",
            f"a strategy named {body.name!r} already exists; edit it (PUT) for a new version",
            name=body.name,
        )
    row = add_strategy_version(session, principal.team_id, body.name, 1, body)
    session.commit()
    return strategy_out(row)


@router.put("/{strategy_id}", response_model=StrategyOut)
def update_strategy(
    strategy_id: PathId,
    body: StrategyUpdate,
    request: Request,
    session: SessionDep,
    principal: PrincipalDep,
    settings: SettingsDep,
) -> dict[str, Any]:
    """Save an edit as the next version of the strategy's name (older versions stay). Where a
    baseline was planned with an earlier version, the new one is planned on the baseline's
    model and cluster in the same transaction (`baseline_plans`), so its plan shows the
    comparison with the baseline once built. The engine checks the new version on those
    models (seconds for a large one) on what short read sessions loaded, before this
    request's write transaction (on SQLite, the database's write lock) begins."""
    team = principal.team_id
    with request.app.state.sessions() as reading:
        name = owned_strategy(reading, team, strategy_id).name
    strategy = engine_strategy(body.mesh, body.templates, body.annotations, body.options)
    checks = check_against_baselines(request.app.state.sessions, settings, team, name, strategy)
    new = add_strategy_version(session, team, name, _latest_version(session, team, name) + 1, body)
    queued = plan_against_baselines(session, settings, checks, new, principal.user_id)
    session.commit()
    return {**strategy_out(new), "baseline_plans": queued}


def _latest_version(session: Session, team_id: int, name: str) -> int:
    """The highest version of the team's strategy `name` (0 when it has none)."""
    latest = session.scalar(
        select(func.max(StrategyRow.version)).where(
            StrategyRow.team_id == team_id, StrategyRow.name == name
        )
    )
    return latest or 0


@router.get("", response_model=list[StrategyOut])
def list_strategies(
    session: SessionDep, principal: PrincipalDep, page: Page, all_versions: bool = False
) -> list[dict[str, Any]]:
    """The latest version of each of the team's strategies (every version with
    `all_versions=true`), by name then version, a page at a time (`pagination`)."""
    query = select(StrategyRow).where(StrategyRow.team_id == principal.team_id)
    if not all_versions:
        latest = (
            select(StrategyRow.name, func.max(StrategyRow.version).label("version"))
            .where(StrategyRow.team_id == principal.team_id)
            .group_by(StrategyRow.name)
            .subquery()
        )
        query = query.join(
            latest,
            (StrategyRow.name == latest.c.name) & (StrategyRow.version == latest.c.version),
        )
    rows = page.rows(session, query.order_by(StrategyRow.name, StrategyRow.version))
    return [strategy_out(row) for row in rows]


@router.get("/{strategy_id}", response_model=StrategyOut)
def get_strategy(
    strategy_id: PathId, session: SessionDep, principal: PrincipalDep
) -> dict[str, Any]:
    """One version of a strategy."""
    return strategy_out(owned_strategy(session, principal.team_id, strategy_id))


@router.get("/{strategy_id}/versions", response_model=list[StrategyOut])
def strategy_versions(
    strategy_id: PathId, session: SessionDep, principal: PrincipalDep
) -> list[dict[str, Any]]:
    """Every version of the strategy's name, oldest first."""
    row = owned_strategy(session, principal.team_id, strategy_id)
    return [strategy_out(r) for r in _versions(session, principal.team_id, row.name)]
