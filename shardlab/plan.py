"""The pipeline: a model and a strategy -> a `Plan` (training graph, placements, program).

    training_graph -> complete -> lower -> passes -> cost (when a cluster is given)

`build_plan(model, strategy, cluster=...)` runs it; the module itself is callable, so
`shardlab.plan(model, strategy)` reads the way people say it. `Plan.summary()` answers the
first questions a reviewer asks: which collectives, how many bytes, why, which ops fell back,
and, with a cluster, step time, MFU, tokens/s and memory per rank. With a cluster every pass
runs under the cost guard (`passes.guard`): a pass that would make the predicted step slower
is declined (its stage keeps the previous program; `declined`, `declined_reason`,
`step_before_s`, `step_after_s` in its summary), and each stage is costed once. A plan
saves as JSON (`Plan.to_json`, `save_plan`) holding its inputs and summary; `load_plan`
rebuilds it (the pipeline is deterministic), which is how two saved plans are compared.
"""

from __future__ import annotations

import functools
import json
import sys
import types
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from shardlab.autodiff import training_graph_of
from shardlab.cost.clusters import Cluster, cluster_from_dict, load_cluster
from shardlab.cost.compute import OpTimeMemo
from shardlab.cost.model import PlanCost, cost_program
from shardlab.cost.pipeline_slots import PipelineSlotCost
from shardlab.errors import ShardlabError
from shardlab.graph_json import graph_from_json, graph_to_json
from shardlab.ir import Graph
from shardlab.lower import lower
from shardlab.passes.manager import PASSES, run_passes
from shardlab.plan_pipeline import PipelineReport, build_pipelined
from shardlab.program import DistProgram
from shardlab.spmd.complete import CompletedGraph, complete
from shardlab.strategy import Strategy

#: How many distinct reasons `Plan.summary()` lists per collective kind.
TOP_REASONS = 5
PLAN_FORMAT = "shardlab.plan/1"


class PlanFileError(ShardlabError):
    """A saved plan file is unreadable or not a plan."""

    code = "invalid_plan_file"


@dataclass
class PlanStage:
    """The program after one pass ("lowered" before any), what changed, and its cost."""

    name: str
    program: DistProgram
    summary: dict[str, Any]
    cost: PlanCost | PipelineSlotCost | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, **self.summary}
        if self.cost is not None:
            out["step_time_s"] = self.cost.step_time
            out["peak_memory_bytes"] = self.cost.peak_memory_bytes
        return out

    def as_plan(self, plan: Plan) -> Plan:
        """`plan` as it was at this stage (for `compare` and `verify`)."""
        if isinstance(self.cost, PipelineSlotCost) and plan.pipeline is not None:
            pipeline = replace(plan.pipeline, cost=self.cost)
            return replace(plan, program=self.program, cost=None, pipeline=pipeline, stages=[])
        flat = self.cost if isinstance(self.cost, PlanCost) else None
        return replace(plan, program=self.program, cost=flat, stages=[])


@dataclass
class Plan:
    """Everything the pipeline produced for one model under one strategy."""

    model: Graph  # the forward graph as the user gave it
    strategy: Strategy
    training: Graph  # forward + loss + backward + optimizer
    completed: CompletedGraph
    program: DistProgram
    optimizer: str
    lr: float = 1e-3
    cost: PlanCost | None = None
    #: the program after lowering and after each pass, with its cost when costed
    stages: list[PlanStage] = field(default_factory=list)
    #: a mesh with a `pp` axis, or gradient accumulation: the stages and the pipelined step
    #: (then `program` and `training` are one micro-batch's, and `cost` is None)
    pipeline: PipelineReport | None = None

    def collectives_by_kind(self) -> dict[str, dict[str, Any]]:
        """Per comm kind: count, bytes per rank, and the most common reasons.

        A reason groups comm ops by what they did and who asked: `P(sum) -> R for adamw`.
        """
        out: dict[str, dict[str, Any]] = {}
        reasons: dict[str, Counter[str]] = {}
        for op in self.program.ops:
            if op.comm is None:
                continue
            entry = out.setdefault(op.kind, {"count": 0, "bytes_per_rank": 0.0})
            entry["count"] += 1
            entry["bytes_per_rank"] += op.comm.bytes_per_rank
            why = f"{op.attrs['from']} -> {op.attrs['to']} for {op.attrs['consumer']}"
            reasons.setdefault(op.kind, Counter())[why] += 1
        for kind, entry in out.items():
            entry["reasons"] = [
                {"reason": why, "count": n} for why, n in reasons[kind].most_common(TOP_REASONS)
            ]
        return dict(sorted(out.items()))

    def ops_by_role(self) -> dict[str, int]:
        """Program ops per role (forward, backward, loss, optimizer, comm)."""
        roles = Counter(op.role.value for op in self.program.ops)
        return dict(sorted(roles.items()))

    def summary(self) -> dict[str, Any]:
        """The plan's headline figures, JSON-ready."""
        return {
            "model": self.model.name,
            "mesh": str(self.strategy.mesh),
            "strategy": self.strategy.describe(),
            "optimizer": self.optimizer,
            "training_ops": len(self.training.ops),
            "program_ops": len(self.program.ops),
            "ops_by_role": self.ops_by_role(),
            "collectives": self.collectives_by_kind(),
            "comm_bytes_per_rank": self.program.comm_bytes_per_rank(),
            "fallback_ops": self.completed.fallback_ops(),
            "repetition": self.completed.repetition(),
            "unmatched_template_patterns": sorted({a.pattern for a in self.completed.unmatched}),
            "notes": self.completed.notes(),
            "passes": [stage.to_json() for stage in self.stages[1:]],
            **({"cost": self.cost.summary()} if self.cost else {}),
            **({"pipeline": self.pipeline.summary()} if self.pipeline else {}),
        }

    def _cluster_json(self) -> dict[str, Any] | None:
        """The cluster the plan was costed on (a flat plan's, or its schedule's), or None."""
        cost = self.cost or (self.pipeline.cost if self.pipeline is not None else None)
        return cost.cluster.to_json() if cost is not None else None

    def to_json(self) -> dict[str, Any]:
        """The plan's inputs (model, strategy, optimizer, cluster) and its summary."""
        return {
            "format": PLAN_FORMAT,
            "model": graph_to_json(self.model),
            "strategy": self.strategy.to_json(),
            "optimizer": self.optimizer,
            "lr": self.lr,
            "cluster": self._cluster_json(),
            "summary": self.summary(),
        }


