"""The pass manager: ordered, configurable optimization passes over a lowered program.

A pass is a pure function `(program, training graph, options) -> PassResult`: a new program
and a summary of what it changed (counts before/after, which values, why, a one-line
message). Passes run in `ORDER`; each is on or off by default (`Pass.default_on`), and a
strategy overrides that in `Strategy.options["passes"]`:

    {"passes": {"dp_fuse_allreduce": {"bucket_mb": 4}, "dp_overlap": false}}

`True` turns a pass on with its defaults, `False` turns it off, a mapping turns it on with
those options. The plan keeps a `PassStage` per pass (program, summary and, with a cluster,
its cost), so any pass's effect is a `compare` of two neighbouring stages.

Given a cost function (a plan with a cluster), every pass runs under the cost guard
(`passes.guard`): it keeps its change only where the predicted step does not get worse, else
its stage keeps the previous program and says why; a pass with a tunable option the user did
not set (`dp_fuse_allreduce`'s `bucket_mb`) has it chosen by cost. Each stage's cost is
computed once and handed on, and a pass that changes nothing is not costed again.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from shardlab.ir import Graph
from shardlab.passes import data_parallel as dp
from shardlab.passes.base import Pass, PassError, PassFn, PassResult
from shardlab.passes.guard import Costed, guard_pass, option_trials, same_program
from shardlab.program import DistProgram

C = TypeVar("C", bound=Costed)

__all__ = ["PASSES", "Pass", "PassError", "PassFn", "PassResult", "PassStage", "run_passes"]


#: Every registered pass, in the order they run.
PASSES: dict[str, Pass] = {}


def register_pass(p: Pass) -> None:
    PASSES[p.name] = p


def resolve_passes(config: Any) -> list[tuple[Pass, dict[str, Any]]]:
    """The passes to run with their options, from `Strategy.options["passes"]` (or None)."""
    config = {} if config is None else config
    if not isinstance(config, Mapping):
        raise PassError(f"strategy option 'passes' must be an object, got {config!r}")
    unknown = sorted(set(config) - set(PASSES))
    if unknown:
        raise PassError(
            f"unknown pass {unknown[0]!r}; known passes: {', '.join(PASSES)}", passes=unknown
        )
    chosen = []
    for name, p in PASSES.items():
        setting = config.get(name, p.default_on)
        if setting is False:
            continue
        given = dict(setting) if isinstance(setting, Mapping) else {}
        if not isinstance(setting, bool | Mapping):
            raise PassError(f"pass {name!r}: expected true, false or options, got {setting!r}")
        bad = sorted(set(given) - set(p.options))
        if bad:
            raise PassError(
                f"pass {name!r} has no option {bad[0]!r}; options: {', '.join(p.options) or '-'}",
                option=bad[0],
            )
        chosen.append((p, {**p.options, **given}))
    return chosen


@dataclass
class PassStage(Generic[C]):
    """The program after one pass (or "lowered" before any), what that pass changed and,
    when run with a cost function, its cost."""

    name: str
    program: DistProgram
    summary: dict[str, Any]
    cost: C | None = None


def given_options(config: Any, name: str) -> Mapping[str, Any]:
    """The options the user set for pass `name` in `Strategy.options["passes"]` (not the
    defaults): what the cost guard must not tune."""
    setting = config.get(name) if isinstance(config, Mapping) else None
    return setting if isinstance(setting, Mapping) else {}


def run_passes(
    program: DistProgram,
    training: Graph,
    config: Any,
    on_pass: Callable[[int, int, str], None] | None = None,
    cost: Callable[[DistProgram], C] | None = None,
) -> list[PassStage[C]]:
    """Stage "lowered" followed by one stage per pass that ran, in order; `on_pass(n, total,
    name)` is told before each pass starts (for progress bars). With `cost` (a program ->
    its cost), every stage is costed and every pass runs under the cost guard."""
    lowered = {"message": "as lowered", "ops": len(program.ops)}
    stages = [PassStage("lowered", program, lowered, None if cost is None else cost(program))]
    passes = resolve_passes(config)
    for n, (p, options) in enumerate(passes):
        if on_pass is not None:
            on_pass(n, len(passes), p.name)
        before = stages[-1]
        before_cost = before.cost
        if cost is None or before_cost is None:
            result = p.fn(before.program, training, options)
            after, summary, spent = result.program, result.summary, None
        else:
            apply = functools.partial(_apply, p.fn, training)
            trials, start = option_trials(
                p, options, given_options(config, p.name), [before.program]
            )
            kept = guard_pass(trials, start, before.program, before_cost, apply, cost, same_program)
            after, summary, spent = kept.program, kept.summary, kept.cost
        sizes = {"ops_before": len(before.program.ops), "ops_after": len(after.ops)}
        stages.append(PassStage(p.name, after, {**sizes, **summary}, spent))
    return stages


def _apply(
    fn: PassFn, training: Graph, program: DistProgram, options: Mapping[str, Any]
) -> tuple[DistProgram, dict[str, Any]]:
    """One pass function on a program: the new program and the pass's summary."""
    result = fn(program, training, options)
    return result.program, result.summary


def _register_builtin_passes() -> None:
    """The passes Shardlab ships, in the order they run."""
    register_pass(Pass("dp_grad_scaling", dp.dp_grad_scaling,
                       "fold per-gradient 1/dp scaling into the loss gradient"))  # fmt: skip
    register_pass(Pass("dp_fuse_allreduce", dp.dp_fuse_allreduce,
                       "fuse gradient all-reduces into buckets", True,
                       {"bucket_mb": dp.DEFAULT_BUCKET_MB}, dp.bucket_mb_candidates))  # fmt: skip
    register_pass(Pass("dp_overlap", dp.dp_overlap,
                       "issue each bucket's all-reduce as soon as its gradients exist and wait "
                       "right before the first reader"))  # fmt: skip


_register_builtin_passes()
