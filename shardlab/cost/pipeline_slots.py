"""A pipelined step from unit costs: micro-batches are slots of the schedule, not copies.

`cost_pipeline_slots` takes the lowered program of ONE micro-batch (on the mesh without the
pipeline axis) and the stage assignment, and:

1. splits it as the pipeline does (`passes.pipeline_split.Split`): every op goes to a model
   chunk and a phase (forward unit, backward unit, optimizer tail);
2. costs each stage's units once: the forward and backward unit of each of its chunks and
   its tail (the optimizer and the gradient reductions it waits for), each on the stage's
   own ranks with the timeline engine (`cost.timeline.simulate`), so tensor- and data-
   parallel collectives inside a unit overlap its compute as they do in a flat plan;
3. prices what crosses stages per micro-batch: a tensor replicated on some mesh axes is sent
   in as many pieces and gathered on arrival (Megatron-LM's scatter/gather), so each rank
   sends its share over the inter-stage link;
4. lays the units out in the schedule's order (`cost.pipeline_layout`; `schedule_units`:
   GPipe, 1F1B, interleaved):
   a forward waits for the previous chunk's forward of the same micro-batch and its send, a
   backward for the next chunk's backward; each stage runs one unit at a time. The step ends
   when the last stage finishes its units and its tail. With equal units and free sends the
   idle share is exactly (p - 1) / (v m + p - 1) (tests check it);
5. prices tied weights (`TiedReduce`, Megatron-LM's embedding group): after the last
   backward unit of every stage holding a tied weight, its gradient (one rank's block of
   the partial the stages exchange: float32 `main_grad` for a 16-bit weight) is
   all-reduced over those stages (the ranks at the same coordinates of the other axes, on
   the link between them); each stage's tail starts once its all-reduces have ended;
6. counts memory per stage as the schedule holds it (`cost.pipeline_memory`; a tied
   weight's replica on each of its
   stages): the model states of its layers, the
   activations one micro-batch keeps for the backward per chunk times the micro-batches in
   flight at the worst moment of the schedule (p - s for stage s of 1F1B: the first stage
   holds p, Korthikanti et al. 2022), plus the temporaries of one unit.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from shardlab.cost.clusters import Cluster, check_mesh_fits
from shardlab.cost.comm import collective_time
from shardlab.cost.compute import (
    CalibrationTable,
)
from shardlab.cost.model import StepFigures, training_facts
from shardlab.cost.pipeline_layout import StageSlots, schedule_step
from shardlab.cost.pipeline_memory import StageMemory, stage_memory
from shardlab.cost.pipeline_units import fragment_timeline, unit_time
from shardlab.cost.timeline import Event
from shardlab.ir import DTYPE_BYTES, Graph
from shardlab.mesh import Mesh
from shardlab.passes.pipeline_schedule import (
    bubble_fraction,
    check_schedule,
)
from shardlab.passes.pipeline_split import Split
from shardlab.passes.pipeline_stages import StageAssignment
from shardlab.placement import Replicate, local_shape
from shardlab.program import DistProgram

Phase = Literal["F", "B"]


@dataclass(frozen=True, slots=True)
class TiedReduce:
    """The all-reduce of a tied weight's gradient between the stages holding it."""

    param: str
    stages: tuple[int, ...]
    ranks: tuple[int, ...]  # the representative group: first ranks of the stages
    bytes: float  # one rank's block of the exchanged partial (float32 main_grad in bf16)
    seconds: float
    start_s: float  # once every stage of the group has run its last backward unit
    reason: str
    stream: str = "comm:pp"

    kind = "all_reduce"

    @property
    def name(self) -> str:
        return f"tied_all_reduce:{self.param}"

    @property
    def end_s(self) -> float:
        return self.start_s + self.seconds

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "stream": self.stream,
            "param": self.param,
            "stages": list(self.stages),
            "ranks": list(self.ranks),
            "bytes": self.bytes,
            "seconds": self.seconds,
            "start": self.start_s,
            "end": self.end_s,
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True)
class StageCost:
    """One pipeline stage: its ranks and layers, its unit times, when it ends, its memory."""

    stage: int
    ranks: tuple[int, ...]
    layers: tuple[int, ...]
    chunks: tuple[int, ...]  # global model chunks, in local order
    forward_s: tuple[float, ...]  # per local chunk, one micro-batch
    backward_s: tuple[float, ...]
    tail_s: float  # optimizer step and the gradient reductions before it
    busy_s: float  # the units' time over the step
    end_s: float  # when its last unit ends (its tied all-reduces, then the tail, follow)
    memory: StageMemory
    tied_end_s: float = 0.0  # when its tied weights' all-reduces end (0: it holds none)
    #: the least its tail's gradient reductions can take: a reduce-scatter of the bytes its
    #: float32 gradient all-reduces and reduce-scatters reduce, fused (every
    #: data-parallel recipe reduces these gradients so, or as all-reduces that take longer;
    #: `search.bound`'s sibling bound)
    reduce_floor_s: float = 0.0

    @property
    def tail_start_s(self) -> float:
        return max(self.end_s, self.tied_end_s)

    def to_json(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "ranks": list(self.ranks),
            "layers": list(self.layers),
            "chunks": list(self.chunks),
            "forward_s": list(self.forward_s),
            "backward_s": list(self.backward_s),
            "tail_s": self.tail_s,
            "busy_s": self.busy_s,
            "end_s": self.end_s,
            "tied_end_s": self.tied_end_s,
            "reduce_floor_s": self.reduce_floor_s,
            "memory": self.memory.to_json(),
        }