#: a progress callback: (fraction done in 0..1, what runs now)
Progress = Callable[[float, str], None]


def _silent(fraction: float, message: str) -> None:
    """The progress callback of a build nobody watches."""


def build_plan(
    model: Graph | str,
    strategy: Strategy,
    *,
    optimizer: str = "adamw",
    lr: float = 1e-3,
    cluster: Cluster | str | None = None,
    passes: bool = True,
    progress: Progress | None = None,
    fold: bool = True,
) -> Plan:
    """Run the pipeline for `model` (a Graph, or a preset name) under `strategy`; with a
    `cluster` (a Cluster, a preset name or a cluster file) the plan is costed too.
    `passes=False` stops after lowering (the passes' own tests start from there).
    `progress(fraction, message)` hears of every step (the worker's job progress).
    `fold=False` completes every repeated layer for real instead of once per distinct
    layer (`spmd.folding`; the plan is the same, tests compare them)."""
    report = progress or _silent
    if isinstance(model, str):
        from shardlab.models import build_model

        model = build_model(model)
    if isinstance(cluster, str):
        cluster = load_cluster(cluster)
    if strategy.pipelined:  # a pp axis, or gradient accumulation (a pipeline of one stage)
        built = build_pipelined(
            model, strategy.schedule_strategy(), optimizer=optimizer, lr=lr, cluster=cluster,
            passes=passes, report=report, fold=fold,
        )  # fmt: skip
        built.report.accumulation = strategy.accumulation > 1
        stages = [
            PlanStage(name, prog, summary, cost) for name, prog, summary, cost in built.stages
        ]
        return Plan(model, strategy, built.training, built.completed, stages[-1].program,
                    optimizer, lr, None, stages, built.report)  # fmt: skip
    report(0.0, "training graph")
    training = training_graph_of(model, optimizer, lr, strategy.recompute)
    report(0.1, "completion")
    completed = complete(training, strategy, fold)
    report(0.4, "lowering")
    program = lower(completed)
    config = strategy.options.get("passes") if passes else dict.fromkeys(PASSES, False)

    costing: Callable[[DistProgram], PlanCost] | None = None
    if cluster is not None:
        report(0.5, "cost as lowered")
        memo: OpTimeMemo = {}  # the stages share most ops: each is priced once
        costing = functools.partial(cost_program, training=training, cluster=cluster, memo=memo)

    def on_pass(n: int, total: int, name: str) -> None:
        report(0.5 + 0.5 * n / total, f"pass {name}" + (" and its cost" if costing else ""))

    raw = run_passes(program, training, config, on_pass, costing)
    stages = [PlanStage(s.name, s.program, s.summary, s.cost) for s in raw]
    return Plan(
        model, strategy, training, completed, raw[-1].program, optimizer, lr, raw[-1].cost, stages
    )


def save_plan(plan: Plan, path: str | Path) -> Path:
    """Write `plan.to_json()` to `path`."""
    out = Path(path)
    out.write_text(json.dumps(plan.to_json(), indent=1))
    return out


def load_plan(path: str | Path) -> Plan:
    """Rebuild a saved plan from its inputs (errors name the file and the field)."""
    where = f"plan file '{path}'"
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise PlanFileError(f"{where}: cannot read it ({exc.strerror})", path=str(path)) from None
    except json.JSONDecodeError as exc:
        raise PlanFileError(
            f"{where}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}",
            path=str(path),
            line=exc.lineno,
        ) from None
    if not isinstance(data, dict) or data.get("format") != PLAN_FORMAT:
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise PlanFileError(f"{where}: format must be {PLAN_FORMAT!r}, got {got!r}", path=str(path))
    for key in ("model", "strategy", "optimizer"):
        if key not in data:
            raise PlanFileError(f"{where}: missing field {key!r}", path=str(path), field=key)
    cluster = cluster_from_dict(data["cluster"]) if data.get("cluster") else None
    return build_plan(
        graph_from_json(data["model"]),
        Strategy.from_json(data["strategy"]),
        optimizer=data["optimizer"],
        lr=float(data.get("lr", 1e-3)),
        cluster=cluster,
    )


class _CallablePlanModule(types.ModuleType):
    """Lets `shardlab.plan(model, strategy)` call `build_plan` while `shardlab.plan` stays the
    module that holds it (importing a submodule binds its name on the package)."""

    def __call__(self, model: Graph | str, strategy: Strategy, **options: Any) -> Plan:
        return build_plan(model, strategy, **options)


sys.modules[__name__].__class__ = _CallablePlanModule
