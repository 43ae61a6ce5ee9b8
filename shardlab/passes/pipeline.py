"""Pipeline parallelism: split a lowered training step into stages on the `pp` mesh axis.

The input is the `DistProgram` of ONE micro-batch's training graph, lowered on the sub-mesh
of the other mesh axes (`stage_strategy` drops the `pp` axis from a strategy, so templates
and annotations on the other axes carry over). The layers are split into `pp * v`
contiguous model chunks (`assign_layers`: balanced by FLOPs, or at given boundaries); chunk
`c` lives on stage `c % pp` (v > 1: interleaved virtual stages).

Every op goes to a chunk and a phase (`F` forward and loss, `B` backward, `O` optimizer):

- ops in `layers.<i>` scopes go to layer i's chunk; other scoped ops to chunk 0 when their
  module comes before the first layer (`embed`, `rope`), else to the last chunk
  (`final_norm`, `lm_head`, `loss`); backward ops carry their forward op's scope;
- unscoped ops (gradient sums) follow their inputs: the latest chunk for forward ops, the
  earliest for backward ops, so that a sum of one chunk's contributions is sent once;
- an optimizer op goes with its parameter; a parameter read on several stages (tied
  embeddings) is held by each of them (Megatron-LM's embedding group, below);
- a reshard follows its first consumer; one that restores an output's completed placement
  follows the op it restores, unless only optimizer ops read it;
- ops that depend on no source at all (`rope_cache`, `fill`: the loss gradient seed) run
  once, up front, on every stage that reads them instead of being sent.

Each stage's program runs those free ops, the units of its schedule (each unit is one
chunk's F or B ops with values renamed `<value>#<m>` for micro-batch m), then its optimizer
ops once. A value produced on stage a and read on stage b gets a `send` right after its
producer and a `recv` right before its first reader (role comm, stream `comm:pp`, attrs
`peer_stage` and `tag`, the renamed value). Parameters, optimizer state and free values keep
their names. The gradient the optimizer reads is summed over micro-batches by `add` ops into
`<grad>.acc` (micro-batch 0 starts it), so the reshards between it and the optimizer (the
data-parallel gradient all-reduce) run once, on the sum. The loss gradient seed is scaled
by 1/M: the summed gradient is the gradient of the mean of the micro-batch losses (the
full-batch loss when the loss is a mean). The data-parallel passes run on every stage
program through `passes.pipeline_passes.apply_stage_passes`; the send/wait pass is
`passes.send_wait`.

Tied weights (`pipeline_tied.TiedWeight`): every stage that reads the parameter holds a
replica, fed the same initial value (Megatron-LM copies the first stage's embedding to the
last). Each accumulates its partial gradient over the micro-batches; after the last backward
unit, the stages of the group all-reduce the partials: each sends its accumulated partial to
the others (`send`/`recv` ops named `tied_all_reduce:...`, attrs `collective: all_reduce`,
`tied_weight`, `group`, and a `reason`) and runs the serial graph's `<param>.grad_acc` adds
on them in one fixed order, so every replica gets the same bits; then each runs the same
optimizer ops on its replica. Sharded parameters (tensor parallel, FSDP, ZeRO) exchange their
local blocks: the same placement on every stage.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from shardlab.autodiff import training_graph
from shardlab.ir import Graph
from shardlab.lower import lower
from shardlab.mesh import Mesh
from shardlab.passes.pipeline_schedule import (
    SCHEDULES,
    PipelineError,
    Unit,
    bubble_fraction,
    check_schedule,
    check_send_recv,
    execution_order,
    schedule_units,
)
from shardlab.passes.pipeline_split import Crossing, Feed, Split
from shardlab.passes.pipeline_stages import StageAssignment, assign_layers, stage_of_scope
from shardlab.passes.pipeline_tied import TiedWeight
from shardlab.placement import Replicate
from shardlab.program import DistProgram
from shardlab.spmd.complete import complete
from shardlab.strategy import Strategy

__all__ = [
    "SCHEDULES",
    "Crossing",
    "Feed",
    "PipelineError",
    "PipelineProgram",
    "StageAssignment",
    "TiedWeight",
    "Unit",
    "assign_layers",
    "build_pipeline",
    "check_send_recv",
    "execution_order",
    "microbatch_of",
    "pipeline_program",
    "schedule_units",
    "stage_of_scope",
    "stage_strategy",
]


@dataclass
class PipelineProgram:
    """Per-stage programs (with send/recv) of one pipelined training step."""

    mesh: Mesh  # the full mesh, pipeline axis included
    axis: str
    stages: list[DistProgram]  # stage s runs on mesh.submesh(axis, s)
    microbatches: int
    schedule: str
    virtual_stages: int
    assignment: StageAssignment
    #: per stage: the schedule's units, in the order the stage runs them
    units: list[list[Unit]]
    #: per stage: program value -> the global source (or micro-batch slice) it is fed from
    feeds: list[dict[str, Feed]]
    #: serial name (gradient the optimizer reads, new param, new state) -> (stage, value)
    outputs: dict[str, tuple[int, str]]
    #: (stage, value) of each micro-batch's loss, in micro-batch order
    losses: list[tuple[int, str]]
    #: the serial name of the loss (its value in `run_pipeline`: the micro-batch mean)
    loss: str
    #: values of one micro-batch that cross stages (each is sent once per micro-batch)
    crossing: list[Crossing] = field(default_factory=list)
    #: parameters held on several stages, their gradients all-reduced between them
    tied: list[TiedWeight] = field(default_factory=list)

    @property
    def pp(self) -> int:
        return len(self.stages)

    def summary(self) -> dict[str, Any]:
        """Stages (ranks, layers, ops, sends, recvs), the schedule and its bubble estimate."""
        stages = []
        for s, program in enumerate(self.stages):
            kinds = [op.kind for op in program.ops]
            stages.append(
                {
                    "stage": s,
                    "ranks": list(program.mesh.ranks),
                    "chunks": self.assignment.chunks_of_stage(s),
                    "layers": self.assignment.layers_of_stage(s),
                    "ops": len(program.ops),
                    "sends": kinds.count("send"),
                    "recvs": kinds.count("recv"),
                }
            )
        return {
            "schedule": self.schedule,
            "pp": self.pp,
            "microbatches": self.microbatches,
            "virtual_stages": self.virtual_stages,
            "stages": stages,
            "values_crossing_per_microbatch": len(self.crossing),
            "tied_weights": [
                {"param": w.param, "stages": list(w.stages), "reason": w.reason} for w in self.tied
            ],
            "bubble_fraction": bubble_fraction(self.pp, self.microbatches, self.virtual_stages),
        }


def stage_strategy(strategy: Strategy, axis: str = "pp") -> Strategy:
    """One stage's strategy: the mesh without `axis`; templates and annotations carry over."""
    mesh = strategy.mesh
    mesh.axis_index(axis)
    for use in strategy.templates:
        if use.axis == axis:
            raise PipelineError(
                f"template {use} uses the pipeline axis {axis!r}; stages split the layers "
                "along it, so templates belong on the other mesh axes",
                template=str(use),
            )
    anns = []
    for ann in strategy.annotations:
        for a, p in ann.placements:
            if a == axis and p != Replicate():
                raise PipelineError(
                    f"annotation {ann.text()!r} places values as {p} on the pipeline axis "
                    f"{axis!r}; a stage holds whole values along it",
                    annotation=ann.text(),
                )
        kept = tuple((a, p) for a, p in ann.placements if a != axis)
        if kept:
            anns.append(replace(ann, placements=kept))
    return Strategy(mesh.submesh(axis, 0), strategy.templates, tuple(anns), dict(strategy.options))