@dataclass
class PipelineSlotCost(StepFigures):
    """One pipelined training step: per-stage costs and the schedule's step time."""

    cluster: Cluster
    schedule: str
    microbatches: int
    virtual_stages: int
    stages: list[StageCost]
    step: float  # seconds: the last stage's units and tail
    model_flops: int
    hardware_flops: int
    tokens: int
    dtype: str
    devices: int
    #: seconds each micro-batch's sends take per chunk boundary (forward, then backward)
    p2p_s: dict[str, float] = field(default_factory=dict)
    #: one unit's seconds and simulated events (a representative rank), by (chunk, phase)
    unit_s: dict[tuple[int, str], float] = field(default_factory=dict)
    unit_events: dict[tuple[int, str], tuple[Event, ...]] = field(default_factory=dict)
    #: seconds of one hop, by (from chunk, to chunk, phase)
    hops: dict[tuple[int, int, str], float] = field(default_factory=dict)
    #: the all-reduces of tied weights' gradients between their stages
    tied: list[TiedReduce] = field(default_factory=list)

    def slots(self) -> list[StageSlots]:
        """Every unit of the step as a slot on its stage: phase, model chunk, micro-batch,
        start and end (the timeline of a pipelined plan; laid out again on demand)."""
        pp, times = self.pp, self.unit_s
        starts: list[list[float]] = [[] for _ in range(pp)]
        orders, _, _ = schedule_step(self.schedule, pp, self.microbatches,
                                     self.virtual_stages, times, self.hops, starts)  # fmt: skip
        out = []
        for s, (order, begun) in enumerate(zip(orders, starts, strict=True)):
            chunks = [u.chunk * pp + s for u in order]
            phases: list[str] = [u.phase for u in order]
            ends = [b + times.get((c, ph), 0.0)
                    for b, c, ph in zip(begun, chunks, phases, strict=True)]  # fmt: skip
            out.append(StageSlots(s, phases, chunks, [u.microbatch for u in order], begun, ends))
        return out

    @property
    def step_time(self) -> float:
        return self.step

    @property
    def pp(self) -> int:
        return len(self.stages)

    @property
    def bubble_fraction(self) -> float:
        """Idle share of the scheduled part of the step on the busiest stage."""
        busiest = max(self.stages, key=lambda s: s.busy_s)
        span = max(s.end_s for s in self.stages)
        return 1.0 - busiest.busy_s / span if span > 0 else 0.0

    @property
    def bubble_formula(self) -> float:
        """(p - 1) / (v m + p - 1): the idle share with equal units and free sends."""
        return bubble_fraction(self.pp, self.microbatches, self.virtual_stages)

    @property
    def peak_memory_bytes(self) -> int:
        return max(s.memory.peak_bytes for s in self.stages)

    @property
    def fits(self) -> bool:
        return all(s.memory.fits for s in self.stages)

    def summary(self) -> dict[str, Any]:
        """Headline figures and every stage, JSON-ready."""
        return {
            "cluster": self.cluster.name,
            "schedule": self.schedule,
            "pp": self.pp,
            "microbatches": self.microbatches,
            "virtual_stages": self.virtual_stages,
            "step_time_s": self.step_time,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "tokens_per_s": self.tokens_per_second,
            "model_flops": self.model_flops,
            "hardware_flops": self.hardware_flops,
            "bubble_fraction": self.bubble_fraction,
            "bubble_formula": self.bubble_formula,
            "peak_memory_bytes": self.peak_memory_bytes,
            "memory_capacity_bytes": self.cluster.hbm_bytes,
            "fits": self.fits,
            "p2p_s": dict(self.p2p_s),
            "tied_all_reduces": [t.to_json() for t in self.tied],
            "stages": [s.to_json() for s in self.stages],
        }


