"""Run the registered program passes (`passes.manager`) on every stage of a pipeline.

What it is for: `build_pipeline` lowers one micro-batch and splits it into per-stage
`DistProgram`s; their data-parallel gradient all-reduces run once per parameter, on the
gradient accumulated over the micro-batches (`<grad>.acc`), right before the optimizer. The
data-parallel passes (`dp_grad_scaling`, `dp_fuse_allreduce`, `dp_overlap`) are program
passes, so they apply to each stage program as they are; `apply_stage_passes` runs them in
the manager's order on every stage and adds up what they changed.

`training` is the training graph of ONE micro-batch (`training_graph(micro_model)`): the
passes look up serial value names there (`<grad>` of an all-reduce's attr `value`, the
loss), which the stage programs keep for their accumulated gradients and all-reduces.

`guarded_stage_pass_steps` runs them under the cost guard (`passes.guard`) with a pipeline
cost: one decision per pass for the whole pipeline (every stage keeps the pass, or none
does), since the step is one simulation of all stages together; costing each stage's choice
apart would cost the pipeline once per stage and per pass. A pass that changes nothing is
not costed, so the guard costs the pipeline once per pass that changes it (the costs the
CLI shows anyway) plus the extra bucket sizes the tuning of `dp_fuse_allreduce` tries.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from shardlab.ir import Graph
from shardlab.passes.base import Pass
from shardlab.passes.guard import Costed, guard_pass, option_trials, same_program
from shardlab.passes.manager import given_options, resolve_passes
from shardlab.passes.pipeline import PipelineProgram
from shardlab.program import DistProgram

__all__ = [
    "aggregate_summaries",
    "apply_stage_passes",
    "guarded_stage_pass_steps",
    "same_pipeline",
    "stage_pass_steps",
]

C = TypeVar("C", bound=Costed)

#: Integer summary fields that are settings or ids, not counts: not summed over stages.
NOT_SUMMED = frozenset({"stage", "bucket_bytes"})


def stage_pass_steps(
    pipeline: PipelineProgram, training: Graph, config: Any
) -> list[tuple[PipelineProgram, dict[str, Any]]]:
    """The pipeline after each pass of `config` (as `Strategy.options["passes"]`) that ran on
    every stage program, in order, with that pass's summary aggregated over the stages."""
    steps: list[tuple[PipelineProgram, dict[str, Any]]] = []
    for p, options in resolve_passes(config):
        steps.append(_on_stages(p, training, steps[-1][0] if steps else pipeline, options))
    return steps


def guarded_stage_pass_steps(
    pipeline: PipelineProgram,
    training: Graph,
    config: Any,
    cost: Callable[[PipelineProgram], C],
    built_cost: C | None = None,
) -> list[tuple[PipelineProgram, dict[str, Any], C]]:
    """`stage_pass_steps` under the cost guard, with `cost` (a pipeline -> its cost; the
    pipeline as built costs `built_cost`, computed when None): each pass keeps its change
    on every stage only where the pipeline's predicted step does not get worse. Each step
    comes with its cost; summaries carry the guard's fields (`declined`, ...)."""
    before_cost = cost(pipeline) if built_cost is None else built_cost
    before = pipeline
    steps: list[tuple[PipelineProgram, dict[str, Any], C]] = []
    for p, options in resolve_passes(config):
        trials, start = option_trials(p, options, given_options(config, p.name), before.stages)
        apply = functools.partial(_on_stages, p, training)
        kept = guard_pass(trials, start, before, before_cost, apply, cost, same_pipeline)
        steps.append((kept.program, {"pass": p.name, **kept.summary}, kept.cost))
        before, before_cost = kept.program, kept.cost
    return steps


def same_pipeline(a: PipelineProgram, b: PipelineProgram) -> bool:
    """True when every stage program of `a` equals that of `b` (so they cost the same)."""
    return a is b or (
        len(a.stages) == len(b.stages)
        and all(same_program(x, y) for x, y in zip(a.stages, b.stages, strict=True))
    )


def _on_stages(
    p: Pass, training: Graph, pipeline: PipelineProgram, options: Mapping[str, Any]
) -> tuple[PipelineProgram, dict[str, Any]]:
    """Pass `p` run on every stage program, and its summary aggregated over the stages."""
    per_stage: list[dict[str, Any]] = []
    stages: list[DistProgram] = list(pipeline.stages)
    for s, program in enumerate(stages):
        result = p.fn(program, training, options)
        sizes = {"ops_before": len(program.ops), "ops_after": len(result.program.ops)}
        per_stage.append({"stage": s, **sizes, **result.summary})
        stages[s] = result.program
    after = dataclasses.replace(pipeline, stages=stages)
    return after, aggregate_summaries(p.name, per_stage)


def apply_stage_passes(
    pipeline: PipelineProgram, training: Graph, config: Any
) -> tuple[PipelineProgram, list[dict[str, Any]]]:
    """The pipeline after every pass of `config`, and one summary per pass that ran."""
    steps = stage_pass_steps(pipeline, training, config)
    return (steps[-1][0] if steps else pipeline), [summary for _, summary in steps]


def aggregate_summaries(name: str, per_stage: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One pass's summary over the stages: its integer counts summed (ops, all-reduces,
    buckets, bytes; tallies such as `closed_by` key by key), a message from those sums, and
    the stage summaries, unchanged, in `stages`."""
    totals: dict[str, int] = {}
    tallies: dict[str, dict[str, int]] = {}
    for summary in per_stage:
        for key, value in summary.items():
            if _is_count(value) and key not in NOT_SUMMED:
                totals[key] = totals.get(key, 0) + value
            elif isinstance(value, dict) and value and all(map(_is_count, value.values())):
                tally = tallies.setdefault(key, {})
                for k, v in value.items():
                    tally[k] = tally.get(k, 0) + v
    message = _message(name, totals, per_stage)
    return {"pass": name, **totals, **tallies, "message": message, "stages": list(per_stage)}


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _message(name: str, totals: dict[str, int], per_stage: Sequence[dict[str, Any]]) -> str:
    """What the pass did over all stages: its known counts, else the stage messages."""
    n = len(per_stage)
    if name == "dp_fuse_allreduce" and "all_reduces_before" in totals:
        before, after = totals["all_reduces_before"], totals["all_reduces_after"]
        return f"{before} all-reduces fused into {after} over {n} stages"
    if name == "dp_overlap" and "all_reduces" in totals:
        moved, count = totals.get("moved", 0), totals["all_reduces"]
        return f"{moved} of {count} gradient all-reduces moved up over {n} stages"
    if name == "dp_grad_scaling" and "scale_ops_before" in totals:
        before, after = totals["scale_ops_before"], totals["scale_ops_after"]
        return f"{before} gradient scale ops before, {after} after, over {n} stages"
    return "; ".join(f"stage {s['stage']}: {s.get('message', '-')}" for s in per_stage)
