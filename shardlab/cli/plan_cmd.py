"""`shardlab plan`: build the training plan of a model under a strategy and summarise it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated, Any

import typer

from shardlab.check import figures
from shardlab.cli.common import (
    AnnotateOption,
    JsonFlag,
    MeshOption,
    RecomputeOption,
    SetOption,
    TemplateOption,
    app,
    build_strategy,
    fail,
    load_model,
)
from shardlab.cli.pipeline_view import (
    SEND_WAIT,
    pipeline_summary,
    pipeline_text,
    pipelined_plan_lines,
)
from shardlab.errors import ShardlabError
from shardlab.passes.guard import tuning_text
from shardlab.passes.manager import PASSES
from shardlab.strategy import Strategy, check_options
from shardlab.summary import human

#: Every pass `--pass` / `--no-pass` name: the program passes, then the pipeline's.
PASS_NAMES = (*PASSES, SEND_WAIT)


@app.command("plan")
def plan_cmd(
    model: str,
    mesh: MeshOption,
    template: TemplateOption = None,
    annotate: AnnotateOption = None,
    set_: SetOption = None,
    recompute: RecomputeOption = "none",
    optimizer: Annotated[str, typer.Option(help="adamw or sgd.")] = "adamw",
    cluster: Annotated[
        str | None,
        typer.Option(help="Cost the plan on a cluster preset (h100-sxm-8x8) or cluster file."),
    ] = None,
    trace: Annotated[
        Path | None, typer.Option(help="Write the timeline as a Chrome trace (needs --cluster).")
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Save the plan as JSON.")
    ] = None,
    pass_: Annotated[
        list[str] | None,
        typer.Option("--pass", help="Turn a pass on (repeatable); see --no-pass for names."),
    ] = None,
    no_pass: Annotated[
        list[str] | None,
        typer.Option(
            "--no-pass",
            help=f"Turn a pass off (repeatable): {', '.join(PASS_NAMES)}.",
        ),
    ] = None,
    bucket_mb: Annotated[
        float | None,
        typer.Option(
            help="Gradient all-reduce bucket size in MiB (default: chosen by cost with "
            "--cluster, else 25)."
        ),
    ] = None,
    schedule: Annotated[
        str,
        typer.Option(help="Pipeline schedule on a mesh with a pp axis: gpipe, 1f1b, interleaved."),
    ] = "1f1b",
    microbatches: Annotated[
        int | None, typer.Option(help="Pipeline micro-batches (default: one per stage).")
    ] = None,
    virtual_stages: Annotated[
        int | None, typer.Option(help="Model chunks per pipeline rank (interleaved).")
    ] = None,
    balance: Annotated[
        str,
        typer.Option(
            help="Layers per pipeline stage: flops or time (balanced by FLOPs or by the "
            "cost model's seconds) or even (Megatron-LM)."
        ),
    ] = "flops",
    detailed_pipeline: Annotated[
        bool,
        typer.Option(
            "--detailed-pipeline",
            help="Build every micro-batch's program per stage (send/wait pass, per-stage "
            "dp passes) instead of costing the schedule's slots from each stage's units.",
        ),
    ] = False,
    fail_if_oom: Annotated[
        bool,
        typer.Option(
            "--fail-if-oom",
            help="Exit 1 when the plan's peak memory per rank is over the cluster's (needs "
            "--cluster): a gate for scripts and CI.",
        ),
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Training graph, placements and the per-rank program after the optimization passes;
    prints collectives and why, what each pass changed, and with --cluster the step time,
    MFU, tokens/s and memory per rank (after every pass)."""
    from shardlab.cost.trace import write_chrome_trace
    from shardlab.plan import build_plan, save_plan
    from shardlab.rebatch import microbatch_model

    try:
        if trace is not None and cluster is None:
            raise ShardlabError("--trace needs --cluster: the timeline comes from the cost model")
        if fail_if_oom and cluster is None:
            raise ShardlabError("--fail-if-oom needs --cluster: memory is judged against its GPUs")
        if fail_if_oom and detailed_pipeline:
            raise ShardlabError("--fail-if-oom is not available with --detailed-pipeline")
        graph = load_model(model, set_)
        strategy = build_strategy(mesh, template, annotate, recompute)

        options = {"passes": pass_settings(pass_ or [], no_pass or [], bucket_mb)}
        strategy = dataclasses.replace(strategy, options={**strategy.options, **options})
        if not detailed_pipeline or "pp" not in strategy.mesh.axis_names:
            strategy = schedule_flags(strategy, schedule, microbatches, virtual_stages, balance)
        else:
            if output is not None or trace is not None:
                raise ShardlabError("-o and --trace are not available for pipelines yet")
            micro = microbatch_model(graph, microbatches or 4)
            summary = pipeline_summary(
                micro,
                strategy,
                microbatches=microbatches or 4,
                schedule=schedule,
                virtual_stages=virtual_stages,
                send_wait=options["passes"].get("pipeline_send_wait") is not False,
                cluster=cluster,
            )
            typer.echo(json.dumps(summary, indent=2) if as_json else pipeline_text(summary))
            return
        plan = build_plan(graph, strategy, optimizer=optimizer, cluster=cluster)
    except ShardlabError as exc:
        fail(exc)
    if trace is not None and plan.cost is None:
        fail(ShardlabError("--trace is not available for a pipelined plan yet"))
    if trace is not None and plan.cost is not None:
        write_chrome_trace(trace, plan.cost.timeline, plan.program)
    if output is not None:
        save_plan(plan, output)
    summary = plan.summary()
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
    else:
        typer.echo(_text(summary))
        if trace is not None:
            typer.echo(f"chrome trace: {trace} (open in https://ui.perfetto.dev)")
        if output is not None:
            typer.echo(f"plan saved: {output}")
    if fail_if_oom:
        cost = figures(summary)  # the flat plan's cost or the pipeline's
        peak, capacity = cost["peak_memory_bytes"], cost["memory_capacity_bytes"]
        if not cost["fits"]:
            typer.echo(f"FAIL (--fail-if-oom): peak memory per rank {human(peak, 'B')} does "
                       f"not fit in {human(capacity, 'B')}", err=True)  # fmt: skip
            raise typer.Exit(1)


