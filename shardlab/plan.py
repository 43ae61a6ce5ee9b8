"""The pipeline: a model and a strategy -> a `Plan` (training graph, placements, program).

    training_graph -> complete -> lower

`build_plan(model, strategy)` runs it; the module itself is callable, so `shardlab.plan(model,
strategy)` reads the way people say it. `Plan.summary()` answers the first questions a
reviewer asks: which collectives, how many bytes, why, and which ops fell back.
"""

from __future__ import annotations

import sys
import types
from collections import Counter
from dataclasses import dataclass
from typing import Any

from shardlab.autodiff import training_graph
from shardlab.ir import Graph
from shardlab.lower import lower
from shardlab.program import DistProgram
from shardlab.spmd.complete import CompletedGraph, complete
from shardlab.strategy import Strategy

#: How many distinct reasons `Plan.summary()` lists per collective kind.
TOP_REASONS = 5


@dataclass
class Plan:
    """Everything the pipeline produced for one model under one strategy."""

    model: Graph  # the forward graph as the user gave it
    strategy: Strategy
    training: Graph  # forward + loss + backward + optimizer
    completed: CompletedGraph
    program: DistProgram
    optimizer: str

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
            "unmatched_template_patterns": sorted({a.pattern for a in self.completed.unmatched}),
        }


def build_plan(
    model: Graph | str,
    strategy: Strategy,
    *,
    optimizer: str = "adamw",
    lr: float = 1e-3,
) -> Plan:
    """Run the pipeline for `model` (a Graph, or a preset name) under `strategy`."""
    if isinstance(model, str):
        from shardlab.models import build_model

        model = build_model(model)
    training = training_graph(model, optimizer=optimizer, lr=lr)
    completed = complete(training, strategy)
    return Plan(model, strategy, training, completed, lower(completed), optimizer)


class _CallablePlanModule(types.ModuleType):
    """Lets `shardlab.plan(model, strategy)` call `build_plan` while `shardlab.plan` stays the
    module that holds it (importing a submodule binds its name on the package)."""

    def __call__(self, model: Graph | str, strategy: Strategy, **options: Any) -> Plan:
        return build_plan(model, strategy, **options)


sys.modules[__name__].__class__ = _CallablePlanModule
