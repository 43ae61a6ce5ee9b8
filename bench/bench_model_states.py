"""Model states per rank against the recipes' own accounting, at every data-parallel size.

llama3-8b (2 layers) and llama3-70b (4 layers) at dp 4, 6, 12 and 48 (6, 12 and 48 divide
no dim of their weights), tp 1, 2 and 8, without and with two pipeline stages (Megatron's
even layer split), under three recipes; each plan's parameters, gradients and optimizer
state per rank (the fullest pipeline stage) against the recipe's bytes per parameter
(`shardlab.recipes.model_state_bytes_per_param`, formulas from the papers, not from the
planner):

- Megatron-LM, no distributed optimizer (`dp` + `megatron_tp`): 2 + 4 + 12 = 18 bytes a
  parameter over tp x pp;
- Megatron-LM's distributed optimizer (`dp` + `zero1` + `megatron_tp`): 2 + 4 + 12/d;
- FSDP2 (`fsdp` + `megatron_tp`, torchtitan's 2D): (2 + 4 + 12)/d, bf16 gathers.

The run fails (assertion) when any plan is more than `TOLERANCE` off.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from bench.common import Section
from shardlab.cost.clusters import load_cluster
from shardlab.cost.memory import MODEL_STATE, memory_profile
from shardlab.models import build_model
from shardlab.plan import Plan, build_plan
from shardlab.recipes import model_state_bytes_per_param
from shardlab.strategy import Strategy

MODELS = (("llama3-8b", 2), ("llama3-70b", 4))
DPS, TPS, PPS = (4, 6, 12, 48), (1, 2, 8), (1, 2)
#: recipe -> (its templates besides megatron_tp, the recipe's name in `shardlab.recipes`)
RECIPES = {
    "Megatron": (["dp"], "megatron"),
    "Megatron, distributed optimizer": (["dp", "zero1"], "distributed_optimizer"),
    "FSDP2": (["fsdp"], "fsdp2"),
}
#: the most a plan's model states per rank may differ from the recipe's (relative)
TOLERANCE = 0.02
#: a cluster with room for the largest mesh (48 x 8 x 2 = 768 GPUs): pipelines are costed
CLUSTER = "h100-sxm-96x8"


@dataclass(frozen=True, slots=True)
class Case:
    model: str
    layers: int
    recipe: str
    dp: int
    tp: int
    pp: int

    @property
    def mesh(self) -> str:
        axes = [f"pp={self.pp}" if self.pp > 1 else "", f"dp={self.dp}"]
        return ",".join(a for a in [*axes, f"tp={self.tp}" if self.tp > 1 else ""] if a)


def cases() -> list[Case]:
    return [Case(m, layers, recipe, dp, tp, pp) for m, layers in MODELS for recipe in RECIPES
            for dp in DPS for tp in TPS for pp in PPS]  # fmt: skip


def plan_of(case: Case) -> Plan:
    """The case's plan: the batch one sample per data-parallel rank and micro-batch."""
    graph = build_model(case.model, {"layers": case.layers, "batch": case.dp * case.pp})
    templates = [*RECIPES[case.recipe][0], *(["megatron_tp"] if case.tp > 1 else [])]
    options = {"pipeline": {"microbatches": case.pp, "balance": "even"}} if case.pp > 1 else {}
    strategy = Strategy.build(case.mesh, templates, [], options)
    cluster = load_cluster(CLUSTER) if case.pp > 1 else None  # a pipeline's stages are costed
    return build_plan(graph, strategy, cluster=cluster, passes=False)


def model_states(plan: Plan) -> dict[str, int]:
    """Parameters, gradients and optimizer state per rank, in bytes (the fullest stage's)."""
    if plan.pipeline is not None:
        assert plan.pipeline.cost is not None
        stages = [s.memory.model_state for s in plan.pipeline.cost.stages]
        return max(stages, key=lambda state: sum(state.values()))
    return memory_profile(plan.program, plan.training).model_state


def expected(case: Case, params: int) -> dict[str, float]:
    """The recipe's bytes per rank: its bytes per parameter over tp x pp (x dp for FSDP2)."""
    per_param = model_state_bytes_per_param(case.dp, RECIPES[case.recipe][1])
    return {k: v * params / (case.tp * case.pp) for k, v in per_param.items()}


def measure() -> list[dict[str, Any]]:
    """Every case: the plan's model states per rank, the recipe's, the relative error."""
    rows = []
    for case in cases():
        start = time.perf_counter()
        plan = plan_of(case)
        got = model_states(plan)
        want = expected(case, plan.model.num_params())
        total, wanted = sum(got.values()), sum(want.values())
        rows.append({
            "case": case,
            "got": got,
            "want": want,
            "error": total / wanted - 1.0,
            "worst": max(abs(got[k] / want[k] - 1.0) for k in MODEL_STATE if want[k]),
            "seconds": time.perf_counter() - start,
        })  # fmt: skip
    return rows


def run() -> Section:
    rows = measure()
    worst = max(rows, key=lambda r: r["worst"])
    out = Section(
        "Model states per rank against the recipes (any data-parallel size)",
        ["model", "recipe", "mesh", "params GiB", "grads GiB", "optimizer GiB", "total GiB",
         "recipe GiB", "error"],
    )  # fmt: skip
    for r in rows:
        c, got = r["case"], r["got"]
        out.rows.append([
            c.model, c.recipe, c.mesh, *(f"{got[k] / 2**30:.3f}" for k in MODEL_STATE),
            f"{sum(got.values()) / 2**30:.3f}", f"{sum(r['want'].values()) / 2**30:.3f}",
            f"{r['error']:+.2%}",
        ])  # fmt: skip
    c = worst["case"]
    out.notes += [
        "llama3-8b (2 layers) and llama3-70b (4 layers), each plan's parameters, gradients "
        "and optimizer state per rank (the fullest pipeline stage; pipelines split layers "
        "evenly, as Megatron-LM does) against the recipe's bytes per parameter over tp x pp "
        "(`shardlab.recipes.model_state_bytes_per_param`: Megatron 18, the distributed "
        "optimizer 6 + 12/d, FSDP2 18/d). dp 6, 12 and 48 divide no dim of the weights.",
        f"{len(rows)} plans; the largest error of any category: {worst['worst']:.2%} "
        f"({c.model}, {c.recipe}, {c.mesh}); {sum(r['seconds'] for r in rows):.1f} s to plan "
        "them all. `python -m bench.bench_model_states` prints this table.",
    ]
    assert worst["worst"] <= TOLERANCE, (c, worst["got"], worst["want"])
    return out


if __name__ == "__main__":
    print(run().markdown())
