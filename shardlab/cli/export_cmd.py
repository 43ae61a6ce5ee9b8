"""`shardlab export-plan`: a saved plan as a DTensor module, torchtitan or Megatron options, JSON.

`shardlab export-plan plan.json --format dtensor -o parallelize.py` reads what `shardlab
plan ... -o plan.json` wrote (rebuilding the plan from its model and strategy) and writes
the export (`shardlab.export.plan_export`) to the file, or to stdout without `-o`. What
the export cannot say exactly, or maps to what its framework runs (ZeRO-1/2, DDP under
torchtitan), is printed to stderr as notes.
Errors name the plan file and field, the format, or the parameter and placement.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from shardlab.cli.common import app, fail
from shardlab.errors import ShardlabError


@app.command("export-plan")
def export_plan_cmd(
    plan_file: Annotated[Path, typer.Argument(help="A plan file written by `shardlab plan -o`.")],
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            help="dtensor (Python module), torchtitan (0.3 command line), torchtitan-toml "
            "(before 0.3), megatron (pretrain_gpt.py options) or json.",
        ),
    ] = "dtensor",
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write here instead of stdout.")
    ] = None,
) -> None:
    """Export a plan: a DTensor parallelize module, torchtitan or Megatron-LM options, or JSON."""
    from shardlab.export.plan_export import export_format, export_plan
    from shardlab.plan import load_plan

    try:
        export_format(fmt)  # refuse an unknown format before the plan is rebuilt
        exported = export_plan(load_plan(plan_file), fmt)
        if output is not None:
            try:
                output.write_text(exported.text)
            except OSError as exc:
                raise ShardlabError(
                    f"cannot write {str(output)!r}: {exc.strerror}", path=str(output)
                ) from None
    except ShardlabError as exc:
        fail(exc)
    for note in exported.notes:
        typer.echo(f"note: {note}", err=True)
    if output is None:
        typer.echo(exported.text, nl=False)
    else:
        typer.echo(f"wrote {output} ({fmt})", err=True)
