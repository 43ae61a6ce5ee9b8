"""The pipelined branch of `build_plan`: a mesh with a `pp` axis splits the layers into stages.

The strategy's option `pipeline` says how (`PipelineOptions`: schedule, micro-batches,
virtual stages, layer balance). The model is rebuilt for one micro-batch (a preset with
`batch / microbatches`), its training graph is completed and lowered on the mesh without
the pipeline axis (every stage runs the same templates on its own ranks), the passes run
on that one-micro-batch program, and the cost is the schedule's (`cost.pipeline_slots`):
each stage's units costed once and laid out as slots. With a cluster the cost guard judges
every pass by that pipelined step. The report names the tied weights (parameters read on
several stages, held by each, their gradients all-reduced between them).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from shardlab.autodiff import training_graph_of
from shardlab.cost.clusters import Cluster
from shardlab.cost.pipeline_slots import PipelineSlotCost, cost_pipeline_slots
from shardlab.ir import Graph
from shardlab.lower import lower
from shardlab.passes.manager import PASSES, run_passes
from shardlab.passes.pipeline import stage_strategy
from shardlab.passes.pipeline_schedule import PipelineError, PipelineOptions
from shardlab.passes.pipeline_split import serial_places
from shardlab.passes.pipeline_stages import (
    StageAssignment,
    assign_layers,
    assign_layers_by_time,
)
from shardlab.passes.pipeline_tied import tied_reason, tied_stages
from shardlab.program import DistProgram
from shardlab.rebatch import microbatch_model
from shardlab.reuse import Reuse
from shardlab.spmd.complete import CompletedGraph, complete
from shardlab.strategy import PIPELINE_AXIS, Strategy, StrategyError
from shardlab.templates import REDUCE_EVERY_MICROBATCH

#: Passes that must not run on the one-micro-batch program of all stages: a bucket would
#: mix gradients of several stages. They run per stage on the detailed pipeline programs
#: (`passes.pipeline_passes`); here the gradient reductions stay as lowered, after the
#: last backward (as Megatron-LM reduced them in 2021). With one stage (gradient
#: accumulation) they run, and the reductions overlap the last micro-batch's backward
#: (`cost.pipeline_slots._tail_time`).
STAGE_LOCAL_PASSES = frozenset({"dp_fuse_allreduce", "dp_overlap"})


def micro_model(model: Graph, microbatches: int) -> Graph:
    """The forward graph of one micro-batch: the model rebuilt with batch / microbatches
    (`shardlab.rebatch`: presets and Hugging Face imports; others cannot be cut). Built once
    per micro-batch count and kept on `model`, as `training_graph_of` keeps its training
    graphs."""
    known: dict[int, Graph] = model.__dict__.setdefault("_micro", {})
    if microbatches not in known:
        known[microbatches] = microbatch_model(model, microbatches)
    return known[microbatches]


@dataclass
class PipelineReport:
    """A pipelined plan's layout and, when costed, its pipelined step (`Plan.pipeline`)."""

    options: PipelineOptions
    assignment: StageAssignment
    cost: PipelineSlotCost | None = None
    #: parameters read on several stages (tied weights) -> those stages
    tied: dict[str, tuple[int, ...]] = field(default_factory=dict)
    #: gradient accumulation on a mesh without a `pp` axis: one stage, no bubble
    accumulation: bool = False

    def summary(self) -> dict[str, Any]:
        """Schedule, stages (layers, chunks) and, when costed, step, bubble and memory per
        stage, JSON-ready."""
        a = self.assignment
        out: dict[str, Any] = {
            **self.options.to_json(),
            "accumulation": self.accumulation,
            "pp": a.pp,
            "stages": [
                {"stage": s, "layers": a.layers_of_stage(s), "chunks": a.chunks_of_stage(s)}
                for s in range(a.pp)
            ],
            "tied_weights": [
                {"param": p, "stages": list(st), "reason": tied_reason(p, st)}
                for p, st in self.tied.items()
            ],
        }
        if self.cost is not None:
            out.update(self.cost.summary())
        return out


@dataclass
class PipelinedBuild:
    """What the pipelined branch hands back to `build_plan`."""

    micro: Graph
    training: Graph
    completed: CompletedGraph
    report: PipelineReport
    stages: list[tuple[str, DistProgram, dict[str, Any], PipelineSlotCost | None]]