def cost_pipeline_slots(
    program: DistProgram,
    training: Graph,
    assignment: StageAssignment,
    mesh: Mesh,
    cluster: Cluster,
    *,
    schedule: str = "1f1b",
    microbatches: int = 1,
    axis: str = "pp",
    table: CalibrationTable | None = None,
    reduce_each_microbatch: bool = False,
) -> PipelineSlotCost:
    """The step of `program` (one micro-batch, lowered on `mesh` without `axis`) pipelined
    over `axis` with `schedule` (module docstring). `reduce_each_microbatch`: gradient
    accumulation whose recipe reduces every micro-batch's gradients (FSDP, ZeRO-2/3:
    `templates.REDUCE_EVERY_MICROBATCH`), each reduction overlapping its own backward."""
    pp, v = assignment.pp, assignment.virtual_stages
    check_schedule(schedule, pp, microbatches, v)
    check_mesh_fits(mesh, cluster)
    split = Split(program, training, assignment, 1, axis)
    program = split.program  # what the stages run: 16-bit tied weights sum float32 partials
    units: dict[tuple[int, str], list[int]] = {}
    tails: dict[int, list[int]] = {}
    for i, place in split.place.items():
        if place.phase in ("T", "O"):
            for s in split.stages_of(i):
                tails.setdefault(s, []).append(i)
        else:
            units.setdefault((place.chunk, place.phase), []).append(i)
    times: dict[tuple[int, str], float] = {}
    unit_events: dict[tuple[int, str], tuple[Event, ...]] = {}
    unit_keys: dict[tuple[int, str], Hashable | None] = {}
    for (chunk, phase), indices in units.items():
        sub = mesh.submesh(axis, assignment.stage_of_chunk(chunk))
        times[(chunk, phase)], unit_events[(chunk, phase)], unit_keys[(chunk, phase)] = unit_time(
            program, sorted(indices), sub, cluster, table
        )
    p2p = _p2p_times(program, split, mesh, axis, cluster)
    orders, ends, busy = schedule_step(schedule, pp, microbatches, v, times, p2p)
    tied = _tied_reduces(program, split, mesh, axis, cluster, ends)
    tied_end = [max((t.end_s for t in tied if s in t.stages), default=0.0) for s in range(pp)]
    stages = []
    backward = sorted(units.get((0, "B"), []))  # one stage's (gradient accumulation)
    every = 0.0  # seconds each micro-batch but the last adds: its exposed reductions
    if reduce_each_microbatch and pp == 1 and v == 1:
        reductions = [i for i in tails.get(0, []) if program.ops[i].kind in GRADIENT_REDUCTIONS]
        every = _beside_backward(program, reductions, backward, times.get((0, "B"), 0.0),
                                 mesh.submesh(axis, 0), cluster, table)  # fmt: skip
    for s in range(pp):
        sub = mesh.submesh(axis, s)
        tail, tail_key = _tail_time(program, tails.get(s, []), backward, times.get((0, "B"), 0.0),
                                    assignment, sub, cluster, table)  # fmt: skip
        tail += every * (microbatches - 1)
        chunks = tuple(assignment.chunks_of_stage(s))
        keys = tuple(unit_keys.get((c, ph)) for c in chunks for ph in ("F", "B"))
        twin = None if None in keys or tail_key is None else (keys, tail_key, s == 0, s == pp - 1)
        stages.append(
            StageCost(
                stage=s,
                ranks=tuple(sub.ranks),
                layers=tuple(assignment.layers_of_stage(s)),
                chunks=chunks,
                forward_s=tuple(times.get((c, "F"), 0.0) for c in chunks),
                backward_s=tuple(times.get((c, "B"), 0.0) for c in chunks),
                tail_s=tail,
                busy_s=busy[s],
                end_s=ends[s],
                memory=stage_memory(program, training, split, s, orders[s], chunks, cluster, twin),
                tied_end_s=tied_end[s],
                reduce_floor_s=_reduce_floor(program, tails.get(s, []), sub, cluster),
            )
        )
    facts = training_facts(training)
    return PipelineSlotCost(
        cluster=cluster,
        schedule=schedule,
        microbatches=microbatches,
        virtual_stages=v,
        stages=stages,
        step=max(st.tail_start_s + st.tail_s for st in stages),
        model_flops=facts.model_flops * microbatches,
        hardware_flops=facts.hardware_flops * microbatches,
        tokens=facts.tokens * microbatches,
        dtype=facts.dtype,
        devices=mesh.size,
        p2p_s={f"{a}->{b} {ph}": t for (a, b, ph), t in sorted(p2p.items())},
        unit_s=times,
        unit_events=unit_events,
        hops=p2p,
        tied=tied,
    )


