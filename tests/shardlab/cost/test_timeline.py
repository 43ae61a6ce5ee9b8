"""Timeline simulation: stream order, deps, overlap, rendezvous, send/recv, symmetry."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardlab.cost.timeline import (
    SimulationError,
    Timeline,
    mfu,
    same_role,
    simulate,
    tokens_per_second,
)
from shardlab.ir import OpRole
from shardlab.mesh import Mesh
from shardlab.models import build_model
from shardlab.placement import Partial, Replicate, Shard
from shardlab.plan import build_plan
from shardlab.program import DistOp, DistProgram
from shardlab.reshard import CommStep
from shardlab.strategy import Strategy

Durations = Callable[[DistOp, int], float]


def compute(name: str, *deps: str, scope: str = "") -> DistOp:
    return DistOp(
        name, "matmul", (), (f"{name}.out",), "compute", OpRole.FORWARD, scope=scope, deps=deps
    )


def all_reduce(name: str, *deps: str, axis: str = "dp", nbytes: float = 1e6) -> DistOp:
    step = CommStep("all_reduce", axis, None, Partial("sum"), Replicate(), nbytes, "sum them")
    return DistOp(
        name,
        "all_reduce",
        (),
        (f"{name}.out",),
        f"comm:{axis}",
        OpRole.COMM,
        comm=step,
        reason=f"{name}: P(sum) -> R",
        deps=deps,
    )


def local_slice(name: str, *deps: str, axis: str = "dp") -> DistOp:
    step = CommStep("local_slice", axis, 0, Replicate(), Shard(0), 0.0, "keep my slice")
    return DistOp(
        name, "local_slice", (), (f"{name}.out",), f"comm:{axis}", OpRole.COMM, comm=step, deps=deps
    )


def p2p(name: str, kind: str, peer: int | Mapping[int, int], *deps: str, tag: str = "") -> DistOp:
    attrs: dict[str, Any] = {"peer": peer, "tag": tag, "bytes": 4096.0}
    return DistOp(name, kind, (), (f"{name}.out",), "comm:pp", OpRole.COMM, attrs=attrs, deps=deps)


def program(ops: Iterable[DistOp], mesh: str = "dp=2") -> DistProgram:
    return DistProgram(Mesh.parse(mesh), list(ops), {}, {}, {})


def table(
    times: Mapping[str, float], per_rank: Mapping[int, Mapping[str, float]] | None = None
) -> Durations:
    """Durations from a table by op name, with optional per-rank overrides."""
    per_rank = per_rank or {}

    def durations(op: DistOp, rank: int) -> float:
        return per_rank.get(rank, {}).get(op.name, times[op.name])

    return durations


def span(tl: Timeline, rank: int, name: str) -> tuple[float, float]:
    (event,) = [e for e in tl.events_of(rank) if e.name == name]
    return event.start, event.end


def test_a_serial_chain_on_one_stream_sums() -> None:
    prog = program([compute("a"), compute("b", "a"), compute("c")])
    tl = simulate(prog, table({"a": 1.0, "b": 2.0, "c": 3.0}))
    assert tl.step_time == 6.0
    assert [span(tl, 0, n) for n in "abc"] == [(0.0, 1.0), (1.0, 3.0), (3.0, 6.0)]
    assert tl.compute_time(1) == 6.0 and tl.comm_time(1) == 0.0
    assert tl.overlap_fraction(0) == 0.0


def test_comm_overlapping_independent_compute_takes_the_max_and_exposes_the_rest() -> None:
    prog = program([compute("a"), all_reduce("ar", "a"), compute("b", "a")])
    tl = simulate(prog, table({"a": 1.0, "ar": 4.0, "b": 2.0}))
    assert span(tl, 0, "ar") == (1.0, 5.0) and span(tl, 0, "b") == (1.0, 3.0)
    assert tl.step_time == 5.0
    assert tl.comm_time(0) == 4.0 and tl.compute_time(0) == 3.0
    assert tl.exposed_comm(0) == 2.0
    assert tl.overlap_fraction(0) == 0.5
    (ar,) = [e for e in tl.events_of(0) if e.name == "ar"]
    assert ar.exposed == 2.0 and ar.bytes == 1e6 and ar.role == "comm" and ar.stream == "comm:dp"
    assert all(e.exposed == 0.0 and e.bytes == 0.0 for e in tl.events_of(0) if not e.is_comm)


def test_a_compute_op_that_depends_on_comm_waits_for_it() -> None:
    prog = program([compute("a"), all_reduce("ar", "a"), compute("b", "a"), compute("c", "ar")])
    tl = simulate(prog, table({"a": 1.0, "ar": 4.0, "b": 2.0, "c": 0.5}))
    assert span(tl, 0, "c") == (5.0, 5.5)
    assert tl.step_time == 5.5


def test_comm_streams_are_separate_lanes_and_exposed_comm_counts_their_union() -> None:
    prog = program(
        [all_reduce("x", axis="dp"), all_reduce("y", axis="tp"), compute("a")], mesh="dp=2,tp=2"
    )
    tl = simulate(prog, table({"x": 3.0, "y": 2.0, "a": 1.0}))
    assert span(tl, 0, "x") == (0.0, 3.0) and span(tl, 0, "y") == (0.0, 2.0)
    assert tl.comm_time(0) == 3.0
    assert tl.exposed_comm(0) == 2.0
    assert {e.name: e.exposed for e in tl.events_of(3) if e.is_comm} == {"x": 2.0, "y": 1.0}


def test_a_collective_starts_when_the_slowest_member_is_ready() -> None:
    prog = program([compute("a"), all_reduce("ar", "a"), compute("b", "ar")])
    durations = table({"a": 1.0, "ar": 2.0, "b": 1.0}, {1: {"a": 3.0, "ar": 2.5}})
    tl = simulate(prog, durations)
    assert span(tl, 0, "ar") == (3.0, 5.5) and span(tl, 1, "ar") == (3.0, 5.5)
    assert span(tl, 0, "b") == (5.5, 6.5)
    assert tl.step_time == 6.5
    assert tl.rank_of_role == {0: 0, 1: 1}
    assert tl.exposed_comm(0) == 2.5


def test_local_comm_steps_need_no_partner() -> None:
    prog = program([compute("a"), local_slice("s", "a"), compute("b", "s")])
    tl = simulate(prog, table({"a": 1.0, "s": 0.25, "b": 1.0}, {1: {"a": 3.0}}))
    assert span(tl, 0, "s") == (1.0, 1.25) and span(tl, 1, "s") == (3.0, 3.25)
    assert tl.step_time == 4.25


def test_overlap_slowdown_stretches_only_the_overlapped_work() -> None:
    prog = program([compute("a"), all_reduce("ar")])
    tl = simulate(prog, table({"a": 10.0, "ar": 4.0}), overlap_slowdown=0.5)
    # 4 s overlapped at 1/1.5 speed do 8/3 s of work; the other 22/3 s run at full speed
    assert span(tl, 0, "a") == pytest.approx((0.0, 4.0 + 10.0 - 4.0 / 1.5))
    assert span(tl, 0, "ar") == (0.0, 4.0)
    short = simulate(prog, table({"a": 2.0, "ar": 4.0}), overlap_slowdown=0.5)
    assert span(short, 0, "a") == pytest.approx((0.0, 3.0))
    plain = simulate(prog, table({"a": 10.0, "ar": 4.0}))
    assert span(plain, 0, "a") == (0.0, 10.0)


def test_overlap_slowdown_follows_comm_that_starts_and_stops_mid_op() -> None:
    prog = program([compute("a"), compute("b"), local_slice("c1"), all_reduce("c2", "a")])
    tl = simulate(prog, table({"a": 1.0, "b": 6.0, "c1": 0.5, "c2": 2.0}), overlap_slowdown=0.5)
    a_end = 1.0 + 0.5 * (0.5 / 1.5)  # c1 overlaps the first 0.5 s of a
    assert span(tl, 0, "a") == pytest.approx((0.0, a_end))
    assert span(tl, 0, "c2") == pytest.approx((a_end, a_end + 2.0))
    assert span(tl, 0, "b") == pytest.approx((a_end, a_end + 6.0 + 0.5 * (2.0 / 1.5)))


def test_a_recv_ends_no_earlier_than_its_send_started_plus_its_duration() -> None:
    ops = [
        compute("a"),
        p2p("send_act", "send", {0: 1}, "a", tag="act"),
        p2p("recv_act", "recv", {1: 0}, tag="act"),
        compute("b", "recv_act"),
    ]
    times = {"a": 1.0, "send_act": 2.0, "recv_act": 2.0, "b": 1.0}
    tl = simulate(program(ops, "pp=2"), table(times))
    assert span(tl, 0, "send_act") == (1.0, 3.0)
    # b's dep on recv_act does not run on rank 0, so it does not hold b back there
    assert [e.name for e in tl.events_of(0)] == ["a", "send_act", "b"]
    assert [e.name for e in tl.events_of(1)] == ["a", "recv_act", "b"]
    assert span(tl, 1, "recv_act") == (0.0, 3.0)
    assert span(tl, 1, "b") == (3.0, 4.0)
    assert tl.rank_of_role == {0: 0, 1: 1}
    (recv,) = [e for e in tl.events_of(1) if e.kind == "recv"]
    assert recv.bytes == 4096.0


def test_a_late_recv_takes_its_own_duration_and_tags_pair_in_order() -> None:
    ops = [
        p2p("s1", "send", 1, tag="x"),
        p2p("s2", "send", 1, tag="x"),
        compute("wait"),
        p2p("r1", "recv", 0, "wait", tag="x"),
        p2p("r2", "recv", 0, tag="x"),
    ]
    times = {"s1": 1.0, "s2": 1.0, "wait": 0.5, "r1": 1.0, "r2": 1.0}
    tl = simulate(program(ops, "pp=2"), table(times, {1: {"wait": 5.0}}))
    assert span(tl, 0, "s1") == (0.0, 1.0) and span(tl, 0, "s2") == (1.0, 2.0)
    assert span(tl, 1, "r1") == (5.0, 6.0) and span(tl, 1, "r2") == (6.0, 7.0)
    assert "r1" not in {e.name for e in tl.events_of(0)}


def test_a_symmetric_ring_of_sends_is_simulated_once_and_matches_the_full_run() -> None:
    n = 4
    ops = [
        compute("a"),
        p2p("send", "send", {r: (r + 1) % n for r in range(n)}, "a", tag="ring"),
        p2p("recv", "recv", {r: (r - 1) % n for r in range(n)}, tag="ring"),
        compute("b", "recv"),
    ]
    prog = program(ops, f"pp={n}")
    times = table({"a": 1.0, "send": 2.0, "recv": 0.5, "b": 1.0})
    once = simulate(prog, times)
    every = simulate(prog, times, role_of=lambda r: r)
    assert once.rank_of_role == dict.fromkeys(range(n), 0)
    assert list(once.events) == [0]
    assert span(once, 2, "recv") == (3.0, 3.5) and once.step_time == 4.5
    assert every.rank_of_role == once.rank_of_role
    assert every.events == once.events


def test_a_recv_without_a_send_is_reported() -> None:
    ops = [p2p("r", "recv", {1: 0}, tag="lost")]
    with pytest.raises(SimulationError, match="no matching send from rank 0"):
        simulate(program(ops, "pp=2"), table({"r": 1.0}))


def test_bad_inputs_are_reported() -> None:
    with pytest.raises(SimulationError, match="unknown ops"):
        simulate(program([compute("a", "ghost")]), table({"a": 1.0}))
    with pytest.raises(SimulationError, match="must be finite"):
        simulate(program([compute("a")]), table({"a": -1.0}))
    with pytest.raises(SimulationError, match="not ranks of mesh"):
        simulate(program([compute("a")]), table({"a": 1.0}), ranks=[7])
    with pytest.raises(SimulationError, match="needs attrs"):
        simulate(program([p2p("s", "send", "x", tag="")], "pp=2"), table({"s": 1.0}))  # type: ignore[arg-type]


def test_identical_ranks_are_simulated_once() -> None:
    prog = program([compute("a"), all_reduce("ar", "a"), compute("b", "ar")], mesh="dp=2,tp=2")
    calls: list[int] = []

    def durations(op: DistOp, rank: int) -> float:
        calls.append(rank)
        return 1.0

    tl = simulate(prog, durations)
    assert tl.rank_of_role == dict.fromkeys(range(4), 0) and list(tl.events) == [0]
    assert len(calls) == 3 * 4  # roles come from every rank's durations
    calls.clear()
    assert simulate(prog, durations, role_of=same_role).events == tl.events
    assert calls == [0, 0, 0]
    assert tl.ranks_of(0) == [0, 1, 2, 3] and tl.step_time == 3.0


def test_one_slow_rank_is_simulated_with_its_group_only() -> None:
    # only tp collectives: ranks {0, 1} and {2, 3} never meet
    prog = program([compute("a"), all_reduce("ar", "a", axis="tp")], mesh="dp=2,tp=2")
    calls: list[int] = []

    def durations(op: DistOp, rank: int) -> float:
        calls.append(rank)
        return 2.0 if (rank, op.name) == (3, "a") else 1.0

    tl = simulate(prog, durations, role_of=lambda r: r == 3)
    assert tl.rank_of_role == {0: 0, 1: 0, 2: 2, 3: 3}
    assert sorted(set(calls)) == [0, 2, 3]
    assert span(tl, 0, "ar") == (1.0, 2.0)
    assert span(tl, 2, "ar") == (2.0, 3.0) and span(tl, 3, "ar") == (2.0, 3.0)
    assert tl.step_time == 3.0
    only = simulate(prog, durations, role_of=lambda r: r == 3, ranks=[2])
    assert only.rank_of_role == {2: 2} and only.step_time == 3.0
    with pytest.raises(SimulationError, match="not in this timeline"):
        only.events_of(3)


@st.composite
def random_programs(draw: st.DrawFn) -> tuple[DistProgram, dict[tuple[int, int], float]]:
    """Random ops on the compute, comm:dp and comm:tp streams with backward deps, and a
    random duration per (op, rank) on a dp=2,tp=2 mesh."""
    n = draw(st.integers(1, 12))
    ops: list[DistOp] = []
    for i in range(n):
        deps = draw(st.sets(st.integers(0, i - 1), max_size=3)) if i else set()
        dep_names = tuple(f"op{d}" for d in sorted(deps))
        lane = draw(st.sampled_from(["compute", "dp", "tp", "slice"]))
        if lane == "compute":
            ops.append(compute(f"op{i}", *dep_names))
        elif lane == "slice":
            ops.append(local_slice(f"op{i}", *dep_names, axis="tp"))
        else:
            ops.append(all_reduce(f"op{i}", *dep_names, axis=lane))
    times = st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 3.0])
    durations = {(i, r): draw(times) for i in range(n) for r in range(4)}
    return program(ops, "dp=2,tp=2"), durations


def closed_form(prog: DistProgram, times: Mapping[tuple[int, int], float]) -> dict[int, list]:
    """Without slowdown, deps and stream predecessors come earlier in program order, so one
    pass in program order gives every start: max(stream free, deps end) over the group."""
    index = {op.name: i for i, op in enumerate(prog.ops)}
    end: dict[tuple[int, int], float] = {}
    start: dict[tuple[int, int], float] = {}
    free: dict[tuple[int, str], float] = {}
    for i, op in enumerate(prog.ops):
        for r in range(4):
            if (r, i) in start:
                continue
            group = prog.mesh.group_of(r, op.comm.axis) if op.is_collective and op.comm else (r,)
            ready = [
                max([free.get((m, op.stream), 0.0), *(end[(m, index[d])] for d in op.deps)])
                for m in group
            ]
            t = max(ready)
            for m in group:
                start[(m, i)] = t
                end[(m, i)] = t + max(times[(i, g)] for g in group)
                free[(m, op.stream)] = end[(m, i)]
    return {
        r: sorted((start[(r, i)], end[(r, i)], i) for i in range(len(prog.ops))) for r in range(4)
    }


@settings(max_examples=200, deadline=None)
@given(random_programs())
def test_the_simulation_matches_a_closed_form_schedule(
    case: tuple[DistProgram, dict[tuple[int, int], float]],
) -> None:
    prog, times = case
    index = {op.name: i for i, op in enumerate(prog.ops)}
    tl = simulate(prog, lambda op, r: times[(index[op.name], r)])
    want = closed_form(prog, times)
    for r in range(4):
        got = sorted((e.start, e.end, index[e.name]) for e in tl.events_of(r))
        assert got == want[r]  # halves add up exactly in binary floating point
    assert tl.step_time == max(e for r in range(4) for _, e, _ in want[r])


@settings(max_examples=100, deadline=None)
@given(random_programs(), st.sampled_from([0.25, 0.5, 1.0]))
def test_slowed_compute_does_exactly_its_work(
    case: tuple[DistProgram, dict[tuple[int, int], float]], slowdown: float
) -> None:
    prog, times = case
    index = {op.name: i for i, op in enumerate(prog.ops)}
    tl = simulate(prog, lambda op, r: times[(index[op.name], r)], overlap_slowdown=slowdown)
    for r in range(4):
        events = tl.events_of(r)
        by_name = {e.name: e for e in events}
        comm = [(e.start, e.end) for e in events if e.is_comm]
        for e in events:
            op = prog.ops[index[e.name]]
            assert all(by_name[d].end <= e.start + 1e-9 for d in op.deps)
            if e.is_comm:
                continue
            overlapped = sum(max(0.0, min(e.end, b) - max(e.start, a)) for a, b in _merged(comm))
            work = (e.duration - overlapped) + overlapped / (1 + slowdown)
            assert work == pytest.approx(times[(index[e.name], r)], abs=1e-9)


def _merged(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def test_scopes_json_and_throughput_helpers() -> None:
    prog = program(
        [
            compute("q", scope="layers.0.attn.q_proj"),
            compute("up", scope="layers.0.mlp"),
            compute("head", scope="lm_head"),
            all_reduce("ar"),
        ]
    )
    tl = simulate(prog, table({"q": 1.0, "up": 2.0, "head": 4.0, "ar": 0.5}))
    assert tl.busy_by_scope(1) == {
        "": 7.0,
        "layers": 3.0,
        "layers.0": 3.0,
        "layers.0.attn": 1.0,
        "layers.0.attn.q_proj": 1.0,
        "layers.0.mlp": 2.0,
        "lm_head": 4.0,
    }
    data = json.loads(json.dumps(tl.to_json()))
    assert data["step_time"] == 7.0 and data["rank_of_role"] == {"0": 0, "1": 0}
    assert data["ranks"]["0"]["stands_for"] == [0, 1]
    assert data["ranks"]["0"]["exposed_comm"] == 0.0
    assert [e["name"] for e in data["ranks"]["0"]["events"]] == ["q", "ar", "up", "head"]
    assert mfu(4e15, 2.0, 8, 1e15) == 0.25
    assert tokens_per_second(1_000_000, 4.0) == 250_000.0
    with pytest.raises(SimulationError):
        mfu(1.0, 0.0, 8, 1e15)


def lowered(mesh: str, **overrides: int) -> DistProgram:
    """The program of a small llama3-8b under dp + Megatron TP (float32: one dtype is enough
    for timing, and it keeps these tests off the mixed-precision optimizer path)."""
    strategy = Strategy.build(mesh, ["dp", "megatron_tp"])
    model = build_model("llama3-8b", {"dtype": "float32", **overrides})
    return build_plan(model, strategy).program


def lowered_durations(op: DistOp, rank: int) -> float:
    if op.comm is not None:
        return 5e-6 + op.comm.bytes_per_rank / 100e9
    return 1e-6 * (1 + len(op.inputs))


def test_a_lowered_dp_tp_program_runs_as_one_role() -> None:
    prog = lowered("dp=2,tp=2", layers=2)
    tl = simulate(prog, lowered_durations)
    assert tl.rank_of_role == dict.fromkeys(range(4), 0)
    compute_ops = [op for op in prog.ops if op.comm is None]
    assert len(tl.events_of(3)) == len(prog.ops)
    assert tl.compute_time(0) == pytest.approx(sum(lowered_durations(op, 0) for op in compute_ops))
    assert tl.step_time >= tl.compute_time(0)
    assert tl.step_time >= tl.comm_time(0) > 0
    assert 0.0 <= tl.overlap_fraction(0) <= 1.0
    # comm streams may overlap each other, so per-op exposure can count a moment twice
    exposed_per_op = sum(e.exposed for e in tl.events_of(0) if e.is_comm)
    assert 0 < tl.exposed_comm(0) <= min(exposed_per_op, tl.comm_time(0)) + 1e-12
    # every op starts after its deps end, and ops on one stream never overlap
    events = {e.name: e for e in tl.events_of(0)}
    for op in prog.ops:
        assert all(events[d].end <= events[op.name].start for d in op.deps)
    by_stream: dict[str, list[tuple[float, float]]] = {}
    for e in tl.events_of(0):
        by_stream.setdefault(e.stream, []).append((e.start, e.end))
    for spans in by_stream.values():
        spans.sort()
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
    assert set(by_stream) == {"compute", "comm:dp", "comm:tp"}
    assert simulate(prog, lowered_durations, role_of=lambda r: r).events == tl.events
    full = simulate(prog, lowered_durations, role_of=lambda r: r, overlap_slowdown=0.2)
    assert full.rank_of_role == dict.fromkeys(range(4), 0)
    assert full.step_time >= tl.step_time


def test_512_symmetric_ranks_cost_one_rank() -> None:
    prog = lowered("dp=64,tp=8", layers=1, batch=64)
    assert prog.mesh.size == 512
    calls: list[int] = []

    def durations(op: DistOp, rank: int) -> float:
        calls.append(rank)
        return lowered_durations(op, rank)

    started = time.perf_counter()
    tl = simulate(prog, durations, role_of=same_role)
    elapsed = time.perf_counter() - started
    assert len(calls) == len(prog.ops) and set(calls) == {0}
    assert elapsed < 1.0
    assert list(tl.events) == [0] and len(tl.rank_of_role) == 512
    assert tl.step_time > 0 and tl.end_time(511) == tl.step_time
    started = time.perf_counter()
    fingerprinted = simulate(prog, lowered_durations)
    assert time.perf_counter() - started < 5.0
    assert fingerprinted.events == tl.events


def test_one_straggler_among_512_ranks_slows_the_ranks_it_meets() -> None:
    prog = lowered("dp=64,tp=8", layers=1, batch=64)

    def slow(op: DistOp, rank: int) -> float:
        return lowered_durations(op, rank) * (3 if rank == 5 and op.comm is None else 1)

    started = time.perf_counter()
    tl = simulate(prog, slow, role_of=lambda r: r == 5)
    assert time.perf_counter() - started < 10.0
    even = simulate(prog, lowered_durations, role_of=same_role)
    assert tl.step_time > even.step_time and tl.end_time(5) == tl.step_time
    tp_peers = [r for r in range(8) if r != 5]
    dp_peers = [r for r in range(5, 512, 8) if r != 5]
    groups = sorted(tl.ranks_of(rep) for rep in tl.events)
    others = sorted(set(range(512)) - {5, *tp_peers, *dp_peers})
    assert groups == sorted([[5], tp_peers, dp_peers, others])
