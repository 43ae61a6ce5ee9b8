"""`shardlab verify`: one training step of a strategy against one device."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Annotated

import typer

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
from shardlab.errors import ShardlabError


@app.command("verify")
def verify_cmd(
    model: str,
    mesh: MeshOption,
    template: TemplateOption = None,
    annotate: AnnotateOption = None,
    set_: SetOption = None,
    recompute: RecomputeOption = "none",
    dtype: Annotated[str, typer.Option(help="Compute dtype: float64 or float32.")] = "float64",
    optimizer: Annotated[str, typer.Option(help="adamw or sgd.")] = "adamw",
    seed: Annotated[int, typer.Option(help="Seed of the inputs and parameters.")] = 0,
    backend: Annotated[
        str, typer.Option(help="Where the ranks run: simulated (all ranks in this process).")
    ] = "simulated",
    as_json: JsonFlag = False,
) -> None:
    """Run forward, backward and the optimizer on the simulated mesh and on one device."""
    from shardlab.runtime.verify import verify

    try:
        graph = load_model(model, set_)
        strategy = build_strategy(mesh, template, annotate, recompute)
        report = verify(
            graph, strategy, optimizer=optimizer, compute_dtype=dtype, seed=seed, backend=backend
        )
    except ShardlabError as exc:
        fail(exc)
    if as_json:
        body = {"ok": report.ok, "first_divergence": report.first_divergence, **report.summary}
        body["checks"] = [asdict(c) for c in report.checks]
        typer.echo(json.dumps(body, indent=2))
    else:
        worst = max(report.checks, key=lambda c: c.max_abs, default=None)
        status = "PASS" if report.ok else "FAIL"
        compared, collectives = report.summary["compared"], report.summary["collectives"]
        typer.echo(f"{status}: {compared} tensors compared in {dtype}; collectives {collectives}")
        if worst is not None:
            typer.echo(
                f"largest error: {worst.name} ({worst.kind}) abs {worst.max_abs:.3g} "
                f"rel {worst.max_rel:.3g}"
            )
        if report.first_divergence:
            typer.echo(f"first diverging op: {report.first_divergence}")
    if not report.ok:
        raise typer.Exit(1)
