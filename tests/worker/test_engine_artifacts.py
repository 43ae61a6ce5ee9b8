"""The per-stage `timelines` and `memory` artifacts of `worker.engine.run_plan` hold the
cost model's numbers: the same step time, events, memory profile as `Plan.stages`."""

from __future__ import annotations

import json
import zlib
from typing import Any

import pytest

from shardlab.cost.clusters import load_cluster
from shardlab.graph_json import graph_to_json
from shardlab.models import build_model
from shardlab.plan import Plan
from worker.engine import build, jsonable, run_plan

#: 6 heads so that tp=3 divides them
TINY = {"layers": 2, "hidden": 48, "heads": 6, "kv_heads": 6, "ffn": 96, "vocab": 96,
        "seq": 8, "batch": 4}  # fmt: skip


def _inputs(mesh: str, cluster: str | None) -> dict[str, Any]:
    return {
        "graph": graph_to_json(build_model("llama3-8b", TINY)),
        "strategy": {"mesh": mesh, "templates": ["dp", "megatron_tp"] if "tp=" in mesh else ["dp"]},
        "cluster": load_cluster(cluster).to_json() if cluster else None,
    }


def _silent(fraction: float, message: str) -> None:
    pass


@pytest.fixture(scope="module")
def several_roles() -> tuple[Plan, dict[str, Any]]:
    """dp=2 x tp=3 on two nodes of 4: tp groups {0,1,2} sit on one node, {3,4,5} on two, so
    the cost model simulates several representative ranks."""
    inputs = _inputs("dp=2,tp=3", "h100-sxm-2x4")
    result = jsonable(run_plan(inputs, _silent))  # what the child process sends back
    return build(inputs, _silent), result["artifacts"]


def test_timelines_hold_every_stage_as_costed(several_roles: tuple[Plan, dict[str, Any]]) -> None:
    plan, artifacts = several_roles
    stages = artifacts["timelines"]["stages"]
    assert [s["name"] for s in stages] == [s.name for s in plan.stages]
    assert len(stages) >= 3
    for stage, data in zip(plan.stages, stages, strict=True):
        assert stage.cost is not None
        timeline = stage.cost.timeline
        assert data["step_time"] == pytest.approx(timeline.step_time, rel=1e-12)
        assert data["cost"]["step_time_s"] == pytest.approx(stage.cost.step_time, rel=1e-12)
        assert data["cost"]["mfu"] == pytest.approx(stage.cost.mfu, rel=1e-12)
        assert data["ops"] == len(stage.program.ops)
        assert data["message"] == stage.summary.get("message", "")
        assert data["rank_of_role"] == {str(r): p for r, p in timeline.rank_of_role.items()}
        assert sorted(int(r) for r in data["ranks"]) == sorted(timeline.events)
        table = data["op_table"]
        assert table["name"] == [op.name for op in stage.program.ops]
        for rep, events in timeline.events.items():
            got = data["ranks"][str(rep)]
            cols = got["events"]
            assert len(cols["op"]) == len(events) == len(stage.program.ops)
            assert got["stands_for"] == timeline.ranks_of(rep)
            assert got["exposed_comm"] == pytest.approx(timeline.exposed_comm(rep), abs=1e-15)
            for n, e in enumerate(events):
                i = cols["op"][n]
                assert table["name"][i] == e.name and table["stream"][i] == e.stream
                assert table["role"][i] == e.role and table["scope"][i] == e.scope
                assert (cols["start"][n], cols["end"][n]) == (e.start, e.end)
                assert cols["exposed"][n] == e.exposed
                assert table["bytes"][i] == e.bytes
        ops = {op.name: op for op in stage.program.ops}
        for name, deps in zip(table["name"], table["deps"], strict=True):
            assert [table["name"][d] for d in deps] == list(ops[name].deps)
        kinds = {op.kind for op in stage.program.ops if op.comm is not None}
        assert set(data["collectives"]) == kinds
    reps = {len(s["ranks"]) for s in stages}
    assert reps != {1}, "this mesh should need several representative ranks"


def test_memory_holds_each_stages_profile(several_roles: tuple[Plan, dict[str, Any]]) -> None:
    plan, artifacts = several_roles
    stages = artifacts["memory"]["stages"]
    assert [s["name"] for s in stages] == [s.name for s in plan.stages]
    for stage, data in zip(plan.stages, stages, strict=True):
        assert stage.cost is not None
        profile = stage.cost.memory
        assert data["capacity_bytes"] == stage.cost.cluster.hbm_bytes
        (entry,) = data["ranks"]  # the cost model profiles one rank: it stands for all
        assert entry["rank"] == profile.rank == 0
        assert entry["stands_for"] == list(range(6))
        assert entry["peak_bytes"] == profile.peak_bytes
        assert entry["breakdown_at_peak"] == profile.breakdown_at_peak
        assert sum(entry["breakdown_at_peak"].values()) == profile.peak_bytes
        assert len(entry["largest_at_peak"]) == len(profile.largest_at_peak)
        series = entry["series"]
        assert max(series["bytes"]) == profile.peak_bytes
        assert profile.peak_op in series["op"]
        starts = {e.name: e.start for e in stage.cost.timeline.events_of(0)}
        assert series["t"] == [starts[name] for name in series["op"]]
        names = [op.name for op in stage.program.ops]
        assert [names[i] for i in series["index"]] == series["op"]


def test_artifacts_stay_small(several_roles: tuple[Plan, dict[str, Any]]) -> None:
    _, artifacts = several_roles
    for kind in ("timelines", "memory"):
        raw = json.dumps(artifacts[kind], separators=(",", ":")).encode()
        assert len(zlib.compress(raw, 6)) < 200_000, kind


def test_a_plan_without_cluster_has_no_timelines() -> None:
    artifacts = run_plan(_inputs("dp=2", None), _silent)["artifacts"]
    assert "timelines" not in artifacts and "memory" not in artifacts and "trace" not in artifacts
