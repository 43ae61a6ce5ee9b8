"""The `measure` job end to end on SQLite: a tiny llama's dp=2 plan, built by the worker,
is measured by the worker on two torch ranks (its child spawns them) and stored as the
plan's `measured` and `measured_trace` artifacts; and what the engine refuses to measure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from backend import blobs, ledger
from backend.auth import ensure_team
from backend.db import make_engine, session_factory, transaction
from backend.measuring import check_measurable, queue_measurement
from backend.orm import Artifact, Model, Plan, Strategy
from backend.schemas.jobs import MeasurementCreate
from shardlab.cost.clusters import load_cluster
from shardlab.cost.trace import validate_trace
from shardlab.errors import ExecutionError
from shardlab.graph_json import graph_to_json
from shardlab.models import build_model
from tests.worker.conftest import job_row, settings_for
from worker.main import Worker
from worker.measure import check_measurable as engine_check

pytest.importorskip("torch.distributed")

LLAMA = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 64,
         "seq": 8, "batch": 8}  # fmt: skip
CLUSTER = "cpu-local"


def _queue_plan(factory: Any, settings: Any) -> int:
    """The tiny llama under dp=2, costed on `CLUSTER`, queued for the worker."""
    graph = graph_to_json(build_model("llama3-8b", LLAMA))
    blob, _ = blobs.pack(graph)
    with transaction(factory) as session:
        team = ensure_team(session, "alpha")
        model = Model(team_id=team.id, name="tiny", source="preset", preset="llama3-8b",
                      overrides=LLAMA, graph_blob=blob, summary={"params": 1})  # fmt: skip
        strategy = Strategy(team_id=team.id, name="dp", mesh="dp=2", templates=["dp"])
        session.add_all([model, strategy])
        session.flush()
        job = ledger.enqueue(session, settings, team.id, "plan", {})
        plan = Plan(team_id=team.id, model_id=model.id, strategy_id=strategy.id,
                    cluster=CLUSTER, job_id=job.id)  # fmt: skip
        session.add(plan)
        session.flush()
        job.payload = {"plan_id": plan.id, "cluster": load_cluster(CLUSTER).to_json()}
        return plan.id


def test_a_plan_is_measured_on_two_ranks_and_stored(sqlite_url: str, tmp_path: Path) -> None:
    settings = settings_for(sqlite_url, tmp_path)
    engine = make_engine(sqlite_url)
    factory = session_factory(engine)
    worker = Worker(settings, "measure-worker")
    try:
        assert worker.devices.torch, "the worker finds torch"
        plan_id = _queue_plan(factory, settings)
        assert worker.run_until_empty() == 1
        with transaction(factory) as session:
            plan = session.get(Plan, plan_id)
            assert plan is not None
            asked = MeasurementCreate(steps=2)
            run = check_measurable(session, plan, asked)
            job_id = queue_measurement(session, settings, plan.team_id, plan, asked, run).id
        assert worker.run_until_empty() == 1
    finally:
        worker.close()
    job = job_row(factory, job_id)
    assert job.status == "succeeded", job.error
    assert (job.requires_device, job.requires_nproc) == ("cpu", 2)
    assert job.result is not None and job.result["plan_id"] == plan_id
    assert job.result["measured_step_s"] > 0 and job.result["artifacts"] == [
        "measured",
        "measured_trace",
    ]
    mine = select(Artifact).where(Artifact.owner == "plan", Artifact.owner_id == plan_id)
    with factory() as session:
        stored = {a.kind: blobs.unpack(a.data) for a in session.scalars(mine)}
    engine.dispose()
    measured = stored["measured"]
    assert (measured["steps"], measured["nproc"], measured["device"]) == (2, 2, "cpu")
    step = next(r for r in measured["rows"] if r["group"] == "step")
    assert step["name"] == "step" and step["predicted_s"] > 0 and step["measured_s"] > 0
    assert step["error_pct"] is not None
    assert {r["name"] for r in measured["rows"] if r["group"] == "total"} == {
        "compute", "communication"}  # fmt: skip
    ops = measured["ops"]
    assert [r["rank"] for r in measured["ranks"]] == [0, 1]
    for rank in measured["ranks"]:
        assert len(rank["op"]) == len(ops["name"]) and rank["step_s"] > 0
        assert all(e >= s >= 0 for s, e in zip(rank["start_s"], rank["end_s"], strict=True))
        assert rank["start_s"] == sorted(rank["start_s"])
    assert {"compute", "comm:dp"} == set(ops["stream"])
    assert validate_trace(stored["measured_trace"]) == []
    assert "timelines" in stored  # the plan's own artifacts stay


def test_the_engine_refuses_what_it_cannot_measure() -> None:
    graph = graph_to_json(build_model("llama3-8b", LLAMA))
    base = {"graph": graph, "strategy": {"mesh": "dp=2", "templates": ["dp"]},
            "cluster": load_cluster(CLUSTER).to_json()}  # fmt: skip
    assert engine_check(base) == 2
    with pytest.raises(ExecutionError, match="cluster"):
        engine_check({**base, "cluster": None})
    with pytest.raises(ExecutionError, match="mesh"):
        engine_check({**base, "nproc": 4})
    big = graph_to_json(build_model("llama3-8b", {"layers": 1}))
    with pytest.raises(ExecutionError, match="GiB"):
        engine_check({**base, "graph": big})
