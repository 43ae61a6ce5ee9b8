"""`shardlab measure` of pipelined plans: every rank times its stage's ops on torch ranks (send
and recv included), the trace names each rank's stage and the step is held against the
plan's pipelined cost (tiny llama, pp=2; 1F1B and interleaved)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from shardlab.cli import app
from shardlab.cost.trace import validate_trace
from shardlab.models import build_model
from shardlab.plan import Plan, build_plan
from shardlab.runtime.measure import Measurement, compare, measure, measured_trace
from shardlab.strategy import Strategy

pytest.importorskip("torch.distributed")

#: four layers: an interleaved pipeline of 2 stages x 2 chunks needs one layer per chunk
LLAMA = {"layers": 4, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 64,
         "seq": 8, "batch": 8, "dtype": "float32"}  # fmt: skip
ONE_F_ONE_B = {"schedule": "1f1b", "microbatches": 4}
INTERLEAVED = {"schedule": "interleaved", "microbatches": 2, "virtual_stages": 2}


def _measured(pipeline: dict[str, Any]) -> tuple[Plan, Measurement]:
    strategy = Strategy.build("pp=2", [], options={"pipeline": pipeline})
    plan = build_plan(build_model("llama3-8b", LLAMA), strategy, cluster="cpu-local")
    return plan, measure(plan, steps=2, warmup=1, dtype="float32")


@pytest.fixture(scope="module")
def one_f_one_b() -> tuple[Plan, Measurement]:
    return _measured(ONE_F_ONE_B)


def _check_every_op_timed(m: Measurement) -> None:
    assert m.pipeline is not None
    assert sorted(m.ranks) == [0, 1]
    for rank, timing in m.ranks.items():
        names = {op.name for op in m.program_of(rank).ops}
        assert set(timing.spans) == names and set(timing.durations) == names
        assert all(d > 0 for d in timing.durations.values())
        assert all(end >= start >= 0 for start, end in timing.spans.values())
        assert len(timing.step_ns) == 2 and m.step_time(rank) > 0
    assert m.program_of(0) is m.pipeline.stages[0] and m.program_of(1) is m.pipeline.stages[1]
    assert m.step_max >= m.step_median > 0


def test_every_rank_times_every_op_of_its_stage(one_f_one_b: tuple[Plan, Measurement]) -> None:
    _, m = one_f_one_b
    _check_every_op_timed(m)
    kinds = {op.kind for op in m.program_of(0).ops}
    assert {"send", "recv"} <= kinds
    assert m.to_json()["pipeline"] == {"schedule": "1f1b", "microbatches": 4,
                                       "virtual_stages": 1, "stage_ranks": [[0], [1]]}  # fmt: skip


def test_trace_has_a_process_per_rank_with_its_stage(one_f_one_b: tuple[Plan, Measurement]) -> None:
    _, m = one_f_one_b
    trace = measured_trace(m)
    assert validate_trace(trace) == []
    events = trace["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert procs == {0: "rank 0 (stage 0)", 1: "rank 1 (stage 1)"}
    for rank in (0, 1):
        spans = [e for e in events if e["ph"] == "X" and e["pid"] == rank]
        assert {e["name"] for e in spans} == {op.name for op in m.program_of(rank).ops}
        transfers = [e for e in spans if e["args"]["kind"] in ("send", "recv")]
        assert {e["args"]["kind"] for e in transfers} == {"send", "recv"}
        assert {e["args"]["microbatch"] for e in transfers} == {0, 1, 2, 3}
        assert all(e["args"]["stage"] == rank and e["tid"] == 1 for e in transfers)
    threads = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert threads == {"compute", "comm:pp"}


def test_compare_holds_the_step_against_the_pipelined_cost(
    one_f_one_b: tuple[Plan, Measurement],
) -> None:
    plan, m = one_f_one_b
    assert plan.pipeline is not None and plan.pipeline.cost is not None
    rows = compare(plan, m)
    assert rows[0].name == "step" and rows[0].predicted_s == plan.pipeline.cost.step_time
    assert rows[0].measured_s == m.step_max
    by_name = {(r.group, r.name): r for r in rows}
    for s in (0, 1):
        for part in ("units", "tail", "bubble"):
            assert (row := by_name[("stage", f"{s} {part}")]).predicted_s > 0, row
        units = by_name[("stage", f"{s} units")]
        assert units.measured_s > 0 and math.isfinite(units.error_pct)
    for key in [("step", "step, op-level model"), ("total", "compute"), ("kind", "matmul"),
                ("kind", "adamw"), ("layer", "layers.3")]:  # fmt: skip
        assert by_name[key].predicted_s > 0 and by_name[key].measured_s > 0, key
    assert not {("kind", "send"), ("kind", "recv")} & set(by_name)


def test_interleaved_pipeline_is_measured() -> None:
    plan, m = _measured(INTERLEAVED)
    _check_every_op_timed(m)
    assert m.pipeline is not None and m.pipeline.virtual_stages == 2
    rows = compare(plan, m)
    assert rows[0].name == "step" and rows[0].measured_s > 0 and rows[0].predicted_s > 0
    assert validate_trace(measured_trace(m)) == []


def _args(mesh: str, *more: str) -> list[str]:
    sets = [a for k, v in LLAMA.items() for a in ("--set", f"{k}={v}")]
    return ["measure", "llama3-8b", *sets, "--mesh", mesh, "--backend", "torch", *more]


def test_cli_measures_a_pipeline(tmp_path: Path) -> None:
    out = tmp_path / "measured.json"
    more = ["--nproc", "2", "--schedule", "1f1b", "--microbatches", "4", "--steps", "2",
            "--trace", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, _args("pp=2", *more))
    assert result.exit_code == 0, result.output
    text = result.output
    assert "pipeline 1f1b, 2 stages, 4 micro-batches" in text and "error %" in text
    step = next(line for line in text.splitlines() if line.startswith("step "))
    assert step.split()[-1].lstrip("+-").isdigit()  # predicted, measured, error %
    assert "stage 1 bubble" in text and "kind matmul" in text
    trace = json.loads(out.read_text())
    assert validate_trace(trace) == []
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names == {"rank 0 (stage 0)", "rank 1 (stage 1)"}


@pytest.mark.parametrize(
    ("mesh", "more", "says"),
    [
        ("pp=2", ["--nproc", "4"], "4"),
        ("dp=2", ["--template", "dp", "--schedule", "1f1b"], "pp"),
    ],
)
def test_cli_refuses_what_it_cannot_run(mesh: str, more: list[str], says: str) -> None:
    result = CliRunner().invoke(app, _args(mesh, *more))
    assert result.exit_code == 1
    assert "error:" in result.output and says in result.output
