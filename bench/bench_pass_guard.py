"""The cost guard on the demo plans: each pass's predicted Δ step, which were declined, the
bucket size chosen by cost, and what the guard costs in planning time.

Plans `backend.demo.DEMO_PLANS` (llama3-8b-tiny dp2-tp2 on h100-sxm-1x4, llama3-8b dp8-tp8
with sequence parallelism and fsdp64 on h100-sxm-8x8) at full size with a cluster, so every
pass runs under the guard (`shardlab.passes.guard`), and asserts that no pass makes the
predicted step slower (Δ step <= 0). `python -m bench.bench_pass_guard` prints the table.
"""

from __future__ import annotations

import time

from backend.demo import DEMO_MODELS, DEMO_PLANS, DEMO_STRATEGIES
from bench.common import Section
from shardlab.cost.model import cost_program
from shardlab.models import build_model
from shardlab.passes.guard import tuning_text
from shardlab.plan import Plan, build_plan
from shardlab.strategy import Strategy

HEADER = ["plan", "after pass", "step time", "Δ step", "kept", "exposed comm", "what changed"]


def demo_plans() -> list[tuple[str, Plan, float]]:
    """Each demo plan built and costed, with the wall seconds it took."""
    models = {m.name: m for m in DEMO_MODELS}
    strategies = {s.name: s for s in DEMO_STRATEGIES}
    out = []
    for demo in DEMO_PLANS:
        model, strategy = models[demo.model], strategies[demo.strategy]
        graph = build_model(model.preset, model.overrides)
        started = time.perf_counter()
        plan = build_plan(
            graph, Strategy.build(strategy.mesh, list(strategy.templates)), cluster=demo.cluster
        )
        label = f"{demo.model} {demo.strategy} on {demo.cluster}"
        out.append((label, plan, time.perf_counter() - started))
    return out


def check_and_rows(label: str, plan: Plan) -> list[list[str]]:
    """The table rows of one plan; asserts every pass's Δ step <= 0."""
    rows = []
    previous = None
    for stage in plan.stages:
        cost = stage.cost
        assert cost is not None
        step = cost.step_time
        delta = "" if previous is None else f"{(step - previous) * 1e3:+.3f} ms"
        if previous is not None:
            assert step <= previous, f"{label}: {stage.name} made the step slower: {delta}"
        declined = stage.summary.get("declined")
        kept = "" if declined is None else ("declined" if declined else "kept")
        what = str(stage.summary.get("message", ""))
        if "tuning" in stage.summary:
            what += f" [tried {tuning_text(stage.summary['tuning'])}]"
        rows.append(
            [
                label if previous is None else "",
                stage.name,
                _ms(step),
                delta,
                kept,
                _ms(cost.timeline.exposed_comm(0)),
                what.replace("|", "/"),
            ]
        )
        previous = step
    return rows


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.1f} ms" if ms >= 100 else f"{ms:.4g} ms"


def run() -> Section:
    section = Section("Cost guard on the demo plans (predicted; full size)", HEADER)
    timings = []
    for label, plan, seconds in demo_plans():
        section.rows += check_and_rows(label, plan)
        assert plan.cost is not None
        started = time.perf_counter()
        cost_program(plan.program, plan.training, plan.cost.cluster)
        one = time.perf_counter() - started
        timings.append(f"{label}: planned in {seconds:.1f} s (one costing: {one:.2f} s)")
    section.notes.append(
        "Every pass runs under the cost guard: it keeps its change only where the predicted "
        "step does not get worse (Δ step <= 0, asserted here), else its stage keeps the "
        "program before it and says why; `bucket_mb` of dp_fuse_allreduce is chosen by cost "
        "(a descent over 1, 4, 16, 25, 64, 256 MiB and one bucket per group, from 25 MiB). "
        + "; ".join(timings)
        + "."
    )
    return section


if __name__ == "__main__":
    print(run().markdown())
