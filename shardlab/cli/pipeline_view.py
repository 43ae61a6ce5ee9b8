"""`shardlab plan` on a mesh with a `pp` axis: the pipelined plan, its schedule and cost.

The pipeline is built from the graph of ONE micro-batch, so the model must be a preset (it is
rebuilt with `batch / microbatches`). The data-parallel passes run on every stage program
(as configured with --pass/--no-pass), then the send/wait pass (seed 001) unless turned off
with `--no-pass pipeline_send_wait`; with a cluster, the step time is predicted after every
pass, and every pass (send/wait included) runs under the cost guard (`passes.guard`): one
that would make the pipeline's step slower is declined, and says so. Each step is costed
once (with a wait after each forward send, the send/wait pass's baseline).
"""

from __future__ import annotations

from typing import Any

from shardlab.autodiff import training_graph
from shardlab.cost.clusters import load_cluster
from shardlab.cost.pipeline_cost import PipelineCost, cost_pipeline
from shardlab.ir import Graph
from shardlab.passes.guard import guard_pass, tuning_text
from shardlab.passes.pipeline import PipelineProgram, build_pipeline
from shardlab.passes.pipeline_passes import (
    guarded_stage_pass_steps,
    same_pipeline,
    stage_pass_steps,
)
from shardlab.passes.send_wait import pipeline_send_wait, with_send_waits
from shardlab.strategy import Strategy
from shardlab.summary import human

SEND_WAIT = "pipeline_send_wait"


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
    training = training_graph(micro, recompute=strategy.recompute)
    config = {k: v for k, v in (strategy.options.get("passes") or {}).items() if k != SEND_WAIT}
    if cluster is not None:
        return _costed_summary(micro, strategy, pipeline, training, config, send_wait, cluster)
    built = {"pass": "lowered", "message": "as built (a wait after each forward send)"}
    steps = [(pipeline, built), *stage_pass_steps(pipeline, training, config)]
    steps = [(with_send_waits(program), summary) for program, summary in steps]
    baseline = steps[-1][0]
    final, changes = pipeline_send_wait(baseline) if send_wait else (baseline, None)
    passes = [{"name": s["pass"], "message": s["message"]} for _, s in steps]
    if changes is not None:
        passes.append({"name": SEND_WAIT, **changes.to_json()})
    return _head(micro, strategy, final, passes)


def _head(
    micro: Graph, strategy: Strategy, final: PipelineProgram, passes: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "model": micro.name,
        "mesh": str(strategy.mesh),
        "strategy": strategy.describe(),
        "pipeline": final.summary(),
        "passes": passes,
    }


def _costed_summary(
    micro: Graph,
    strategy: Strategy,
    pipeline: PipelineProgram,
    training: Graph,
    config: dict[str, Any],
    send_wait: bool,
    cluster: str,
) -> dict[str, Any]:
    """`pipeline_summary` with a cluster: every pass under the cost guard, each step costed
    once (the data-parallel passes' steps with their send waits, as the send/wait baseline)."""
    c = load_cluster(cluster)

    def with_waits(p: PipelineProgram) -> PipelineCost:
        return cost_pipeline(with_send_waits(p), training, c)

    built_cost = with_waits(pipeline)
    steps = guarded_stage_pass_steps(pipeline, training, config, with_waits, built_cost)
    built = {"pass": "lowered", "message": "as built (a wait after each forward send)"}
    passes = [
        {"name": s["pass"], **_guard_fields(s), "message": s["message"], "step_time_s": k.step_time}
        for _, s, k in [(pipeline, built, built_cost), *steps]
    ]
    last, base_cost = (steps[-1][0], steps[-1][2]) if steps else (pipeline, built_cost)
    baseline = with_send_waits(last)
    final, final_cost = baseline, base_cost
    if send_wait:

        def apply(p: PipelineProgram, _: Any) -> tuple[PipelineProgram, dict[str, Any]]:
            optimized, changes = pipeline_send_wait(p)
            return optimized, changes.to_json()

        def plain(p: PipelineProgram) -> PipelineCost:
            return cost_pipeline(p, training, c)

        kept = guard_pass([{}], 0, baseline, base_cost, apply, plain, same_pipeline)
        final, final_cost = kept.program, kept.cost
        passes.append({"name": SEND_WAIT, **kept.summary, "step_time_s": final_cost.step_time})
    out = _head(micro, strategy, final, passes)
    out["cost"] = final_cost.summary()
    out["cost_before_send_wait"] = base_cost.summary()
    return out


def _guard_fields(summary: dict[str, Any]) -> dict[str, Any]:
    keys = ("declined", "declined_reason", "step_before_s", "step_after_s", "tuning")
    return {k: summary[k] for k in keys if k in summary}


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
        if "tuning" in change:
            lines.append(f"    tried {tuning_text(change['tuning'])}")
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


