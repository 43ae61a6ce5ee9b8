"""`shardlab measure`: time a plan's step on real ranks and compare it with the cost model.

A mesh with a `pp` axis runs as a pipeline (--schedule, --microbatches, --virtual-stages as
`shardlab verify` takes them): every rank runs its stage, and the step is held against the
plan's pipelined cost, with units, tail and bubble per stage (`runtime.measure_pipeline`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from shardlab.cli.common import (
    DeviceOption,
    JsonFlag,
    MeshOption,
    MicrobatchesOption,
    ScheduleOption,
    SetOption,
    TemplateOption,
    VirtualStagesOption,
    app,
    build_strategy,
    fail,
    load_model,
)
from shardlab.cli.verify_cmd import with_pipeline
from shardlab.errors import ShardlabError

if TYPE_CHECKING:
    from shardlab.runtime.measure import Measurement

#: The cluster predicted against when --cluster is not given: this machine's CPU ranks.
DEFAULT_CLUSTER = "cpu-local"


@app.command("measure")
def measure_cmd(
    model: str,
    mesh: MeshOption,
    template: TemplateOption = None,
    set_: SetOption = None,
    schedule: ScheduleOption = None,
    microbatches: MicrobatchesOption = None,
    virtual_stages: VirtualStagesOption = None,
    backend: Annotated[str, typer.Option(help="Where the ranks run: torch.")] = "torch",
    nproc: Annotated[
        int | None, typer.Option(help="Processes to run; must equal the mesh size.")
    ] = None,
    steps: Annotated[int, typer.Option(help="Steps timed (after the warm-up).")] = 5,
    warmup: Annotated[int, typer.Option(help="Warm-up steps run and dropped.")] = 1,
    trace: Annotated[
        Path | None, typer.Option(help="Write the measured steps as a Chrome trace.")
    ] = None,
    cluster: Annotated[
        str | None,
        typer.Option(help=f"Cluster the prediction is for (default {DEFAULT_CLUSTER})."),
    ] = None,
    optimizer: Annotated[str, typer.Option(help="adamw or sgd.")] = "adamw",
    dtype: Annotated[
        str,
        typer.Option(
            help="Compute dtype: float64, float32, or bfloat16 (the model's own mixed "
            "precision: bf16 values, fp32 masters and moments; build it with dtype=bfloat16)."
        ),
    ] = "float32",
    device: DeviceOption = "cpu",
    seed: Annotated[int, typer.Option(help="Seed of the inputs and parameters.")] = 0,
    by_layer: Annotated[bool, typer.Option("--by-layer", help="Add a row per layer.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Run the plan's step on one process per rank (torch.distributed: gloo on CPU, NCCL on
    --device cuda), time every op
    and print predicted against measured seconds with error % = (pred - meas) / meas; a pp
    mesh axis runs as a pipeline (--schedule, default 1f1b; --microbatches;
    --virtual-stages) and adds units, tail and bubble per stage."""
    from shardlab.plan import build_plan
    from shardlab.runtime.backends import check_nproc
    from shardlab.runtime.measure import compare, measure, measured_trace

    try:
        if backend != "torch":
            raise ShardlabError(f"measure runs on --backend torch only, not {backend!r}")
        graph = load_model(model, set_)
        strategy = build_strategy(mesh, template, None, "none")
        strategy = with_pipeline(strategy, schedule, microbatches, virtual_stages)
        check_nproc(nproc, strategy.mesh)
        plan = build_plan(graph, strategy, optimizer=optimizer, cluster=cluster or DEFAULT_CLUSTER)
        got = measure(plan, steps=steps, warmup=warmup, seed=seed, dtype=dtype, device=device)
        rows = compare(plan, got)
    except ShardlabError as exc:
        fail(exc)
    if trace is not None:
        trace.write_text(json.dumps(measured_trace(got)), encoding="utf-8")
    cost = plan.cost or (plan.pipeline.cost if plan.pipeline else None)
    assert cost is not None
    if as_json:
        body = {"cluster": cost.cluster.name, **got.to_json()}
        body["rows"] = [r.to_json() for r in rows]
        typer.echo(json.dumps(body, indent=2))
        return
    typer.echo(
        f"measured {steps} steps (+{warmup} warm-up) on {strategy.mesh.size} torch ranks; "
        + _pipeline_words(got)
        + f"step max {got.step_max * 1e3:.2f} ms, median {got.step_median * 1e3:.2f} ms; "
        f"predicted for {cost.cluster.name}"
    )
    typer.echo(f"{'':<36} {'predicted ms':>13} {'measured ms':>12} {'error %':>9}")
    for r in rows:
        if r.group == "layer" and not by_layer:
            continue
        err = f"{r.error_pct:+.0f}" if math.isfinite(r.error_pct) else "n/a"
        label = r.name if r.group in ("step", "total") else f"  {r.group} {r.name}"
        typer.echo(f"{label:<36} {r.predicted_s * 1e3:>13.3f} {r.measured_s * 1e3:>12.3f} "
                   f"{err:>9}")  # fmt: skip
    if trace is not None:
        typer.echo(f"chrome trace: {trace} (open in https://ui.perfetto.dev)")


def _pipeline_words(got: Measurement) -> str:
    """`pipeline 1f1b, 2 stages, 4 micro-batches; ` for a pipeline's measurement, else ''."""
    p = got.pipeline
    if p is None:
        return ""
    chunks = f", {p.virtual_stages} chunks per stage" if p.virtual_stages > 1 else ""
    return f"pipeline {p.schedule}, {p.pp} stages, {p.microbatches} micro-batches{chunks}; "
