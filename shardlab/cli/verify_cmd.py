"""`shardlab verify`: one training step of a strategy against one device."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict
from typing import Annotated, Any

import typer

from shardlab.cli.common import (
    AnnotateOption,
    DeviceOption,
    JsonFlag,
    MeshOption,
    MicrobatchesOption,
    RecomputeOption,
    ScheduleOption,
    SetOption,
    TemplateOption,
    VirtualStagesOption,
    app,
    build_strategy,
    fail,
    load_model,
)
from shardlab.errors import ShardlabError
from shardlab.passes.pipeline_schedule import PipelineError
from shardlab.strategy import Strategy, check_options


@app.command("verify")
def verify_cmd(
    model: str,
    mesh: MeshOption,
    template: TemplateOption = None,
    annotate: AnnotateOption = None,
    set_: SetOption = None,
    recompute: RecomputeOption = "none",
    schedule: ScheduleOption = None,
    microbatches: MicrobatchesOption = None,
    virtual_stages: VirtualStagesOption = None,
    dtype: Annotated[
        str,
        typer.Option(
            help="Compute dtype: float64, float32, or bfloat16 (--backend torch: the model's "
            "own mixed precision, bf16 values with fp32 masters, each op checked against "
            "itself computed exactly; build the model with dtype=bfloat16)."
        ),
    ] = "float64",
    optimizer: Annotated[str, typer.Option(help="adamw or sgd.")] = "adamw",
    seed: Annotated[int, typer.Option(help="Seed of the inputs and parameters.")] = 0,
    backend: Annotated[
        str,
        typer.Option(
            help="Where the ranks run: simulated (all ranks in this process) or torch (one "
            "process per rank, torch.distributed collectives: gloo on CPU, NCCL on CUDA)."
        ),
    ] = "simulated",
    device: DeviceOption = "cpu",
    nproc: Annotated[
        int | None,
        typer.Option(help="Processes to run (--backend torch); must equal the mesh size."),
    ] = None,
    max_memory_gib: Annotated[
        float,
        typer.Option(
            "--max-memory-gib",
            help="The most memory a verification may hold (GiB, estimated before it starts).",
        ),
    ] = 4.0,
    twin: Annotated[
        bool,
        typer.Option(
            help="Beyond --max-memory-gib, verify a scaled-down twin of a preset model (the "
            "same mesh, templates and placements; fewer layers, smaller sizes) instead of "
            "refusing."
        ),
    ] = True,
    as_json: JsonFlag = False,
) -> None:
    """Run forward, backward and the optimizer on the mesh (--backend) and on one device; a pp
    mesh axis runs as a pipeline on either backend (--schedule, default 1f1b; --microbatches;
    --virtual-stages)."""
    from shardlab.runtime.backends import check_nproc
    from shardlab.runtime.twin import verify_safely

    try:
        graph = load_model(model, set_)
        strategy = build_strategy(mesh, template, annotate, recompute)
        strategy = with_pipeline(strategy, schedule, microbatches, virtual_stages)
        check_nproc(nproc, strategy.mesh)
        report = verify_safely(
            graph,
            strategy,
            limit=int(max_memory_gib * (1 << 30)),
            twin=twin,
            optimizer=optimizer,
            compute_dtype=dtype,
            seed=seed,
            backend=backend,
            device=device,
        )
    except ShardlabError as exc:
        fail(exc)
    default_schedule = "pp" in strategy.mesh.axis_names and schedule is None
    if as_json:
        body = {"ok": report.ok, "first_divergence": report.first_divergence, **report.summary}
        body.update({"default_schedule": True} if default_schedule else {})
        body["checks"] = [asdict(c) for c in report.checks]
        typer.echo(json.dumps(body, indent=2))
    else:
        worst = max(report.checks, key=lambda c: c.max_abs, default=None)
        status = "PASS" if report.ok else "FAIL"
        typer.echo(f"{status}: {report.summary['compared']} tensors compared in {dtype}; "
                   + how_distributed(report.summary, default_schedule))  # fmt: skip
        if "twin" in report.summary:
            typer.echo(twin_line(report.summary["twin"]))
        if "torch_ops" in report.summary:
            typer.echo(torch_ops_line(report.summary["torch_ops"]))
        if worst is not None:
            typer.echo(
                f"largest error: {worst.name} ({worst.kind}) abs {worst.max_abs:.3g} "
                f"rel {worst.max_rel:.3g}"
            )
        if report.first_divergence:
            typer.echo(f"first diverging op: {report.first_divergence}")
    if not report.ok:
        raise typer.Exit(1)


def torch_ops_line(counts: dict[str, Any]) -> str:
    """How many local ops the torch backend ran as torch ops, and which fell back to numpy."""
    total = counts["torch"] + counts["numpy"]
    fallback = ", ".join(counts["numpy_kinds"]) or "none"
    return (
        f"local compute: {counts['torch']} of {total} ops ran as torch ops over all ranks; "
        f"numpy kernels: {fallback}"
    )


def twin_line(twin: dict[str, Any]) -> str:
    """What the twin changed, and why it ran instead of the model."""
    changed = ", ".join(f"{k} {a}->{b}" for k, (a, b) in twin["changes"].items())
    gib = 1 << 30
    return (
        f"scaled-down twin verified, not the model itself: the model would hold about "
        f"{twin['full_estimate_bytes'] / gib:.1f} GiB (limit {twin['limit_bytes'] / gib:.1f} "
        f"GiB); same mesh, templates and placements, with {changed}"
    )


def with_pipeline(
    strategy: Strategy, schedule: str | None, microbatches: int | None, virtual_stages: int | None
) -> Strategy:
    """`strategy` with the command line's pipeline settings in its option `pipeline`, checked
    against its mesh (the engine's defaults fill what is not given); on a mesh without a
    `pp` axis, `--microbatches K` accumulates the gradients of K micro-batches."""
    settings: dict[str, Any] = {"schedule": schedule} if schedule else {}
    settings.update({"virtual_stages": virtual_stages} if virtual_stages is not None else {})
    if "pp" not in strategy.mesh.axis_names:
        if settings:
            raise PipelineError(
                "--schedule and --virtual-stages pipeline a mesh's 'pp' axis; "
                f"mesh {strategy.mesh} has none"
            )
        return strategy.accumulating(microbatches)
    settings.update({"microbatches": microbatches} if microbatches is not None else {})
    options = {**strategy.options, "pipeline": settings}
    check_options(options, strategy.mesh)  # a schedule or count it cannot run is named
    return dataclasses.replace(strategy, options=options)


def how_distributed(summary: dict[str, Any], default_schedule: bool) -> str:
    """The collectives of a flat plan, or the schedule, stages and micro-batches of a pipeline."""
    if "schedule" not in summary:
        return f"collectives {summary['collectives']}"
    if summary["pp"] == 1 and summary["virtual_stages"] == 1:
        return f"{summary['microbatches']} micro-batches accumulated, one optimizer step"
    chunks = summary["virtual_stages"]
    return (
        f"pipeline {summary['schedule']}"
        + (" (the default schedule; choose with --schedule)" if default_schedule else "")
        + f", {summary['pp']} stages on axis pp, {summary['microbatches']} micro-batches"
        + (f", {chunks} chunks per stage" if chunks > 1 else "")
    )