def build_pipelined(
    model: Graph,
    strategy: Strategy,
    *,
    optimizer: str,
    lr: float,
    cluster: Cluster | None,
    passes: bool,
    report: Callable[[float, str], None],
    fold: bool = True,
) -> PipelinedBuild:
    """Training graph of one micro-batch, completion and lowering per stage, passes (under
    the cost guard of the pipelined step when costed)."""
    pp = strategy.mesh.axis_size(PIPELINE_AXIS)
    options = PipelineOptions.from_options(strategy.options, pp)
    micro = micro_model(model, options.microbatches)
    report(0.05, "training graph of one micro-batch")
    training = training_graph_of(micro, optimizer, lr, strategy.recompute)
    assignment = _assignment(training, pp, options)
    report(0.1, "completion and lowering")
    try:
        completed, program = lowered_stage(training, stage_strategy(strategy, PIPELINE_AXIS), fold)
    except StrategyError as exc:
        raise _per_microbatch(exc, options.microbatches) from None
    if options.balance == "time":
        if cluster is None:
            raise PipelineError("pipeline option balance 'time' needs a cluster to time the "
                                "layers on (--cluster)", option="balance")  # fmt: skip
        assignment = assign_layers_by_time(program, training, pp, options.virtual_stages,
                                           cluster)  # fmt: skip
    tied = tied_stages(training, assignment, serial_places(training, assignment))
    cost = None
    if cluster is not None:
        cost = functools.partial(
            cost_pipeline_slots,
            training=training,
            assignment=assignment,
            mesh=strategy.mesh,
            cluster=cluster,
            schedule=options.schedule,
            microbatches=options.microbatches,
            axis=PIPELINE_AXIS,
            reduce_each_microbatch=any(
                t.name in REDUCE_EVERY_MICROBATCH for t in strategy.templates
            ),
        )
    config = dict(strategy.options.get("passes") or {}) if passes else {}
    one_stage = pp == 1 and options.virtual_stages == 1  # gradient accumulation
    for name in PASSES:  # the bucket passes would mix the gradients of several stages
        if not passes or (name in STAGE_LOCAL_PASSES and not one_stage):
            config[name] = False

    def on_pass(n: int, total: int, name: str) -> None:
        report(0.5 + 0.5 * n / total, f"pass {name}" + (" and the pipeline's cost" if cost else ""))

    raw = run_passes(program, training, config, on_pass, cost)
    return PipelinedBuild(
        micro,
        training,
        completed,
        PipelineReport(options, assignment, raw[-1].cost, tied),
        [(s.name, s.program, s.summary, s.cost) for s in raw],
    )


#: Completed and lowered one-micro-batch programs kept per worker process (`lowered_stage`).
LOWERED = Reuse[tuple[Graph, CompletedGraph, DistProgram]]("pipeline stage lowering", 8)


def lowered_stage(
    training: Graph, stage: Strategy, fold: bool = True
) -> tuple[CompletedGraph, DistProgram]:
    """`training` completed and lowered under one stage's strategy (`stage_strategy`).

    Both depend on the training graph (one micro-batch's, with its optimizer and
    recomputation), the stage's mesh, templates and annotations only, not on the schedule,
    the micro-batch count's layout or the stage assignment: candidates of a search that
    differ only in those reuse them (`LOWERED`, keyed by the training graph's identity, which
    the entry keeps alive). Nothing downstream changes them in place (passes and the split
    build new programs). The completed graph handed back carries `stage` itself."""
    key = (id(training), stage.mesh, stage.templates, stage.annotations, fold)

    def make() -> tuple[Graph, CompletedGraph, DistProgram]:
        completed = complete(training, stage, fold)
        return training, completed, lower(completed)

    _, completed, program = LOWERED.get(key, make)
    return replace(completed, strategy=stage), program


def _per_microbatch(exc: StrategyError, microbatches: int) -> StrategyError:
    """`exc` saying that the batch it names is one micro-batch's, where it names one: the
    dp template's refusal of a batch its axis does not divide speaks of the micro-batch."""
    batch = exc.detail.get("batch")
    if not isinstance(batch, int) or microbatches == 1:
        return exc
    return StrategyError(
        f"{exc.message} (that is one of {microbatches} micro-batches: the batch of "
        f"{batch * microbatches} must be a multiple of {microbatches} micro-batches x the "
        "data-parallel ranks)",
        **{**exc.detail, "microbatches": microbatches},
    )


def _assignment(training: Graph, pp: int, options: PipelineOptions) -> StageAssignment:
    """Layers per chunk: balanced by FLOPs, or the same count per chunk (Megatron-LM);
    balanced by time (FLOPs until the program is lowered and timed)."""
    v = options.virtual_stages
    if options.balance in ("flops", "time"):
        return assign_layers(training, pp, v)
    layers = assign_layers(training, pp, v).chunks[-1][1]
    k = pp * v
    if layers % k:
        raise PipelineError(
            f"balance 'even' needs the {layers} layers to divide into {k} chunks (pp={pp} x "
            f"{v} virtual stages)",
            layers=layers,
        )
    return assign_layers(training, pp, v, [layers // k * c for c in range(1, k)])
