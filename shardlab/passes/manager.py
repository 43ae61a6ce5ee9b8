"""The pass manager: ordered, configurable optimization passes over a lowered program.

A pass is a pure function `(program, training graph, options) -> PassResult`: a new program
and a summary of what it changed (counts before/after, which values, why, a one-line
message). Passes run in `ORDER`; each is on or off by default (`Pass.default_on`), and a
strategy overrides that in `Strategy.options["passes"]`:

    {"passes": {"dp_fuse_allreduce": {"bucket_mb": 4}, "dp_overlap": false}}

`True` turns a pass on with its defaults, `False` turns it off, a mapping turns it on with
those options. The plan keeps a `PassStage` per pass (program, summary and, with a cluster,
its cost), so any pass's effect is a `compare` of two neighbouring stages.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shardlab.errors import ShardlabError
from shardlab.ir import Graph
from shardlab.program import DistProgram


class PassError(ShardlabError):
    """An unknown pass, or an option a pass does not take."""

    code = "invalid_pass"


@dataclass(frozen=True)
class PassResult:
    """What a pass returns: the new program and what changed."""

    program: DistProgram
    summary: dict[str, Any] = field(default_factory=dict)


PassFn = Callable[[DistProgram, Graph, Mapping[str, Any]], PassResult]


@dataclass(frozen=True)
class Pass:
    """A registered pass: its function, whether it runs by default, and its options."""

    name: str
    fn: PassFn
    doc: str
    default_on: bool = True
    options: Mapping[str, Any] = field(default_factory=dict)  # name -> default value


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
class PassStage:
    """The program after one pass (or "lowered" before any) and what that pass changed."""

    name: str
    program: DistProgram
    summary: dict[str, Any]


def run_passes(program: DistProgram, training: Graph, config: Any) -> list[PassStage]:
    """Stage "lowered" followed by one stage per pass that ran, in order."""
    stages = [PassStage("lowered", program, {"message": "as lowered", "ops": len(program.ops)})]
    for p, options in resolve_passes(config):
        result = p.fn(stages[-1].program, training, options)
        summary = {"ops_before": len(stages[-1].program.ops), "ops_after": len(result.program.ops)}
        stages.append(PassStage(p.name, result.program, {**summary, **result.summary}))
    return stages
