"""The cost of one pipelined training step: stages simulated together on one timeline.

Model (one representative rank per stage: the first rank of its sub-mesh, a global device
rank; every rank of a stage is assumed to take the same time, as `cost.model` assumes for
ranks of one role):

- each stage runs its program's ops in order on its streams (`compute`, `comm:<axis>` for
  collectives, `comm:pp` for send/recv) with the timeline engine of `cost.timeline`: an op
  starts when its stream is free and its deps on the same stage are done;
- compute ops take `compute.program_op_times` (or `compute_time` when given); collectives
  `comm.step_time` on the stage sub-mesh group of the representative, in global ranks, so
  intra- or inter-node links are picked as on the full mesh;
- a send takes `collective_time("send", bytes, (src, dst))` between the representative and
  the rank at the same sub-mesh coordinates of the peer stage (bytes: one rank's block) and
  is eager (buffered); a recv takes no time of its own and ends when its matching send (same
  tag) has ended, or when it starts if that is later;
- `wait`, `hold` and `free` take no time; a `wait` on the compute stream holds that stream
  until the send it depends on has finished (the baseline of `passes.send_wait`);
- compute slows down by the cluster's `overlap_slowdown` while comm runs on the rank.

Step time is the latest end over all stages; a stage's busy time is its compute stream's busy
seconds; the bubble fraction is the idle fraction of the busiest stage, 1 - busy / step.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from shardlab.cost.clusters import Cluster, check_mesh_fits
from shardlab.cost.comm import collective_time, step_time
from shardlab.cost.compute import (
    CalibrationTable,
    hardware_flops,
    model_flops,
    program_op_times,
)
from shardlab.cost.model import StepFigures, tokens_per_step
from shardlab.cost.timeline import (
    Row,
    Timeline,
    _Engine,
    _events,
)
from shardlab.ir import DTYPE_BYTES, Graph
from shardlab.passes.pipeline import PipelineProgram
from shardlab.placement import local_shape
from shardlab.program import DistOp, DistProgram

#: Kinds that take no compute time and have no roofline entry.
_UNTIMED = frozenset({"send", "recv", "wait", "hold", "free"})
#: compute_time(stage, op) -> seconds: overrides the roofline (tests, measured tables)
ComputeTime = Callable[[int, DistOp], float]


@dataclass
class PipelineCost(StepFigures):
    """What one pipelined training step costs on a cluster."""

    cluster: Cluster
    timeline: Timeline  # events of each stage's representative rank
    stage_ranks: list[int]  # the representative global rank of each stage
    busy: list[float]  # compute-busy seconds per stage
    model_flops: int  # model FLOPs of one micro-batch x micro-batches
    tokens: int  # tokens per step (all micro-batches)
    dtype: str
    devices: int
    hardware_flops: int = 0  # executed FLOPs of one micro-batch x micro-batches

    @property
    def step_time(self) -> float:
        return self.timeline.step_time

    @property
    def bubble_fraction(self) -> float:
        """Idle share of the step on the busiest stage."""
        return 1.0 - max(self.busy) / self.step_time if self.step_time > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        """Headline figures, JSON-ready."""
        return {
            "cluster": self.cluster.name,
            "step_time_s": self.step_time,
            "tokens_per_s": self.tokens_per_second,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "bubble_fraction": self.bubble_fraction,
            "stage_busy_s": list(self.busy),
            "stage_ranks": list(self.stage_ranks),
            "model_flops": self.model_flops,
        }


def sent_bytes(program: DistProgram, value: str) -> float:
    """Bytes of one rank's block of `value`."""
    t, spec = program.types[value], program.specs[value]
    shape = local_shape(t.shape, spec.mesh, spec.placements)
    return float(math.prod(shape) * DTYPE_BYTES[t.dtype])


