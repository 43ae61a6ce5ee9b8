"""Queueing a plan build, shared by plans, checks and new strategy versions: the cheap
refusals the engine can make at once (a mesh too large, a mesh larger than the cluster,
annotations that do not fit the model) and the plan and job rows the worker picks up.

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
from shardlab.autodiff import training_graph
from shardlab.cost.clusters import check_mesh_fits, cluster_from_dict
from shardlab.graph_json import graph_from_json
from shardlab.passes.manager import resolve_passes
from shardlab.spmd.constraints import resolve_annotations
from shardlab.strategy import Strategy

#: The most devices a mesh may have (the engine lists every rank of a mesh).
MAX_MESH_DEVICES = 1 << 20


def _check_mesh_size(mesh: str) -> None:
    """Refuse absurd meshes before the engine enumerates their ranks."""
    devices = 1
    for token in mesh.split(","):
        size = token.partition("=")[2].strip()
        if size.isascii() and size.isdigit():
            devices *= int(size) if len(size) <= 9 else MAX_MESH_DEVICES + 1
        if devices > MAX_MESH_DEVICES:
            raise ApiError(
                422,
                "invalid_mesh",
                f"mesh {mesh!r} has more than {MAX_MESH_DEVICES} devices",
                mesh=mesh,
                limit=MAX_MESH_DEVICES,
            )


def engine_strategy(
    mesh: str, templates: list[str], annotations: list[str], options: dict[str, Any]
) -> Strategy:
    """The engine's Strategy; its errors name the mesh axis, template, annotation or pass."""
    _check_mesh_size(mesh)
    with user_input("invalid_strategy", "invalid strategy"):
        strategy = Strategy.build(mesh, templates, annotations, options)
        resolve_passes(options.get("passes"))
    return strategy


def check_plan(model: Model, row: StrategyRow, spec: dict[str, Any] | None) -> None:
    """Refuse at once what the worker would fail on before its first pass, with the engine's
    own errors: a mesh larger than the cluster (as `cost_program`), and annotations (the
    templates' and the user's) that match no value or do not divide a dim evenly. This runs
    `resolve_annotations` on the training graph the worker builds, so the check and the
    worker cannot disagree; for llama3-8b (32 layers) it costs about 0.1 s."""
    strategy = engine_strategy(row.mesh, row.templates, row.annotations, row.options)
    mesh = strategy.mesh
    if spec is not None:
        cluster = cluster_from_dict(spec)
        check_mesh_fits(mesh, cluster)
    graph = graph_from_json(blobs.unpack(model.graph_blob))
    options = strategy.options  # checked by `Strategy.build`
    optimizer, lr = str(options.get("optimizer", "adamw")), float(options.get("lr", 1e-3))
    training = training_graph(graph, optimizer=optimizer, lr=lr, recompute=strategy.recompute)
    resolve_annotations(training, strategy)


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
