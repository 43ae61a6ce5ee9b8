"""Queueing a plan build, shared by plans, checks and new strategy versions: the cheap
refusals the engine can make at once (a mesh too large, a mesh larger than the cluster,
annotations that do not fit the model, a build estimated to outlast the team's job
deadline) and the plan and job rows the worker picks up.

Nothing here commits: the caller commits the plan with whatever else its request stores.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from backend import blobs, ledger
from backend.errors import ApiError, user_input
from backend.orm import Job, Model, Plan
from backend.orm import Strategy as StrategyRow
from backend.settings import Settings
from backend.tenancy import team_limits
from shardlab.autodiff import training_graph
from shardlab.cost.clusters import Cluster, check_mesh_fits, cluster_from_dict
from shardlab.cost.effort import Effort, plan_effort
from shardlab.graph_json import graph_from_json
from shardlab.ir import Graph
from shardlab.passes.manager import resolve_passes
from shardlab.spmd.constraints import resolve_annotations
from shardlab.strategy import Strategy


def engine_strategy(
    mesh: str, templates: list[str], annotations: list[str], options: dict[str, Any]
) -> Strategy:
    """The engine's Strategy; its errors name the mesh axis, template, annotation or pass.
    Absurd meshes (`shardlab.mesh.MAX_MESH_AXES`, `MAX_MESH_DEVICES`) are refused by the
    mesh parser before it enumerates their ranks."""
    with user_input("invalid_strategy", "invalid strategy"):
        strategy = Strategy.build(mesh, templates, annotations, options)
        resolve_passes(options.get("passes"))
    return strategy


def check_plan(
    model: Model, row: StrategyRow, spec: dict[str, Any] | None, deadline_s: float | None = None
) -> None:
    """`check_strategy` of a stored strategy version on a stored model: the strategy is
    refused before the model's graph is unpacked."""
    strategy = engine_strategy(row.mesh, row.templates, row.annotations, row.options)
    cluster = fitting_cluster(strategy, spec)
    check_training(model_graph(model), strategy, cluster, deadline_s)


def check_strategy(
    graph: Graph, strategy: Strategy, spec: dict[str, Any] | None, deadline_s: float | None = None
) -> None:
    """Refuse at once what the worker would fail on before its first pass, with the engine's
    own errors: a mesh larger than the cluster (as `cost_program`), and annotations (the
    templates' and the user's) that match no value or do not divide a dim evenly. This runs
    `resolve_annotations` on the training graph the worker builds, so the check and the
    worker cannot disagree; for llama3-8b (32 layers) it costs about 0.1 s. With a
    `deadline_s` (the team's job deadline, `plan_deadline`), a plan whose build is estimated
    to take longer is refused too (`check_effort`). It reads no database: a request runs it
    on what it loaded, before its write transaction begins."""
    check_training(graph, strategy, fitting_cluster(strategy, spec), deadline_s)


def model_graph(model: Model) -> Graph:
    """The serial graph of a stored model (its blob loaded)."""
    return graph_from_json(blobs.unpack(model.graph_blob))


def fitting_cluster(strategy: Strategy, spec: dict[str, Any] | None) -> Cluster | None:
    """The cluster of `spec` (None without one); the engine's error for a larger mesh."""
    if spec is None:
        return None
    cluster = cluster_from_dict(spec)
    check_mesh_fits(strategy.mesh, cluster)
    return cluster


def check_training(
    graph: Graph, strategy: Strategy, cluster: Cluster | None, deadline_s: float | None
) -> None:
    """The annotations on the training graph of `graph`, then the estimated build against
    `deadline_s` (`check_strategy`)."""
    options = strategy.options  # checked by `Strategy.build`
    optimizer, lr = str(options.get("optimizer", "adamw")), float(options.get("lr", 1e-3))
    training = training_graph(graph, optimizer=optimizer, lr=lr, recompute=strategy.recompute)
    resolve_annotations(training, strategy)
    if deadline_s is not None:
        per_node = cluster.devices_per_node if cluster is not None else None
        check_effort(plan_effort(len(training.ops), strategy.mesh, per_node), deadline_s)


def plan_deadline(session: Session, settings: Settings, team_id: int) -> float:
    """The deadline a new job of the team gets (its limit, else the default), in seconds."""
    return team_limits(session, settings, team_id).job_deadline_s


def check_effort(effort: Effort, deadline_s: float) -> None:
    """422 `too_expensive` when a plan's estimated build (`shardlab.cost.effort`) is longer
    than the job's deadline: it would hold a worker and time out. A plan that is only
    expensive (within the deadline) passes."""
    if effort.seconds <= deadline_s:
        return
    raise ApiError(
        422,
        "too_expensive",
        f"this plan would take {effort.describe()} to build, more than the team's job "
        f"deadline of {deadline_s:g} s: use a smaller mesh, fewer layers, or a cluster whose "
        "nodes hold whole groups of the mesh",
        estimate_s=round(effort.seconds, 1),
        deadline_s=deadline_s,
        ops=effort.ops,
        devices=effort.devices,
        mixed_roles=effort.mixed_roles,
    )


def queue_plan(
    session: Session,
    settings: Settings,
    model: Model,
    strategy: StrategyRow,
    cluster: str | None,
    spec: dict[str, Any] | None,
    author_id: int | None,
) -> tuple[Plan, Job]:
    """Add the plan of `model` under `strategy` on `cluster` (its resolved `spec`) and the
    job that builds it (flushed, not committed)."""
    plan = Plan(team_id=model.team_id, model_id=model.id, strategy_id=strategy.id,
                cluster=cluster, job_id=0, author_id=author_id)  # fmt: skip
    job = ledger.enqueue(session, settings, model.team_id, "plan", {"cluster": spec})
    plan.job_id = job.id
    session.add(plan)
    session.flush()
    job.payload = {"plan_id": plan.id, "cluster": spec}
    return plan, job
