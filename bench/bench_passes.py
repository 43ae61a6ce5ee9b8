"""Predicted step time of llama3-8b on h100-sxm-8x8 after each optimization pass.

Each row is one pass stage of one plan (`Plan.stages`): the cost model's step time, tokens/s
and exposed communication after that pass, and the change against the stage before. Seed 002
(Paddle's data-parallel optimization pass) and seed 001 (pipeline send/wait, measured +0.22%
to +2.1% tokens/s on 4 V100s with GPT-2) are the references.
"""

from __future__ import annotations

import time

from bench.common import Section
from shardlab.models import build_model
from shardlab.plan import Plan, build_plan
from shardlab.strategy import Strategy

CLUSTER = "h100-sxm-8x8"
PLANS = {
    "dp=64 (pure data parallel, ZeRO-1)": ("dp=64", ["dp", "zero1"], {"batch": 64}),
    "dp=8,tp=8 (dp + megatron_tp + sequence_parallel)": (
        "dp=8,tp=8",
        ["dp", "megatron_tp", "sequence_parallel"],
        {},
    ),
    "dp=64 (pure data parallel)": ("dp=64", ["dp"], {"batch": 64}),
}


def _rows(label: str, plan: Plan) -> list[list[str]]:
    rows = []
    previous: float | None = None
    for stage in plan.stages:
        cost = stage.cost
        assert cost is not None
        t = cost.step_time
        delta = "" if previous is None else f"{(t - previous) / previous:+.2%}"
        gain = "" if previous is None else f"{previous / t - 1:+.2%}"
        message = str(stage.summary.get("message", ""))
        rows.append(
            [
                label if previous is None else "",
                stage.name,
                f"{t * 1e3:.1f} ms",
                delta,
                gain,
                f"{cost.tokens_per_second:,.0f}",
                f"{cost.timeline.exposed_comm(0) * 1e3:.1f} ms",
                f"{cost.mfu:.1%}",
                message,
            ]
        )
        previous = t
    return rows


def run() -> Section:
    section = Section(
        f"Optimization passes (llama3-8b, 32 layers, bf16, predicted on {CLUSTER})",
        ["plan", "after pass", "step time", "Δ step", "Δ tokens/s", "tokens/s", "exposed comm",
         "MFU", "what changed"],
    )  # fmt: skip
    started = time.perf_counter()
    for label, (mesh, templates, overrides) in PLANS.items():
        plan = build_plan(
            build_model("llama3-8b", overrides), Strategy.build(mesh, templates), cluster=CLUSTER
        )
        section.rows += _rows(label, plan)
    section.notes.append(
        "Predicted by the cost model (roofline compute, ring/hierarchical collectives, timeline "
        "with compute/comm overlap), not measured. Seed 001 measured +0.22% (fp32) and +1.52% "
        "(fp16) tokens/s over NVLink, +0.3% / +2.1% over SHM, for its pipeline send/wait "
        "optimization on 4 V100s with GPT-2. Pipeline schedules and send/wait: next "
        f"section. Building and costing all stages took {time.perf_counter() - started:.1f} s."
    )
    return section
