"""`shardlab measure`: a plan's step timed on torch ranks, traced and compared with the cost
model (tiny llama, dp=2; ranks forked from the torch backend's forkserver)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shardlab.cli import app
from shardlab.cost.trace import validate_trace
from shardlab.models import build_model
from shardlab.plan import Plan, build_plan
from shardlab.runtime.measure import Measurement, compare, measure, measured_trace
from shardlab.runtime.torch_rank import RankTiming
from shardlab.strategy import Strategy

pytest.importorskip("torch.distributed")

LLAMA = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 64,
         "seq": 8, "batch": 8, "dtype": "float32"}  # fmt: skip


@pytest.fixture(scope="module")
def measured() -> tuple[Plan, Measurement]:
    plan = build_plan(build_model("llama3-8b", LLAMA), Strategy.build("dp=2", ["dp"]),
                      cluster="cpu-local")  # fmt: skip
    return plan, measure(plan, steps=3, warmup=1, dtype="float32")


def test_every_rank_times_every_op(measured: tuple[Plan, Measurement]) -> None:
    _, m = measured
    names = {op.name for op in m.program.ops}
    assert sorted(m.ranks) == [0, 1]
    for rank, timing in m.ranks.items():
        assert set(timing.spans) == names and set(timing.durations) == names
        assert all(d > 0 for d in timing.durations.values())
        assert all(end >= start >= 0 for start, end in timing.spans.values())
        assert len(timing.step_ns) == 3 and m.step_time(rank) > 0
    assert m.step_max >= m.step_median > 0


def test_measured_trace_has_one_process_per_rank(measured: tuple[Plan, Measurement]) -> None:
    _, m = measured
    trace = measured_trace(m)
    assert validate_trace(trace) == []
    events = trace["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert procs == {0: "rank 0", 1: "rank 1"}
    for rank in (0, 1):
        spans = [e for e in events if e["ph"] == "X" and e["pid"] == rank]
        assert {e["name"] for e in spans} == {op.name for op in m.program.ops}
        assert all(e["dur"] > 0 for e in spans)
    threads = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert threads == {"compute", "comm:dp"}


def test_compare_rows_have_finite_errors(measured: tuple[Plan, Measurement]) -> None:
    plan, m = measured
    rows = compare(plan, m)
    by_name = {(r.group, r.name): r for r in rows}
    for key in [("step", "step"), ("total", "compute"), ("total", "communication")]:
        row = by_name[key]
        assert row.predicted_s > 0 and row.measured_s > 0 and math.isfinite(row.error_pct)
    assert ("kind", "all_reduce") in by_name and ("layer", "layers.0") in by_name


def test_cli_prints_the_table_and_writes_the_trace(tmp_path: Path) -> None:
    out = tmp_path / "measured.json"
    sets = [a for k, v in LLAMA.items() for a in ("--set", f"{k}={v}")]
    args = ["measure", "llama3-8b", "--mesh", "dp=2", "--template", "dp", *sets,
            "--backend", "torch", "--nproc", "2", "--steps", "2", "--trace", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "communication" in result.output and "error %" in result.output
    assert validate_trace(json.loads(out.read_text())) == []


def test_an_ops_time_over_the_ranks_is_their_longest_or_their_median(
    measured: tuple[Plan, Measurement],
) -> None:
    """Calibration reads compute ops at their longest over the ranks and collectives at
    their median (`Measurement.slowest_op_seconds`, `typical_op_seconds`)."""
    _, m = measured
    three = Measurement(m.program, {**m.ranks, 2: _scaled(m.ranks[0], 3)}, m.steps, m.warmup)
    for name, ns in m.ranks[0].durations.items():
        others = sorted([ns, m.ranks[1].durations[name], 3 * ns])
        assert three.slowest_op_seconds()[name] == pytest.approx(others[-1] * 1e-9)
        assert three.typical_op_seconds()[name] == pytest.approx(others[1] * 1e-9)


def _scaled(timing: RankTiming, k: int) -> RankTiming:
    """`timing` with every op `k` times as long."""
    durations = {name: k * ns for name, ns in timing.durations.items()}
    return dataclasses.replace(timing, rank=2, durations=durations)
