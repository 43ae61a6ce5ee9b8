"""Measure a pipelined plan's step on real ranks and hold it against its pipelined cost.

What it is for: `runtime.measure` times flat programs; a plan whose mesh has a `pp` axis
runs as stage programs linked by send/recv. `measure`, `compare` and `measured_trace` of
`runtime.measure` come here for such a plan, so a caller handles both alike.

- `executable_pipeline`: the stage programs the plan's cost describes (the plan's program of
  one micro-batch split with the plan's stage assignment, schedule and micro-batches);
- `measure_pipelined`: every rank runs its stage's program for `steps` steps after `warmup`
  dropped ones (`torch_pipeline.time_pipeline_torch`: a barrier before each step; a step
  ends once the rank's sends completed; a recv's span includes waiting for its peer). The
  sources are the full batch's seeded feeds (`reference.make_feeds` of the full model's
  training graph), cut into micro-batches as `pipeline_exec.stage_feeds` cuts them;
- `compare_pipelined`, error % = (predicted - measured) / measured * 100:
  - `step`: the plan's pipelined step (`cost.pipeline_slots`, what `shardlab plan --cluster`
    reports) against the slowest rank's median step; `step, op-level model` is the step of
    `cost.pipeline_cost` on the stage programs that ran (every op and transfer simulated);
  - per stage, on its first rank (the cost model's representative): `units` (every op of a
    micro-batch's forward and backward: the prediction's busy seconds), `tail` (the ops of
    no micro-batch: optimizer, gradient reductions, the tables computed up front) and
    `bubble`, the rest of the step (predicted: step - units - tail; measured: the slowest
    rank's step - units - tail: recv waits, send issues, loop overhead and the time the
    rank is done before the slowest);
  - compute, communication (collectives), per op kind and per layer, summed over every
    stage's first rank: each op priced as `cost.pipeline_cost` prices it against its median
    duration; send and recv are left to the bubble (a send's span is its issue only);
- `pipelined_trace`: the median step of every rank as a Chrome trace, one process per rank
  named with its stage, one thread per stream (`compute`, then the comm streams by name).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shardlab.autodiff import training_graph_of
from shardlab.cost.pipeline_cost import cost_pipeline
from shardlab.errors import ExecutionError
from shardlab.ops.base import Array
from shardlab.passes.pipeline import PipelineProgram, microbatch_of, pipeline_program
from shardlab.plan import Plan
from shardlab.plan_pipeline import PipelineReport
from shardlab.program import DistOp
from shardlab.runtime import hazards as hz
from shardlab.runtime.measure import (
    COMPUTE,
    Measurement,
    Row,
    _grouped,
    _meta,
    _span,
    feed_dtype,
    is_comm,
    layer_name,
    rank_device,
)
from shardlab.runtime.reference import make_feeds
from shardlab.runtime.torch_pipeline import time_pipeline_torch
from shardlab.strategy import PIPELINE_AXIS

#: Kinds outside the per-op rows: transfers (their time is the bubble's) and sync ops.
UNPRICED = hz.P2P_KINDS | hz.SYNC_KINDS


def _report(plan: Plan) -> PipelineReport:
    if plan.pipeline is None:
        raise ExecutionError("this plan is not pipelined (its mesh has no 'pp' axis)")
    return plan.pipeline


def executable_pipeline(plan: Plan) -> PipelineProgram:
    """The stage programs of pipelined `plan`: its one-micro-batch program split with its
    stage assignment, schedule and micro-batches (what its pipelined cost prices)."""
    report = _report(plan)
    a, o = report.assignment, report.options
    boundaries = [a.chunks[c][0] for c in range(1, len(a.chunks))]
    pipeline = pipeline_program(
        plan.program,
        plan.training,
        a.pp,
        o.microbatches,
        o.schedule,
        boundaries,
        virtual_stages=a.virtual_stages,
        mesh=plan.strategy.schedule_strategy().mesh,  # gradient accumulation: pp=1
        axis=PIPELINE_AXIS,
    )
    if pipeline.assignment.chunks != a.chunks:  # pragma: no cover - boundaries say it all
        raise ExecutionError(
            f"the stage programs hold chunks {pipeline.assignment.chunks}, the plan {a.chunks}"
        )
    return pipeline


def pipeline_sources(plan: Plan, seed: int, dtype: str) -> dict[str, Array]:
    """Seeded full-batch data for every source of the plan's model (`make_feeds`)."""
    full = training_graph_of(plan.model, plan.optimizer, plan.lr, plan.strategy.recompute)
    return make_feeds(full, seed, dtype)


