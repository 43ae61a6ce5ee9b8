"""`shardlab plan` on a mesh with a `pp` axis: the pipelined plan, its schedule and cost.

The pipeline is built from the graph of ONE micro-batch, so the model must be a preset (it is
rebuilt with `batch / microbatches`). The data-parallel passes run on every stage program
(as configured with --pass/--no-pass), then the send/wait pass (seed 001) unless turned off
with `--no-pass pipeline_send_wait`; with a cluster, the step time is predicted before and
after it.
"""

from __future__ import annotations

from typing import Any

from shardlab.autodiff import training_graph
from shardlab.cost.clusters import load_cluster
from shardlab.cost.pipeline_cost import cost_pipeline
from shardlab.errors import PresetError
from shardlab.ir import Graph
from shardlab.models import PRESETS, build_model
from shardlab.passes.pipeline import build_pipeline
from shardlab.passes.pipeline_passes import stage_pass_steps
from shardlab.passes.send_wait import pipeline_send_wait, with_send_waits
from shardlab.strategy import Strategy

SEND_WAIT = "pipeline_send_wait"


def micro_model(model: str, overrides: dict[str, Any], full: Graph, microbatches: int) -> Graph:
    """The forward graph of one micro-batch: the preset rebuilt with batch / microbatches."""
    batch = int(full.meta.get("config", {}).get("batch", 0))
    if model not in PRESETS or not batch:
        raise PresetError(
            f"a pipeline (mesh axis 'pp') needs a preset model with a batch setting, got {model!r}",
            model=model,
        )
    if microbatches < 1 or batch % microbatches:
        raise PresetError(
            f"batch {batch} does not split into {microbatches} micro-batches; use --set "
            "batch=... or --microbatches ...",
            batch=batch,
            microbatches=microbatches,
        )
    return build_model(model, {**overrides, "batch": batch // microbatches})


def pipeline_summary(
    micro: Graph,
    strategy: Strategy,
    *,
    microbatches: int,
    schedule: str,
    virtual_stages: int | None,
    send_wait: bool,
    cluster: str | None,
) -> dict[str, Any]:
    """Build the pipeline, run the send/wait pass, and cost both when a cluster is given."""
    pipeline = build_pipeline(
        micro,
        strategy,
        microbatches=microbatches,
        schedule=schedule,
        virtual_stages=virtual_stages,
    )
    training = training_graph(micro)
    config = {k: v for k, v in (strategy.options.get("passes") or {}).items() if k != SEND_WAIT}
    built = {"pass": "lowered", "message": "as built (a wait after each forward send)"}
    steps = [(pipeline, built), *stage_pass_steps(pipeline, training, config)]
    steps = [(with_send_waits(program), summary) for program, summary in steps]
    baseline = steps[-1][0]
    final, changes = pipeline_send_wait(baseline) if send_wait else (baseline, None)
    passes = [{"name": s["pass"], "message": s["message"]} for _, s in steps]
    if changes is not None:
        steps.append((final, {"pass": SEND_WAIT, **changes.to_json()}))
        passes.append({"name": SEND_WAIT, **changes.to_json()})
    out: dict[str, Any] = {
        "model": micro.name,
        "mesh": str(strategy.mesh),
        "strategy": strategy.describe(),
        "pipeline": final.summary(),
        "passes": passes,
    }
    if cluster is not None:
        c = load_cluster(cluster)
        for entry, (program, _) in zip(passes, steps, strict=True):
            entry["step_time_s"] = cost_pipeline(program, training, c).step_time
        out["cost"] = cost_pipeline(final, training, c).summary()
        out["cost_before_send_wait"] = cost_pipeline(baseline, training, c).summary()
    return out


def pipeline_text(s: dict[str, Any]) -> str:
    """The pipeline summary as lines a reviewer reads top to bottom."""
    p = s["pipeline"]
    lines = [
        f"{s['model']} on {s['mesh']}: {p['schedule']} pipeline, {p['pp']} stages, "
        f"{p['microbatches']} micro-batches (bubble estimate {p['bubble_fraction']:.1%})"
    ]
    for st in p["stages"]:
        lines.append(
            f"  stage {st['stage']}: layers {st['layers']}, {st['ops']} ops, "
            f"{st['sends']} sends, {st['recvs']} recvs, ranks {st['ranks']}"
        )
    for change in s["passes"]:
        step = f" -> step {change['step_time_s'] * 1e3:.1f} ms" if "step_time_s" in change else ""
        lines.append(f"pass {change['name']}: {change['message']}{step}")
    if "cost" in s:
        before, after = s["cost_before_send_wait"], s["cost"]
        gain = before["step_time_s"] / after["step_time_s"] - 1
        lines.append(
            f"on {after['cluster']}: step {after['step_time_s'] * 1e3:.1f} ms "
            f"(with send waits {before['step_time_s'] * 1e3:.1f} ms, {gain:+.2%} tokens/s), "
            f"MFU {after['mfu']:.1%}, {after['tokens_per_s']:,.0f} tokens/s, "
            f"bubble {after['bubble_fraction']:.1%}"
        )
    return "\n".join(lines)
