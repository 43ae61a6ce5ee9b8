"""Verification: one training step of a plan on the simulated mesh against one device.

Builds the plan (training graph, completion, lowering) unless given one, runs it on the
simulated mesh from the same seeded sources as the single-device reference, and compares the
loss, every gradient and every updated parameter with dtype-aware tolerances. On a mismatch
it names the first serial op (in program order) whose output diverges: since every value is
compared, the first failing one in topological order is where the bisection lands.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardlab.errors import ExecutionError
from shardlab.ir import Graph, ValueKind
from shardlab.plan import Plan, build_plan
from shardlab.runtime.reference import check_compute_dtype, run_reference, source_values
from shardlab.runtime.simulated import global_view, run_simulated
from shardlab.strategy import Strategy

#: (rtol, atol) by compute dtype.
TOLERANCES = {"float64": (1e-10, 1e-10), "float32": (1e-5, 1e-5)}

#: Where the distributed side runs. "simulated": every rank in this process
#: (`runtime/simulated.py`, numpy). One process per rank (`runtime/torchdist.py`, gloo/nccl)
#: is not written yet.
BACKENDS = ("simulated",)


@dataclass(frozen=True, slots=True)
class TensorCheck:
    """Max abs / rel error of one compared tensor."""

    name: str
    kind: str  # loss | grad | param | activation
    max_abs: float
    max_rel: float
    ok: bool


@dataclass
class VerifyReport:
    """Outcome of a verification run."""

    ok: bool
    compute_dtype: str
    checks: list[TensorCheck]
    first_divergence: str | None = None
    summary: dict[str, Any] = field(default_factory=dict)

    def failed(self) -> list[TensorCheck]:
        return [c for c in self.checks if not c.ok]

    def to_json(self) -> dict[str, Any]:
        """The report as the service stores it and `shardlab.check` judges it."""
        return {
            "ok": self.ok,
            "compute_dtype": self.compute_dtype,
            "first_divergence": self.first_divergence,
            "summary": self.summary,
            "failed": len(self.failed()),
            "checks": [
                {"name": c.name, "kind": c.kind, "max_abs": c.max_abs, "max_rel": c.max_rel,
                 "ok": c.ok}
                for c in self.checks
            ],
        }  # fmt: skip


def _compare(name: str, kind: str, got: np.ndarray, want: np.ndarray, dtype: str) -> TensorCheck:
    rtol, atol = TOLERANCES[dtype]
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    max_abs = float(np.max(diff, initial=0.0))
    scale = np.maximum(np.abs(want.astype(np.float64)), 1e-30)
    max_rel = float(np.max(diff / scale, initial=0.0))
    ok = bool(np.all(diff <= atol + rtol * np.abs(want)))
    return TensorCheck(name, kind, max_abs, max_rel, ok)


def verify(
    graph: Graph | Plan,
    strategy: Strategy | None = None,
    *,
    optimizer: str = "adamw",
    lr: float = 1e-3,
    compute_dtype: str = "float64",
    seed: int = 0,
    backend: str = "simulated",
) -> VerifyReport:
    """Run one training step distributed and on one device; compare what matters.

    Pass a model graph and a strategy, or a `Plan` already built (then `optimizer` and `lr`
    are the plan's). `backend` is one of `BACKENDS`.
    """
    if backend not in BACKENDS:
        raise ExecutionError(
            f"unknown verification backend {backend!r}; available: {', '.join(BACKENDS)}",
            backend=backend,
        )
    check_compute_dtype(compute_dtype)
    if isinstance(graph, Plan):
        plan = graph
    elif strategy is None:
        raise TypeError("verify(graph, strategy): a strategy is needed with a graph")
    else:
        plan = build_plan(graph, strategy, optimizer=optimizer, lr=lr)
    tg, program = plan.training, plan.program
    env = run_reference(tg, seed=seed, compute_dtype=compute_dtype)
    blocks = run_simulated(program, {v.name: env[v.name] for v in source_values(tg)}, seed)
    checks: list[TensorCheck] = []
    first: str | None = None
    loss = str(tg.meta.get("loss", tg.outputs[0]))
    for op in tg.ops:
        for name in op.outputs:
            got = global_view(program, blocks, program.values[name])
            value = tg.value(name)
            kind = (
                "loss"
                if name == loss
                else "grad"
                if value.kind == ValueKind.GRAD
                else "param"
                if value.kind in (ValueKind.PARAM, ValueKind.STATE)
                else "activation"
            )
            check = _compare(name, kind, got, env[name], compute_dtype)
            if not check.ok and first is None:
                first = op.name
            if kind != "activation" or not check.ok:
                checks.append(check)
    ok = first is None
    summary = {
        "ops": len(tg.ops),
        "program_ops": len(program.ops),
        "collectives": program.summary()["collectives"],
        "compared": len(checks),
    }
    return VerifyReport(ok, compute_dtype, checks, first, summary)
