"""`shardlab calibrate`: measure this machine's torch ranks and write a Cluster profile."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from shardlab.cli.common import JsonFlag, app, fail
from shardlab.errors import ShardlabError


@app.command("calibrate")
def calibrate_cmd(
    output: Annotated[Path, typer.Option("--output", "-o", help="Cluster JSON file to write.")],
    nproc: Annotated[int, typer.Option(help="Ranks measured at once (gloo processes).")] = 2,
    dtype: Annotated[str, typer.Option(help="Compute dtype: float32 or float64.")] = "float32",
    quick: Annotated[
        bool, typer.Option("--quick", help="Fewer sizes and repeats (seconds, not a minute).")
    ] = False,
    name: Annotated[str | None, typer.Option(help="Cluster name (default: file stem).")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Measure matmul and memory throughput, the per-op floor and gloo collectives on
    --nproc local ranks, fit the cost model's constants and write a Cluster JSON for
    --cluster (raw samples beside it, in <stem>.measurements.json)."""
    from shardlab.runtime.calibrate import calibrate, measurements_json, report_lines, write

    try:
        cal = calibrate(nproc, dtype, quick, name or output.name.removesuffix(".json"))
        path, raw = write(cal, output)
    except ShardlabError as exc:
        fail(exc)
    if as_json:
        body = {"cluster": cal.cluster.to_json(), "file": str(path), "measurements": str(raw)}
        body["residuals"] = measurements_json(cal)["residuals"]
        typer.echo(json.dumps(body, indent=2))
        return
    for line in report_lines(cal):
        typer.echo(line)
    typer.echo(f"wrote {path} (use --cluster {path}) and {raw}")