def measure_pipelined(
    plan: Plan,
    steps: int = 5,
    warmup: int = 1,
    seed: int = 0,
    dtype: str | None = None,
    device: str = "cpu",
) -> Measurement:
    """Time pipelined `plan`'s stage programs on torch ranks (`steps` kept after `warmup`
    dropped) on `device`, in `dtype` (`measure.rank_device`); the `Measurement` holds the
    pipeline that ran."""
    pipeline = executable_pipeline(plan)
    sources = pipeline_sources(plan, seed, feed_dtype(dtype))
    ranks = time_pipeline_torch(pipeline, sources, seed, steps=steps, warmup=warmup,
                                device=rank_device(device, dtype))  # fmt: skip
    return Measurement(plan.program, ranks, steps, warmup, pipeline)


def _pipeline(m: Measurement) -> PipelineProgram:
    if m.pipeline is None:
        raise ExecutionError("this measurement is of a flat program, not a pipeline")
    return m.pipeline


def stage_of(pipeline: PipelineProgram, rank: int) -> int:
    """The pipeline stage that holds global rank `rank`."""
    return next(s for s, p in enumerate(pipeline.stages) if rank in p.mesh.ranks)


def pipeline_tids(pipeline: PipelineProgram) -> dict[str, int]:
    """`compute` is thread 0, then every comm stream of any stage in name order."""
    comm = sorted({op.stream for p in pipeline.stages for op in p.ops} - {COMPUTE})
    return {COMPUTE: 0, **{s: i + 1 for i, s in enumerate(comm)}}


def op_microbatch(op: DistOp) -> int | None:
    """The micro-batch an op of a stage program works on (a transfer's: its value's)."""
    if op.kind == hz.SEND:
        return microbatch_of(op.inputs[0])
    if op.kind == hz.RECV:
        return microbatch_of(op.outputs[0])
    return microbatch_of(op.name)


def pipelined_trace(m: Measurement) -> dict[str, Any]:
    """Every rank's median step as a Chrome trace (microseconds since its barrier exit): a
    process per rank named `rank r (stage s)`, a thread per stream its stage uses."""
    pipeline = _pipeline(m)
    tids = pipeline_tids(pipeline)
    events: list[dict[str, Any]] = []
    for rank in sorted(m.ranks):
        s = stage_of(pipeline, rank)
        program = pipeline.stages[s]
        ops = {op.name: op for op in program.ops}
        streams = {COMPUTE} | {op.stream for op in program.ops}
        events.append(_meta("process_name", rank, 0, f"rank {rank} (stage {s})"))
        events += [_meta("thread_name", rank, t, name) for name, t in tids.items()
                   if name in streams]  # fmt: skip
        for name, (start, end) in m.ranks[rank].spans.items():
            op = ops[name]
            event = _span(op, rank, tids[op.stream], start, end)
            micro = op_microbatch(op)
            event["args"].update({"stage": s, **({"microbatch": micro} if micro is not None
                                                 else {})})  # fmt: skip
            events.append(event)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"generator": "shardlab measure", "mesh": str(pipeline.mesh),
                      **m.to_json(), "streams": tids},
    }  # fmt: skip


def compare_pipelined(plan: Plan, m: Measurement) -> list[Row]:
    """Predicted against measured (module doc): step, per stage units / tail / bubble, then
    compute, communication, per op kind and per layer over the stages' first ranks."""
    cost = _report(plan).cost
    if cost is None:
        raise ExecutionError("compare needs a costed plan (build it with a cluster)")
    pipeline = _pipeline(m)
    detailed = cost_pipeline(pipeline, plan.training, cost.cluster)
    pred = {e.name: e.duration for evs in detailed.timeline.events.values() for e in evs}
    step = m.step_max
    rows = [Row("step", "step", cost.step_time, step),
            Row("step, op-level model", "step", detailed.step_time, step)]  # fmt: skip
    meas: dict[str, float] = {}
    priced: list[DistOp] = []
    original: dict[str, DistOp] = {}
    for s, program in enumerate(pipeline.stages):
        mine = m.op_seconds(program.mesh.ranks[0])
        units = tail = 0.0
        for op in program.ops:
            if op.kind in UNPRICED:
                continue
            seconds = mine.get(op.name, 0.0)
            if microbatch_of(op.name) is None:
                tail += seconds
            else:
                units += seconds
            key = f"s{s}/{op.name}"  # as `cost_pipeline` names a stage's ops
            meas[key], original[key] = seconds, op
            priced.append(replace(op, name=key))
        sc = cost.stages[s]
        rows += [
            Row(f"{s} units", "stage", sc.busy_s, units),
            Row(f"{s} tail", "stage", sc.tail_s, tail),
            Row(f"{s} bubble", "stage", max(cost.step_time - sc.busy_s - sc.tail_s, 0.0),
                max(step - units - tail, 0.0)),
        ]  # fmt: skip
    rows += _grouped(priced, pred, meas, "total", lambda op: "communication" if is_comm(op)
                     else "compute")  # fmt: skip
    rows += _grouped(priced, pred, meas, "kind", lambda op: op.kind)
    rows += _grouped(priced, pred, meas, "layer", lambda op: layer_name(original[op.name]))
    return rows
