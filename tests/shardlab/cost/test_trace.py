"""Chrome trace export: a valid trace-event file with one process per rank, one thread per
stream, and every op's placements and comm details."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardlab.cost.timeline import SimulationError, simulate
from shardlab.cost.trace import chrome_trace, validate_trace, write_chrome_trace
from shardlab.ir import OpRole
from shardlab.mesh import Mesh
from shardlab.models import build_model
from shardlab.placement import Partial, Replicate
from shardlab.plan import build_plan
from shardlab.program import DistOp, DistProgram
from shardlab.reshard import CommStep
from shardlab.strategy import Strategy


def durations(op: DistOp, rank: int) -> float:
    if op.comm is not None:
        return 5e-6 + op.comm.bytes_per_rank / 100e9
    return 1e-6 * (1 + len(op.inputs))


@pytest.fixture(scope="module")
def program() -> DistProgram:
    strategy = Strategy.build("dp=2,tp=2", ["dp", "megatron_tp"])
    # float32: the trace does not depend on the dtype, and it avoids the mixed-precision path
    return build_plan(build_model("llama3-8b", {"layers": 2, "dtype": "float32"}), strategy).program


def test_the_trace_of_a_dp_tp_plan_is_valid_and_complete(program: DistProgram) -> None:
    tl = simulate(program, durations)
    data = chrome_trace(tl, program)
    assert validate_trace(data) == []
    assert validate_trace(json.loads(json.dumps(data))) == []
    assert data["displayTimeUnit"] == "ms"
    assert data["otherData"]["represents"] == {"0": [0, 1, 2, 3]}
    events = data["traceEvents"]
    processes = [e for e in events if e["ph"] == "M" and e["name"] == "process_name"]
    assert [(e["pid"], e["args"]["name"]) for e in processes] == [(0, "rank 0 (for ranks 0-3)")]
    threads = {e["args"]["name"]: e["tid"] for e in events if e["name"] == "thread_name"}
    assert threads == {"compute": 0, "comm:dp": 1, "comm:tp": 2}
    spans = [e for e in events if e["ph"] == "X"]
    assert len(spans) == len(program.ops)
    assert all(e["ts"] >= 0 and e["dur"] >= 0 for e in spans)
    assert max(e["ts"] + e["dur"] for e in spans) == pytest.approx(tl.step_time * 1e6)
    by_name = {e["name"]: e for e in spans}
    q = by_name["layers.0.attn.q_proj"]
    assert q["cat"] == "forward" and q["tid"] == 0
    op = next(o for o in program.ops if o.name == "layers.0.attn.q_proj")
    assert q["dur"] == pytest.approx(durations(op, 0) * 1e6)
    assert q["args"]["scope"] == "layers.0.attn.q_proj" and q["args"]["kind"] == "linear"
    assert q["args"]["placements"] == {v: str(program.specs[v]) for v in (*op.outputs, *op.inputs)}
    reduce = next(o for o in program.ops if o.comm and o.comm.kind == "all_reduce")
    assert reduce.comm is not None
    ar = by_name[reduce.name]
    assert ar["cat"] == "comm" and ar["tid"] == threads[reduce.stream]
    assert ar["args"]["bytes"] == reduce.comm.bytes_per_rank > 0
    assert ar["args"]["reason"] == reduce.reason and "bytes per rank" in ar["args"]["reason"]
    assert 0 <= ar["args"]["exposed_us"] <= ar["dur"] + 1e-9


def test_requested_ranks_show_their_representative(program: DistProgram, tmp_path: Path) -> None:
    tl = simulate(program, durations)
    data = chrome_trace(tl, program, ranks=[3, 1])
    assert validate_trace(data) == []
    names = [e["args"]["name"] for e in data["traceEvents"] if e["name"] == "process_name"]
    assert names == ["rank 3", "rank 1"]
    spans = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == {1, 3}
    one = [(e["name"], e["ts"]) for e in spans if e["pid"] == 1]
    three = [(e["name"], e["ts"]) for e in spans if e["pid"] == 3]
    assert one == three
    path = write_chrome_trace(tmp_path / "step.json", tl, program, ranks=[0])
    assert validate_trace(json.loads(path.read_text())) == []
    with pytest.raises(SimulationError):
        chrome_trace(tl, program, ranks=[9])


def test_ranks_with_different_timelines_get_their_own_process() -> None:
    step = CommStep("all_reduce", "dp", None, Partial("sum"), Replicate(), 8.0, "sum")
    ops = [
        DistOp("a", "matmul", (), ("x",), "compute", OpRole.BACKWARD, scope="layers.0"),
        DistOp(
            "ar",
            "all_reduce",
            ("x",),
            ("y",),
            "comm:dp",
            OpRole.COMM,
            comm=step,
            reason="grads are partial sums",
            deps=("a",),
        ),
    ]
    prog = DistProgram(Mesh.parse("dp=2"), ops, {}, {}, {})
    tl = simulate(prog, lambda op, r: 2.0 if (op.name, r) == ("a", 1) else 1.0)
    data = chrome_trace(tl, prog)
    assert validate_trace(data) == []
    assert data["otherData"]["represents"] == {"0": [0], "1": [1]}
    spans = {(e["pid"], e["name"]): e for e in data["traceEvents"] if e["ph"] == "X"}
    assert spans[(0, "ar")]["ts"] == spans[(1, "ar")]["ts"] == 2e6
    assert spans[(0, "ar")]["args"]["exposed_us"] == 1e6
    assert spans[(1, "a")]["args"]["placements"] == {}


def test_the_validator_names_what_is_wrong() -> None:
    assert validate_trace({"nope": []}) == ["the trace has no 'traceEvents' list"]
    assert validate_trace(3) == ["a trace is an object or a list, not int"]
    bad = [
        {"name": "x", "ph": "X", "ts": -1, "pid": 0, "tid": 0, "dur": 1},
        {"name": "x", "ph": "X", "ts": 0, "pid": "0", "tid": 0},
        {"ph": "M", "ts": 0, "pid": 0, "tid": 0, "args": {}},
        "not an event",
    ]
    problems = validate_trace({"traceEvents": bad, "displayTimeUnit": "s"})
    assert problems == [
        "displayTimeUnit 's' is not ms or ns",
        "event 0: 'ts' must be a number >= 0, got -1",
        "event 1: 'pid' must be an integer, got '0'",
        "event 1: 'X' event needs 'dur' >= 0, got None",
        "event 2: 'name' is missing or not a string",
        "event 2: 'M' event None needs a string args.name",
        "event 3: not an object",
    ]
    assert validate_trace([{"name": "x", "ph": "i", "ts": 0.5, "pid": 1, "tid": 2}]) == []