def _tied_reduces(
    program: DistProgram,
    split: Split,
    mesh: Mesh,
    axis: str,
    cluster: Cluster,
    ends: Sequence[float],
) -> list[TiedReduce]:
    """Each tied weight's gradient all-reduce: one rank's block of its partial gradient
    over the representatives of its stages, once all of them (and their earlier tied
    all-reduces) are done."""
    ready = list(ends)
    out = []
    for tied in split.tied:
        size = max(_block_bytes(program, v) for v in tied.partials)
        ranks = tuple(mesh.submesh(axis, s).ranks[0] for s in tied.stages)
        seconds = collective_time("all_reduce", size, ranks, cluster)
        start = max(ready[s] for s in tied.stages)
        out.append(TiedReduce(tied.param, tied.stages, ranks, size, seconds, start,
                              tied.reason, f"comm:{axis}"))  # fmt: skip
        for s in tied.stages:
            ready[s] = start + seconds
    return out


def _tail_time(
    program: DistProgram,
    tail: Sequence[int],
    backward: Sequence[int],
    backward_s: float,
    assignment: StageAssignment,
    mesh: Mesh,
    cluster: Cluster,
    table: CalibrationTable | None,
) -> tuple[float, Hashable | None]:
    """Seconds a stage spends after its last backward unit (`backward`, its ops, taking
    `backward_s`): the gradient reductions and the optimizer step (its tail). A pipeline
    (Megatron-LM as in 2021) runs them after the last backward; gradient accumulation (one
    stage) overlaps the reductions with the last micro-batch's backward as Megatron-Core's
    `overlap_grad_reduce` and FSDP2 do, so its tail is what it adds to that backward.
    With the tail's key (`pipeline_units.unit_time`): stages alike have tails alike."""
    alone, _, key = unit_time(program, sorted(tail), mesh, cluster, table)
    if assignment.pp > 1 or assignment.virtual_stages > 1 or not tail or not backward:
        return alone, key
    beside = _beside_backward(program, tail, backward, backward_s, mesh, cluster, table)
    return min(alone, beside), key


def _beside_backward(
    program: DistProgram,
    extra: Sequence[int],
    backward: Sequence[int],
    backward_s: float,
    mesh: Mesh,
    cluster: Cluster,
    table: CalibrationTable | None,
) -> float:
    """Seconds the ops `extra` add to a backward unit (`backward`, taking `backward_s`) when
    they run beside it: the gradient reductions of one micro-batch where the recipe reduces
    every micro-batch (FSDP2 reduce-scatters after each backward and sums the shards), or
    the whole tail after the last one."""
    if not extra or not backward:
        return 0.0
    both = fragment_timeline(program, sorted([*backward, *extra]), mesh, cluster, table)
    return max(0.0, both.step_time - backward_s)