def pipelined_plan_lines(p: dict[str, Any]) -> list[str]:
    """The `pipeline` part of a plan's summary (slots of the schedule) as text lines."""
    if p.get("accumulation"):
        return _accumulation_lines(p)
    lines = [
        f"pipeline: {p['schedule']}, {p['pp']} stages, {p['microbatches']} micro-batches"
        + (f", {p['virtual_stages']} chunks per stage" if p["virtual_stages"] > 1 else "")
        + f", layers {p['balance']}-balanced"
    ]
    lines += _split_reason(p)
    if "step_time_s" in p:
        lines.append(
            f"  on {p['cluster']}: step {p['step_time_s'] * 1e3:.1f} ms, MFU {p['mfu']:.1%} "
            f"(HFU {p['hfu']:.1%}), {p['tokens_per_s']:,.0f} tokens/s; bubble "
            f"{p['bubble_fraction']:.1%} of the step as the schedule lays out these stages "
            f"(the textbook (p-1)/(vm+p-1), for equal stages: {p['bubble_formula']:.1%})"
        )
    if "peak_memory_bytes" in p:
        worst = max(p["stages"], key=lambda st: (st.get("memory") or {}).get("peak_bytes", 0))
        lines.append(
            f"  memory per rank: peak {human(p['peak_memory_bytes'], 'B')} (stage "
            f"{worst['stage']}) of {human(p['memory_capacity_bytes'], 'B')}"
            + ("" if p["fits"] else "  DOES NOT FIT")
        )
    for st in p["stages"]:
        line = f"  stage {st['stage']}: layers {_ranges(st['layers'])}"
        memory = st.get("memory")
        if memory is not None:
            fwd = "+".join(f"{t * 1e3:.1f}" for t in st["forward_s"])
            bwd = "+".join(f"{t * 1e3:.1f}" for t in st["backward_s"])
            states = sum(memory["model_state_bytes"].values())
            line += (
                f"; F {fwd} ms, B {bwd} ms, tail {st['tail_s'] * 1e3:.1f} ms; memory "
                f"{human(memory['peak_bytes'], 'B')} = states {human(states, 'B')} + "
                f"activations {human(memory['activations_bytes'], 'B')} "
                f"({_in_flight(memory['in_flight'])} in flight) + "
                f"temporaries {human(memory['temporaries_bytes'], 'B')}"
                + ("" if memory["fits"] else "  DOES NOT FIT")
            )
        lines.append(line)
    lines += _tied_lines(p)
    return lines


def _accumulation_lines(p: dict[str, Any]) -> list[str]:
    """Gradient accumulation (a schedule of one stage) as text lines: micro-batches, step,
    and the memory of one micro-batch in flight."""
    lines = [f"gradient accumulation: {p['microbatches']} micro-batches one after another, "
             "then one optimizer step"]  # fmt: skip
    if "step_time_s" in p:
        lines.append(
            f"  on {p['cluster']}: step {p['step_time_s'] * 1e3:.1f} ms, MFU {p['mfu']:.1%} "
            f"(HFU {p['hfu']:.1%}), {p['tokens_per_s']:,.0f} tokens/s"
        )
    (st,) = p["stages"]
    memory = st.get("memory")
    if memory is not None:
        states = sum(memory["model_state_bytes"].values())
        lines.append(
            f"  per micro-batch: F {st['forward_s'][0] * 1e3:.1f} ms, B "
            f"{st['backward_s'][0] * 1e3:.1f} ms; then {st['tail_s'] * 1e3:.1f} ms of gradient "
            "reductions the backwards did not hide (every micro-batch's under FSDP and "
            "ZeRO-2/3, else the last's) and the optimizer"
        )
        lines.append(
            f"  memory per rank: peak {human(memory['peak_bytes'], 'B')} of "
            f"{human(p['memory_capacity_bytes'], 'B')} = states {human(states, 'B')} + "
            f"activations {human(memory['activations_bytes'], 'B')} (one micro-batch) + "
            f"temporaries {human(memory['temporaries_bytes'], 'B')}"
            + ("" if p["fits"] else "  DOES NOT FIT")
        )
    return lines


def _tied_lines(p: dict[str, Any]) -> list[str]:
    """One line per tied weight: the all-reduce of its gradient between the stages holding
    it (with its size and time when costed), and why it is there."""
    costed = {t["param"]: t for t in p.get("tied_all_reduces", [])}
    lines = []
    for tied in p.get("tied_weights", []):
        line = f"  {tied['reason']}"
        reduce = costed.get(tied["param"])
        if reduce is not None:
            line += (
                f"; {human(reduce['bytes'], 'B')} per rank, {reduce['seconds'] * 1e3:.2f} ms, "
                f"before the optimizer"
            )
        lines.append(line)
    return lines


def _in_flight(counts: list[int]) -> str:
    """`[1]` -> `1 micro-batch`, `[2, 1]` -> `2+1 micro-batches` (per chunk)."""
    total = "+".join(str(n) for n in counts)
    return f"{total} micro-batch" + ("" if counts == [1] else "es")


def _split_reason(p: dict[str, Any]) -> list[str]:
    """Why the stages hold different numbers of layers: the first also runs the embedding,
    the last the head and loss, and the split balances FLOPs (or time), not layer counts."""
    counts = [len(st["layers"]) for st in p["stages"]]
    if len(set(counts)) <= 1 or p["balance"] == "even":
        return []
    line = (
        f"  split {' / '.join(str(n) for n in counts)} layers: stage 0 also runs the embedding "
        f"and stage {len(counts) - 1} the head and loss, and the split balances "
        f"{'FLOPs' if p['balance'] == 'flops' else 'predicted time'}, not layer counts"
    )
    if all("forward_s" in st for st in p["stages"]):
        work = [sum(st["forward_s"]) + sum(st["backward_s"]) for st in p["stages"]]
        line += f" (F+B per micro-batch: {', '.join(f'{t * 1e3:.1f}' for t in work)} ms)"
    return [line]


def _ranges(layers: list[int]) -> str:
    """`[0, 1, 2, 5]` -> `0-2, 5`."""
    parts: list[str] = []
    for layer in layers:
        if parts and "-" not in parts[-1] and int(parts[-1]) == layer - 1:
            parts[-1] = f"{parts[-1]}-{layer}"
        elif parts and "-" in parts[-1] and int(parts[-1].split("-")[1]) == layer - 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{layer}"
        else:
            parts.append(str(layer))
    return ", ".join(parts)
