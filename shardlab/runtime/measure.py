"""Measure a plan's step on real ranks and hold it against the cost model's prediction.

What it is for: `shardlab measure` runs a costed plan's program on the torch backend
(`runtime.torchdist.time_torchdist`: one process per rank, gloo collectives, numpy compute),
times every op on every rank, writes the measured step as a Chrome trace (`measured_trace`,
one process per rank, one thread per stream, as `cost.trace` writes the predicted one) and
compares the prediction with it (`compare`): the step, compute, communication, each op kind
and each layer, with error % = (predicted - measured) / measured * 100.

Compute and communication are sums of op durations (per op: the cost model's seconds
against the median measured one); an async collective's measured span runs from its issue
to its wait's completion, so it includes any time it waited behind compute.

A pipelined plan (a mesh with a `pp` axis) goes to `runtime.measure_pipeline` from the same
three functions: `measure` runs its stage programs (a `Measurement` with `pipeline` set),
`compare` holds the measured step against the plan's pipelined cost and `measured_trace`
names each rank's stage.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shardlab.errors import ExecutionError
from shardlab.plan import Plan
from shardlab.program import DistOp, DistProgram
from shardlab.repeats import layer_of
from shardlab.runtime import hazards as hz
from shardlab.runtime.mixed_precision import MIXED_DTYPE, REFERENCE_DTYPE, precision_of
from shardlab.runtime.reference import make_feeds
from shardlab.runtime.torch_device import RankDevice
from shardlab.runtime.torchdist import RankTiming, time_torchdist

if TYPE_CHECKING:
    from shardlab.passes.pipeline import PipelineProgram

COMPUTE = "compute"
#: nanoseconds -> seconds, and -> trace microseconds
NS = 1e-9
NS_US = 1e-3


@dataclass(frozen=True, slots=True)
class Measurement:
    """Every rank's timed step: per op (start, end) and median duration, and step times.

    A pipelined plan's: `program` is the plan's (one micro-batch's) and `pipeline` holds the
    stage programs the ranks ran (rank r ran `program_of(r)`)."""

    program: DistProgram
    ranks: dict[int, RankTiming]
    steps: int
    warmup: int
    pipeline: PipelineProgram | None = None

    def program_of(self, rank: int) -> DistProgram:
        """The program `rank` ran: the plan's, or its pipeline stage's."""
        if self.pipeline is None:
            return self.program
        return next(p for p in self.pipeline.stages if rank in p.mesh.ranks)

    def step_time(self, rank: int) -> float:
        """Median wall seconds of one step on `rank`."""
        return self.ranks[rank].step_median_ns * NS

    @property
    def step_max(self) -> float:
        """The slowest rank's median step, in seconds (what the step costs)."""
        return max(self.step_time(r) for r in self.ranks)

    @property
    def step_median(self) -> float:
        """The median over ranks of their median steps, in seconds."""
        return float(statistics.median(self.step_time(r) for r in self.ranks))

    def op_seconds(self, rank: int) -> dict[str, float]:
        """Median seconds of every op on `rank`."""
        return {name: ns * NS for name, ns in self.ranks[rank].durations.items()}

    def op_seconds_over_ranks(self, pick: Callable[[list[int]], float]) -> dict[str, float]:
        """Per op, `pick` (e.g. `max`, `statistics.median`) of its median durations in ns on
        the ranks that ran it, in seconds."""
        seen: dict[str, list[int]] = {}
        for timing in self.ranks.values():
            for name, ns in timing.durations.items():
                seen.setdefault(name, []).append(ns)
        return {name: pick(v) * NS for name, v in seen.items()}

    def slowest_op_seconds(self) -> dict[str, float]:
        """Per op, its longest median time over the ranks: what the step waits for. Ranks
        that share cores differ by whole time slices, and the rank whose step is the longest
        is often the one that got the cores first and then waited longest for its peers:
        its ops are the fastest, its waits the longest."""
        return self.op_seconds_over_ranks(max)

    def typical_op_seconds(self) -> dict[str, float]:
        """Per op, the median over the ranks of its median time: a collective's span on the
        first rank to reach it holds that rank's wait for the last, on the last rank none."""
        return self.op_seconds_over_ranks(statistics.median)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "steps": self.steps,
            "warmup": self.warmup,
            "step_max_s": self.step_max,
            "step_median_s": self.step_median,
            "step_s": {str(r): self.step_time(r) for r in sorted(self.ranks)},
        }
        if self.pipeline is not None:
            p = self.pipeline
            out["pipeline"] = {"schedule": p.schedule, "microbatches": p.microbatches,
                               "virtual_stages": p.virtual_stages,
                               "stage_ranks": [list(s.mesh.ranks) for s in p.stages]}  # fmt: skip
        return out


@dataclass(frozen=True, slots=True)
class Row:
    """One line of the comparison: what, its group (step, total, kind, layer), seconds."""

    name: str
    group: str
    predicted_s: float
    measured_s: float

    @property
    def error_pct(self) -> float:
        """(predicted - measured) / measured * 100; inf when nothing was measured."""
        if self.measured_s <= 0:
            return math.inf
        return (self.predicted_s - self.measured_s) / self.measured_s * 100.0

    def to_json(self) -> dict[str, Any]:
        err = self.error_pct
        return {
            "name": self.name,
            "group": self.group,
            "predicted_s": self.predicted_s,
            "measured_s": self.measured_s,
            "error_pct": err if math.isfinite(err) else None,
        }


