"""Worker test fixtures: a migrated database (SQLite file, or this process's own schema of
the PostgreSQL `test` database: `tests/databases.py`), and helpers that queue jobs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from backend import blobs, ledger
from backend.auth import ensure_team
from backend.db import make_engine, session_factory, transaction
from backend.orm import Job, Model, Plan, Strategy
from backend.settings import Settings
from shardlab.cost.clusters import load_cluster
from shardlab.graph_json import graph_to_json
from shardlab.models import build_model
from tests.databases import fresh_database


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated, empty database of each kind (`tests/databases.py`)."""
    return fresh_database(request, request.param, tmp_path)


@pytest.fixture
def sqlite_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return fresh_database(request, "sqlite", tmp_path)


def settings_for(url: str, tmp_path: Path, **numbers: str) -> Settings:
    env = {"SHARDLAB_DATA_DIR": str(tmp_path / "data"), "SHARDLAB_DATABASE_URL": url}
    env.update({f"SHARDLAB_{k.upper()}": v for k, v in numbers.items()})
    return Settings.from_env(env)


@pytest.fixture
def factory(db_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(db_url)
    yield session_factory(engine)
    engine.dispose()


def queue_plan(
    factory: sessionmaker[Session],
    settings: Settings,
    preset: str = "llama3-70b",
    mesh: str = "dp=8,tp=8",
    deadline_s: float | None = None,
) -> tuple[int, int]:
    """A model, a strategy and a plan costed on h100-sxm-8x8, queued: (plan id, job id)."""
    blob, _ = blobs.pack(graph_to_json(build_model(preset)))
    spec = load_cluster("h100-sxm-8x8").to_json()
    with transaction(factory) as session:
        team = ensure_team(session, "alpha")
        model = Model(team_id=team.id, name=preset, source="preset", preset=preset, graph_blob=blob)
        strategy = Strategy(
            team_id=team.id,
            name="s",
            mesh=mesh,
            templates=["dp", "megatron_tp", "sequence_parallel"] if "tp=" in mesh else ["dp"],
        )
        session.add_all([model, strategy])
        session.flush()
        job = ledger.enqueue(session, settings, team.id, "plan", {}, deadline_s)
        plan = Plan(
            team_id=team.id,
            model_id=model.id,
            strategy_id=strategy.id,
            cluster="h100-sxm-8x8",
            job_id=job.id,
        )
        session.add(plan)
        session.flush()
        job.payload = {"plan_id": plan.id, "cluster": spec}
        return plan.id, job.id


def job_row(factory: sessionmaker[Session], job_id: int) -> Job:
    with factory() as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job
