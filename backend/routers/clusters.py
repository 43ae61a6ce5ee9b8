"""Clusters: the engine's presets (read-only) and each team's own cluster specs.

A name is a preset when the engine loads it as one: a listed preset (`h100-sxm-8x8`,
`cpu-local`) or any `<family>-<nodes>x<devices_per_node>`. Team clusters cannot take such
names, so a name means the same cluster everywhere (plans store cluster names).
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import APIRouter, Response
from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.deps import PrincipalDep, SessionDep
from backend.errors import ApiError, user_input
from backend.orm import Cluster as ClusterRow
from backend.ownership import require_removal
from backend.routers.models import commit_or_conflict
from backend.schemas.resources import ClusterCreate, ClusterDetail, ClusterOut
from shardlab.cost.clusters import FAMILIES, Cluster, cluster_from_dict, load_cluster, preset_names
from shardlab.errors import ClusterError

router = APIRouter(prefix="/api/clusters", tags=["clusters"])

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def preset_cluster(name: str) -> Cluster | None:
    """The preset `name` if the engine knows it as a preset (never reads a file)."""
    if not NAME_PATTERN.fullmatch(name) or name.endswith(".json"):
        return None
    try:
        return load_cluster(name)
    except ClusterError:
        return None


def _team_cluster(session: Session, team_id: int, name: str) -> ClusterRow | None:
    query = select(ClusterRow).where(ClusterRow.team_id == team_id, ClusterRow.name == name)
    return session.scalar(query)


def _not_found(name: str) -> ApiError:
    return ApiError(
        404,
        "not_found",
        f"cluster {name!r} not found: it is neither a preset ({', '.join(preset_names())}, "
        f"or <family>-<nodes>x<devices_per_node> for {', '.join(FAMILIES)}) "
        "nor one of the team's clusters",
        resource="cluster",
        id=name,
    )


def resolve_cluster(session: Session, team_id: int, name: str) -> dict[str, Any]:
    """The spec (cluster JSON dict) of preset `name` or of the team's cluster `name`;
    ApiError 404 naming the cluster otherwise."""
    preset = preset_cluster(name)
    if preset is not None:
        return preset.to_json()
    row = _team_cluster(session, team_id, name)
    if row is None:
        raise _not_found(name)
    return dict(row.spec)


def _headline(name: str, source: str, spec: dict[str, Any]) -> dict[str, Any]:
    nodes, per_node = int(spec["nodes"]), int(spec["devices_per_node"])
    return {
        "name": name,
        "source": source,
        "description": spec.get("description", ""),
        "devices": nodes * per_node,
        "nodes": nodes,
        "devices_per_node": per_node,
        "peak_flops_bf16": spec["peak_flops"].get("bfloat16"),
        "hbm_bytes": spec["hbm_bytes"],
        "intra_node_bandwidth": spec["intra_node"]["bandwidth"],
        "inter_node_bandwidth": spec["inter_node"]["bandwidth"],
    }


@router.get("", response_model=list[ClusterOut])
def list_clusters(session: SessionDep, principal: PrincipalDep) -> list[dict[str, Any]]:
    """The presets (source `preset`), then the team's clusters (source `user`) by name."""
    out = [_headline(n, "preset", load_cluster(n).to_json()) for n in preset_names()]
    query = (
        select(ClusterRow).where(ClusterRow.team_id == principal.team_id).order_by(ClusterRow.name)
    )
    out += [_headline(row.name, "user", row.spec) for row in session.scalars(query)]
    return out


@router.post("", status_code=201, response_model=ClusterDetail)
def create_cluster(
    body: ClusterCreate, session: SessionDep, principal: PrincipalDep
) -> dict[str, Any]:
    """Add a team cluster; the spec is validated by the engine (errors name the field)."""
    name = body.name
    if not NAME_PATTERN.fullmatch(name) or name.endswith(".json"):
        raise ApiError(
            422,
            "invalid_cluster",
            f"cluster name {name!r} must be letters, digits, '.', '_' or '-' (starting with a "
            "letter or digit) and must not end in '.json'",
            field="name",
        )
    if preset_cluster(name) is not None:
        raise ApiError(409, "conflict", f"{name!r} is the name of a cluster preset", name=name)
    if _team_cluster(session, principal.team_id, name) is not None:
        raise ApiError(409, "conflict", f"a cluster named {name!r} already exists", name=name)
    with user_input("invalid_cluster", f"cluster {name!r}", cluster=name):
        spec = cluster_from_dict({**body.spec, "name": name}).to_json()
    session.add(
        ClusterRow(team_id=principal.team_id, name=name, spec=spec, author_id=principal.user_id)
    )
    commit_or_conflict(session, f"a cluster named {name!r} already exists", name=name)
    return {**_headline(name, "user", spec), "spec": spec}


@router.get("/{name}", response_model=ClusterDetail)
def get_cluster(name: str, session: SessionDep, principal: PrincipalDep) -> dict[str, Any]:
    """A preset's or the team's cluster with its full spec."""
    source = "preset" if preset_cluster(name) is not None else "user"
    spec = resolve_cluster(session, principal.team_id, name)
    return {**_headline(name, source, spec), "spec": spec}


@router.delete("/{name}", status_code=204)
def delete_cluster(name: str, session: SessionDep, principal: PrincipalDep) -> Response:
    """Delete one of the team's clusters (its author or an admin: 403 otherwise); presets
    cannot be deleted (409)."""
    if preset_cluster(name) is not None:
        raise ApiError(
            409,
            "conflict",
            f"cluster {name!r} is a built-in preset and cannot be deleted; "
            "only the team's own clusters can",
            name=name,
        )
    row = _team_cluster(session, principal.team_id, name)
    if row is None:
        raise _not_found(name)
    require_removal(principal, row.author_id, f"cluster {name!r}")
    session.delete(row)
    session.commit()
    return Response(status_code=204)
