"""Demo data (`shardlab serve --demo`): preset models, strategies and queued plans for a team.

Seeding is idempotent: a model or strategy whose name the team already has is left alone, and
plans are queued only for a team without plans (the worker builds them after start).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from backend import ledger
from backend.blobs import pack
from backend.db import transaction
from backend.orm import Model, Plan, Strategy
from backend.routers.clusters import resolve_cluster
from backend.settings import Settings
from shardlab.graph_json import graph_to_json
from shardlab.models import build_model
from shardlab.summary import model_summary

TINY_LLAMA: dict[str, Any] = {
    "layers": 2,
    "hidden": 64,
    "heads": 4,
    "kv_heads": 2,
    "ffn": 128,
    "vocab": 64,
    "seq": 8,
    "batch": 8,
}


@dataclass(frozen=True, slots=True)
class DemoModel:
    name: str
    preset: str
    overrides: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DemoStrategy:
    name: str
    mesh: str
    templates: tuple[str, ...]


DEMO_MODELS = (
    # a global batch of 64 sequences, so the fsdp64 plan has one per rank
    DemoModel("llama3-8b", "llama3-8b", {"batch": 64}),
    DemoModel("llama3-8b-tiny", "llama3-8b", TINY_LLAMA),
    DemoModel("gpt2", "gpt2"),
)
DEMO_STRATEGIES = (
    DemoStrategy("dp8-tp8", "dp=8,tp=8", ("dp", "megatron_tp", "sequence_parallel")),
    DemoStrategy("fsdp64", "dp=64", ("dp", "fsdp")),
    DemoStrategy("dp2-tp2", "dp=2,tp=2", ("dp", "megatron_tp")),
)


@dataclass(frozen=True, slots=True)
class DemoPlan:
    model: str
    strategy: str
    cluster: str


#: two llama3-8b plans on one 64-GPU cluster to compare, and a small one that builds at once
DEMO_PLANS = (
    DemoPlan("llama3-8b-tiny", "dp2-tp2", "h100-sxm-1x4"),
    DemoPlan("llama3-8b", "dp8-tp8", "h100-sxm-8x8"),
    DemoPlan("llama3-8b", "fsdp64", "h100-sxm-8x8"),
)


def model_row(team_id: int, demo: DemoModel) -> Model:
    """The Model row of a preset build: compressed graph JSON and its summary."""
    graph = build_model(demo.preset, demo.overrides)
    return Model(
        team_id=team_id,
        name=demo.name,
        source="preset",
        preset=demo.preset,
        overrides=dict(demo.overrides),
        graph_blob=pack(graph_to_json(graph))[0],
        summary=model_summary(graph),
    )


def seed_demo(
    factory: sessionmaker[Session], team_id: int, settings: Settings | None = None
) -> list[str]:
    """Add the demo models and strategies the team lacks and, given the settings (for the
    job ledger), queue the demo plans if the team has none; returns what was added."""
    added: list[str] = []
    with transaction(factory, immediate=True) as session:
        models = set(session.scalars(select(Model.name).where(Model.team_id == team_id)))
        for demo in DEMO_MODELS:
            if demo.name not in models:
                session.add(model_row(team_id, demo))
                added.append(demo.name)
        strategies = set(session.scalars(select(Strategy.name).where(Strategy.team_id == team_id)))
        for strat in DEMO_STRATEGIES:
            if strat.name not in strategies:
                session.add(
                    Strategy(
                        team_id=team_id,
                        name=strat.name,
                        version=1,
                        mesh=strat.mesh,
                        templates=list(strat.templates),
                        annotations=[],
                        options={},
                    )
                )
                added.append(strat.name)
        if (
            settings is not None
            and session.scalar(select(Plan.id).where(Plan.team_id == team_id).limit(1)) is None
        ):
            session.flush()
            added += [_queue_plan(session, settings, team_id, plan) for plan in DEMO_PLANS]
    return added


def _queue_plan(session: Session, settings: Settings, team_id: int, demo: DemoPlan) -> str:
    """Queue one demo plan (its model and strategy exist); the plan's label."""
    model_id = session.scalar(
        select(Model.id).where(Model.team_id == team_id, Model.name == demo.model)
    )
    strategy_id = session.scalar(
        select(Strategy.id)
        .where(Strategy.team_id == team_id, Strategy.name == demo.strategy)
        .order_by(Strategy.version.desc())
        .limit(1)
    )
    assert model_id is not None and strategy_id is not None, demo
    spec = resolve_cluster(session, team_id, demo.cluster)
    job = ledger.enqueue(session, settings, team_id, "plan", {"cluster": spec})
    plan = Plan(
        team_id=team_id,
        model_id=model_id,
        strategy_id=strategy_id,
        cluster=demo.cluster,
        job_id=job.id,
    )
    session.add(plan)
    session.flush()
    job.payload = {"plan_id": plan.id, "cluster": spec}
    return f"plan {demo.model} x {demo.strategy} on {demo.cluster}"