def build_pipeline(
    model: Graph,
    strategy: Strategy,
    *,
    microbatches: int,
    schedule: str = "1f1b",
    virtual_stages: int | None = None,
    boundaries: Sequence[int] | None = None,
    optimizer: str = "adamw",
    lr: float = 1e-3,
    axis: str = "pp",
) -> PipelineProgram:
    """Training graph, completion and lowering of one micro-batch, then `pipeline_program`.

    `model` is the forward graph of ONE micro-batch (global batch / microbatches);
    `strategy.mesh` has the pipeline axis `axis`.
    """
    training = training_graph(model, optimizer=optimizer, lr=lr, recompute=strategy.recompute)
    program = lower(complete(training, stage_strategy(strategy, axis)))
    return pipeline_program(
        program,
        training,
        strategy.mesh.axis_size(axis),
        microbatches,
        schedule,
        boundaries,
        virtual_stages=virtual_stages,
        mesh=strategy.mesh,
        axis=axis,
    )


def pipeline_program(
    program: DistProgram,
    training: Graph,
    pp: int,
    microbatches: int,
    schedule: str = "1f1b",
    boundaries: Sequence[int] | None = None,
    *,
    virtual_stages: int | None = None,
    mesh: Mesh | None = None,
    axis: str = "pp",
) -> PipelineProgram:
    """Split the lowered program of one micro-batch into per-stage programs (module doc).

    `virtual_stages` defaults to 2 for the interleaved schedule, else 1. `mesh` is the full
    mesh (default: `axis` of size pp in front of the program's mesh). Raises PipelineError
    when the split is impossible or its sends and recvs do not match.
    """
    v = virtual_stages or (2 if schedule == "interleaved" else 1)
    check_schedule(schedule, pp, microbatches, v)
    if mesh is None:
        mesh = Mesh((pp, *program.mesh.shape), (axis, *program.mesh.axis_names))
    sub = mesh.submesh(axis, 0)
    if mesh.axis_size(axis) != pp or (sub.shape, sub.axis_names) != (
        program.mesh.shape,
        program.mesh.axis_names,
    ):
        raise PipelineError(
            f"the program's mesh {program.mesh} is not mesh {mesh} without its axis {axis!r} "
            f"(of size {pp})"
        )
    assignment = assign_layers(training, pp, v, boundaries)
    split = Split(program, training, assignment, microbatches, axis)
    units = [schedule_units(schedule, pp, s, microbatches, v) for s in range(pp)]
    stages, feeds, outputs, losses = [], [], {}, []
    for s in range(pp):
        built = split.stage_program(s, units[s], mesh.submesh(axis, s))
        stages.append(built.program)
        feeds.append(built.feeds)
        outputs.update({name: (s, value) for name, value in built.outputs.items()})
        losses += [(s, value) for value in built.losses]
    losses.sort(key=lambda sv: microbatch_of(sv[1]) or 0)
    pipeline = PipelineProgram(
        mesh,
        axis,
        stages,
        microbatches,
        schedule,
        v,
        assignment,
        units,
        feeds,
        outputs,
        losses,
        split.loss_name,
        split.crossing,
        split.tied,
    )
    check_send_recv(pipeline)
    return pipeline


def microbatch_of(name: str) -> int | None:
    """The micro-batch of a renamed value or op (`x#3` -> 3); None for shared ones."""
    head, sep, tail = name.rpartition("#")
    return int(tail) if sep and head and tail.isdigit() else None