def measure(
    plan: Plan,
    steps: int = 5,
    warmup: int = 1,
    seed: int = 0,
    dtype: str | None = None,
    device: str = "cpu",
) -> Measurement:
    """Time `plan`'s program on torch ranks (`steps` kept after `warmup` dropped) on
    `device` ("cpu": gloo, "cuda": NCCL); a pipelined plan's stage programs
    (`measure_pipeline.measure_pipelined`). `dtype` "bfloat16" runs the graph's own mixed
    precision (`rank_device`)."""
    if plan.pipeline is not None:
        from shardlab.runtime.measure_pipeline import measure_pipelined  # it imports this

        return measure_pipelined(
            plan, steps=steps, warmup=warmup, seed=seed, dtype=dtype, device=device
        )
    sources = make_feeds(plan.training, seed, feed_dtype(dtype))
    ranks = time_torchdist(plan.program, sources, seed, steps=steps, warmup=warmup,
                           device=rank_device(device, dtype))  # fmt: skip
    return Measurement(plan.program, ranks, steps, warmup)


def feed_dtype(dtype: str | None) -> str:
    """The numpy dtype a measurement's sources are drawn in (float32 for "bfloat16", whose
    ranks cast each value to its declared dtype)."""
    return REFERENCE_DTYPE if dtype == MIXED_DTYPE else dtype or "float64"


def rank_device(device: str, dtype: str | None) -> RankDevice:
    """Where and in which precision a measurement's ranks run."""
    return RankDevice(device, precision_of(dtype))


def stream_tids(program: DistProgram) -> dict[str, int]:
    """`compute` is thread 0, then every comm stream in name order (as `cost.trace`)."""
    comm = sorted({op.stream for op in program.ops} - {COMPUTE})
    return {COMPUTE: 0, **{s: i + 1 for i, s in enumerate(comm)}}


def measured_trace(m: Measurement) -> dict[str, Any]:
    """The measured step (each rank's median step) as a Chrome trace, times in microseconds
    since each rank's barrier exit (a pipeline's: `measure_pipeline.pipelined_trace`)."""
    if m.pipeline is not None:
        from shardlab.runtime.measure_pipeline import pipelined_trace

        return pipelined_trace(m)
    tids = stream_tids(m.program)
    ops = {op.name: op for op in m.program.ops}
    events: list[dict[str, Any]] = []
    for rank in sorted(m.ranks):
        events.append(_meta("process_name", rank, 0, f"rank {rank}"))
        events += [_meta("thread_name", rank, tid, s) for s, tid in tids.items()]
        for name, (start, end) in m.ranks[rank].spans.items():
            events.append(_span(ops[name], rank, tids[ops[name].stream], start, end))
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"generator": "shardlab measure", "mesh": str(m.program.mesh),
                      **m.to_json(), "streams": tids},
    }  # fmt: skip


def _meta(kind: str, pid: int, tid: int, name: str) -> dict[str, Any]:
    return {"name": kind, "ph": "M", "ts": 0, "pid": pid, "tid": tid, "args": {"name": name}}


def _span(op: DistOp, rank: int, tid: int, start: int, end: int) -> dict[str, Any]:
    return {
        "name": op.name,
        "cat": str(op.role),
        "ph": "X",
        "ts": start * NS_US,
        "dur": max(end - start, 1) * NS_US,
        "pid": rank,
        "tid": tid,
        "args": {"kind": op.kind, "scope": op.scope},
    }


def is_comm(op: DistOp) -> bool:
    """A communication op (a comm step); the rest that is not a wait/hold/free is compute."""
    return op.comm is not None or op.kind in hz.P2P_KINDS


def layer_name(op: DistOp) -> str:
    """`family.index` of the op's layer (from its scope, else its name); `other` outside."""
    found = layer_of(op.scope) or layer_of(op.name)
    return f"{found[0]}.{found[1]}" if found else "other"


def compare(plan: Plan, m: Measurement, rank: int | None = None) -> list[Row]:
    """Predicted against measured on `rank` (default: the slowest rank): step, compute,
    communication, per op kind and per layer (a pipelined plan's:
    `measure_pipeline.compare_pipelined`; `rank` is ignored there)."""
    if plan.pipeline is not None:
        from shardlab.runtime.measure_pipeline import compare_pipelined

        return compare_pipelined(plan, m)
    if plan.cost is None:
        raise ExecutionError("compare needs a costed plan (build it with a cluster)")
    me = max(m.ranks, key=m.step_time) if rank is None else rank
    pred = plan.cost.op_times
    meas = m.op_seconds(me)
    ops = [op for op in plan.program.ops if op.kind not in hz.SYNC_KINDS]
    rows = [Row("step", "step", plan.cost.step_time, m.step_time(me))]
    rows += _grouped(ops, pred, meas, "total", lambda op: "communication" if is_comm(op)
                     else "compute")  # fmt: skip
    rows += _grouped(ops, pred, meas, "kind", lambda op: op.kind)
    rows += _grouped(ops, pred, meas, "layer", layer_name)
    return rows


def _grouped(
    ops: list[DistOp],
    pred: Mapping[str, float],
    meas: Mapping[str, float],
    group: str,
    key: Callable[[DistOp], str],
) -> list[Row]:
    """One row per key: summed predicted and measured seconds of its ops."""
    sums: dict[str, list[float]] = {}
    for op in ops:
        acc = sums.setdefault(key(op), [0.0, 0.0])
        acc[0] += pred.get(op.name, 0.0)
        acc[1] += meas.get(op.name, 0.0)
    order = sorted(sums) if group != "total" else [k for k in ("compute", "communication")
                                                    if k in sums]  # fmt: skip
    return [Row(k, group, sums[k][0], sums[k][1]) for k in order]