@app.command("compare")
def compare_cmd(
    plan_a: Annotated[Path, typer.Argument(help="A plan saved with `shardlab plan -o`.")],
    plan_b: Annotated[Path, typer.Argument(help="The plan to compare against A.")],
    fail_if_slower: Annotated[
        float | None,
        typer.Option(
            "--fail-if-slower",
            metavar="PCT",
            help="Exit 1 when B's predicted step is more than PCT percent slower than A's "
            "(both saved with --cluster): a regression gate for scripts and CI.",
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Step time, memory, collectives, time per scope and placements of B against A."""
    from shardlab.comparison import compare
    from shardlab.plan import load_plan

    try:
        if fail_if_slower is not None and not fail_if_slower >= 0:
            raise ShardlabError(f"--fail-if-slower must be a percentage >= 0, got {fail_if_slower}")
        a, b = load_plan(plan_a), load_plan(plan_b)
        if fail_if_slower is not None and (a.cost is None or b.cost is None):
            unpriced = plan_a if a.cost is None else plan_b
            raise ShardlabError(f"--fail-if-slower needs both plans costed: {unpriced} was "
                                "saved without --cluster")  # fmt: skip
    except ShardlabError as exc:
        fail(exc)
    result = compare(a, b, str(plan_a), str(plan_b))
    typer.echo(json.dumps(result.to_json(), indent=2) if as_json else result.text())
    if fail_if_slower is not None and a.cost is not None and b.cost is not None:
        change = b.cost.step_time / a.cost.step_time - 1.0
        if change * 100 > fail_if_slower:
            typer.echo(f"FAIL (--fail-if-slower {fail_if_slower:g}): B's step "
                       f"{b.cost.step_time * 1e3:.1f} ms is {change:+.1%} against A's "
                       f"{a.cost.step_time * 1e3:.1f} ms", err=True)  # fmt: skip
            raise typer.Exit(1)


def schedule_flags(
    strategy: Strategy,
    schedule: str,
    microbatches: int | None,
    virtual_stages: int | None,
    balance: str,
) -> Strategy:
    """`strategy` with the command line's micro-batch flags: on a mesh with a `pp` axis the
    pipeline's settings (`pipelined`); on a mesh without one, `--microbatches K` accumulates
    the gradients of K micro-batches (strategy option `microbatches`), and
    `--virtual-stages` is refused, naming the mesh."""
    if "pp" in strategy.mesh.axis_names:
        return pipelined(strategy, schedule, microbatches, virtual_stages, balance)
    if virtual_stages:
        raise ShardlabError(
            f"--virtual-stages {virtual_stages} needs a 'pp' mesh axis, and mesh "
            f"{strategy.mesh} has none"
        )
    return strategy.accumulating(microbatches)


def pipelined(
    strategy: Strategy,
    schedule: str,
    microbatches: int | None,
    virtual_stages: int | None,
    balance: str,
) -> Strategy:
    """`strategy` (whose mesh has a pp axis) with the pipeline settings of the command line,
    its schedule's slots costed from each stage's units."""
    settings: dict[str, str | int] = {"schedule": schedule, "balance": balance}
    settings.update({"microbatches": microbatches} if microbatches else {})
    settings.update({"virtual_stages": virtual_stages} if virtual_stages else {})
    passes = {k: v for k, v in strategy.options.get("passes", {}).items()
              if k != "pipeline_send_wait"}  # fmt: skip
    options = {**strategy.options, "passes": passes, "pipeline": settings}
    check_options(options, strategy.mesh)  # a schedule or count it cannot run is named
    return dataclasses.replace(strategy, options=options)


def pass_settings(on: list[str], off: list[str], bucket_mb: float | None) -> dict[str, Any]:
    """`Strategy.options["passes"]` from the CLI flags (names are checked by the manager)."""
    settings: dict[str, Any] = {name: True for name in on}
    settings.update(dict.fromkeys(off, False))
    if bucket_mb is not None and settings.get("dp_fuse_allreduce", True) is not False:
        settings["dp_fuse_allreduce"] = {"bucket_mb": bucket_mb}
    return settings


def _text(s: dict[str, Any]) -> str:
    """The summary as a few aligned lines a reviewer reads top to bottom."""
    roles = ", ".join(f"{n} {role}" for role, n in s["ops_by_role"].items())
    lines = [
        f"{s['model']} on {s['mesh']} ({s['strategy']}), optimizer {s['optimizer']}",
        f"program: {s['program_ops']} ops ({roles})",
        f"communication: {human(s['comm_bytes_per_rank'], 'B')} per rank per step",
    ]
    for kind, entry in s["collectives"].items():
        lines.append(
            f"  {kind:<14} {entry['count']:>6}  {human(entry['bytes_per_rank'], 'B'):>8}/rank"
        )
        for r in entry["reasons"]:
            lines.append(f"      {r['count']:>5} x {r['reason']}")
    for p in s.get("passes", []):
        step = f", step {p['step_time_s'] * 1e3:.1f} ms" if "step_time_s" in p else ""
        lines.append(f"pass {p['name']}: {p.get('message', '')}{step}")
        if p.get("tuning"):
            lines.append(f"    tried {tuning_text(p['tuning'])}")
    declined = [p["name"] for p in s.get("passes", []) if p.get("declined")]
    if declined:
        lines.append(
            f"declined by the cost guard (each would make the step slower): {', '.join(declined)}"
        )
    cost = s.get("cost")
    if cost:
        lines += [
            f"on {cost['cluster']}: step {cost['step_time_s'] * 1e3:.1f} ms, MFU "
            f"{cost['mfu']:.1%} (HFU {cost['hfu']:.1%}), {cost['tokens_per_s']:,.0f} tokens/s; "
            "compute "
            f"{cost['compute_s'] * 1e3:.1f} ms, comm {cost['comm_s'] * 1e3:.1f} ms "
            f"({cost['exposed_comm_s'] * 1e3:.1f} ms exposed)",
            f"memory per rank: peak {human(cost['peak_memory_bytes'], 'B')} of "
            f"{human(cost['memory_capacity_bytes'], 'B')}"
            + ("" if cost["fits"] else "  DOES NOT FIT"),
            "  at peak: "
            + ", ".join(
                f"{k} {human(v, 'B')}" for k, v in cost["memory_breakdown_at_peak"].items() if v
            ),
        ]
    if "pipeline" in s:
        lines += pipelined_plan_lines(s["pipeline"])
    lines += [f"note: {note}" for note in s.get("notes", [])]
    fallbacks = s["fallback_ops"]
    lines.append(
        f"fallback ops: {len(fallbacks)}" + (f" ({', '.join(fallbacks[:5])})" if fallbacks else "")
    )
    return "\n".join(lines)
