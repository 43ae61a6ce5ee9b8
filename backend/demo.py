"""Demo data (`shardlab serve --demo`): a few preset models and two strategies for a team.

Seeding is idempotent: a model or strategy whose name the team already has is left alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from backend.blobs import pack
from backend.db import transaction
from backend.orm import Model, Strategy
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
    DemoModel("llama3-8b", "llama3-8b"),
    DemoModel("llama3-8b-tiny", "llama3-8b", TINY_LLAMA),
    DemoModel("gpt2", "gpt2"),
)
DEMO_STRATEGIES = (
    DemoStrategy("dp8-tp8", "dp=8,tp=8", ("dp", "megatron_tp", "sequence_parallel")),
    DemoStrategy("fsdp64", "dp=64", ("dp", "fsdp")),
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


def seed_demo(factory: sessionmaker[Session], team_id: int) -> list[str]:
    """Add the demo models and strategies the team lacks; returns the names added."""
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
    return added