#: The collectives that reduce gradients over the data-parallel ranks.
GRADIENT_REDUCTIONS = frozenset({"reduce_scatter", "all_reduce"})


def _reduce_floor(program: DistProgram, tail: Sequence[int], mesh: Mesh, cluster: Cluster) -> float:
    """The least seconds a tail's float32 gradient reductions take (`StageCost`): on the
    busiest mesh axis (each axis has a stream of its own), one reduce-scatter of all the
    bytes they reduce there (one fused collective takes no longer than several: each costs
    its latency and its bytes)."""
    size: dict[str, float] = {}
    for i in tail:
        op = program.ops[i]
        if op.comm is None or op.comm.kind not in GRADIENT_REDUCTIONS:
            continue
        if program.types[op.inputs[0]].dtype != "float32":
            continue
        size[op.comm.axis] = size.get(op.comm.axis, 0.0) + _block_bytes(program, op.inputs[0])
    first = mesh.ranks[0]
    return max((collective_time("reduce_scatter", s, mesh.group_of(first, a), cluster)
                for a, s in size.items()), default=0.0)  # fmt: skip


def _p2p_times(
    program: DistProgram, split: Split, mesh: Mesh, axis: str, cluster: Cluster
) -> dict[tuple[int, int, str], float]:
    """Seconds per micro-batch to send what crosses from chunk a to chunk b in a phase."""
    nbytes: dict[tuple[int, int, str], list[tuple[str, float]]] = {}
    sent: set[tuple[str, int]] = set()  # (value, receiving stage): sent once, to its first reader
    for i, op in enumerate(program.ops):
        if i in split.free or i not in split.place or i in split.tied_of:
            continue  # a tied weight's partial gradients: its all-reduce (`TiedReduce`)
        dst = split.place[i]
        for value in op.inputs:
            j = split.producer.get(value)
            if j is None or j in split.free or split.holds(j, split.stage(i)):
                continue
            if j in split.local_copies:  # a copy of a tied weight, made where it is read
                continue
            if (value, split.stage(i)) in sent:
                continue
            sent.add((value, split.stage(i)))
            key = (split.place[j].chunk, dst.chunk, dst.phase)
            nbytes.setdefault(key, []).append((value, _block_bytes(program, value)))
    out: dict[tuple[int, int, str], float] = {}
    for (a, b, phase), values in nbytes.items():
        sender = mesh.submesh(axis, split.assignment.stage_of_chunk(a))
        receiver = mesh.submesh(axis, split.assignment.stage_of_chunk(b))
        pair = (sender.ranks[0], receiver.ranks[0])
        seconds = 0.0
        for value, size in values:
            spread = _replicated_axes(program, value)
            pieces = math.prod(program.mesh.axis_size(x) for x in spread)
            seconds += collective_time("send", size / pieces, pair, cluster)
            if pieces > 1:  # gather the pieces on arrival (Megatron's scatter/gather)
                seconds += collective_time("all_gather", size, _group(receiver, spread), cluster)
        out[(a, b, phase)] = seconds
    return out


def _replicated_axes(program: DistProgram, value: str) -> list[str]:
    """The mesh axes of size > 1 on which `value` is replicated: its ranks there hold the
    same block, so each sends one piece of it."""
    spec = program.specs[value]
    return [
        name
        for name, p in zip(spec.mesh.axis_names, spec.placements, strict=True)
        if isinstance(p, Replicate) and spec.mesh.axis_size(name) > 1
    ]


def _group(mesh: Mesh, axes: Sequence[str]) -> tuple[int, ...]:
    """The ranks of `mesh` that share rank 0's coordinates on every axis but `axes`."""
    first = mesh.ranks[0]
    group = {first}
    for a in axes:
        group = {r for g in group for r in mesh.group_of(g, a)}
    return tuple(sorted(group))


def _block_bytes(program: DistProgram, value: str) -> float:
    t, spec = program.types[value], program.specs[value]
    return float(math.prod(local_shape(t.shape, spec.mesh, spec.placements)) * DTYPE_BYTES[t.dtype])