def _float_dtype(graph: Graph) -> str:
    dtypes = Counter(graph.type_of(v).dtype for op in graph.ops for v in op.outputs)
    floats = [d for d, _ in dtypes.most_common() if d.startswith(("float", "bfloat"))]
    return floats[0] if floats else "float32"


def cost_pipeline(
    pipeline: PipelineProgram,
    training_per_microbatch: Graph,
    cluster: Cluster,
    *,
    table: CalibrationTable | None = None,
    compute_time: ComputeTime | None = None,
) -> PipelineCost:
    """Simulate one step of `pipeline` on `cluster` (module doc for the model)."""
    check_mesh_fits(pipeline.mesh, cluster)
    reps = [program.mesh.ranks[0] for program in pipeline.stages]
    ops: list[DistOp] = []
    rows: dict[int, list[float | None]] = {r: [] for r in reps}
    for s in range(pipeline.pp):
        for op, seconds in _stage_ops(pipeline, s, cluster, table, compute_time):
            ops.append(op)
            for r in reps:
                rows[r].append(seconds if r == reps[s] else None)
    frozen: dict[int, Row] = {r: tuple(row) for r, row in rows.items()}

    def group_of(op: DistOp, rank: int) -> tuple[int, ...]:
        return (rank,)  # a stage's collectives: its representative stands for its group

    schedules = _Engine(ops, frozen, group_of, cluster.overlap_slowdown, False).run()
    events = {r: _events(ops, schedules[r]) for r in reps}
    step = max((e.end for evs in events.values() for e in evs), default=0.0)
    rank_of_role = {r: reps[s] for s, p in enumerate(pipeline.stages) for r in p.mesh.ranks}
    timeline = Timeline(step, events, dict(sorted(rank_of_role.items())), cluster.overlap_slowdown)
    return PipelineCost(
        cluster=cluster,
        timeline=timeline,
        stage_ranks=reps,
        busy=[timeline.compute_time(r) for r in reps],
        model_flops=model_flops(training_per_microbatch) * pipeline.microbatches,
        hardware_flops=hardware_flops(training_per_microbatch) * pipeline.microbatches,
        tokens=tokens_per_step(training_per_microbatch) * pipeline.microbatches,
        dtype=_float_dtype(training_per_microbatch),
        devices=pipeline.mesh.size,
    )


def _stage_ops(
    pipeline: PipelineProgram,
    s: int,
    cluster: Cluster,
    table: CalibrationTable | None,
    compute_time: ComputeTime | None,
) -> list[tuple[DistOp, float]]:
    """Stage s's ops renamed `s<s>/<name>` (send/recv with the engine's `peer`), and seconds."""
    program = pipeline.stages[s]
    rep = program.mesh.ranks[0]
    roofline: dict[str, float] = {}
    if compute_time is None:
        timed = replace(program, ops=[op for op in program.ops if op.kind not in _UNTIMED])
        roofline = program_op_times(timed, cluster, table)
    out = []
    for op in program.ops:
        attrs = op.attrs
        if op.kind in ("send", "recv"):
            peer = int(op.attrs["peer_stage"])
            dst = pipeline.stages[peer].mesh.ranks[0]
            attrs = {**op.attrs, "peer": dst}
            if op.kind == "send":
                size = sent_bytes(program, op.inputs[0])
                seconds = collective_time("send", size, (rep, dst), cluster)
                attrs["bytes"] = size
            else:
                seconds = 0.0
        elif op.kind in _UNTIMED:
            seconds = 0.0
        elif op.comm is not None:
            seconds = step_time(op.comm, program.mesh.group_of(rep, op.comm.axis), cluster)
        elif compute_time is not None:
            seconds = compute_time(s, op)
        else:
            seconds = roofline[op.name]
        renamed = replace(
            op,
            name=f"s{s}/{op.name}",
            deps=tuple(f"s{s}/{d}" for d in op.deps),
            attrs=attrs,
        )
        out.append((renamed, seconds))
    return out
