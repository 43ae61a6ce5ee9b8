"""Model commands: list presets, show a model, export and validate graph files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from shardlab.cli.common import JsonFlag, SetOption, app, fail, load_model
from shardlab.errors import ShardlabError
from shardlab.graph_json import dumps_graph, graph_schema
from shardlab.models import PRESETS
from shardlab.summary import human, model_summary
from shardlab.validate import load_graph_file


@app.command()
def models(as_json: JsonFlag = False) -> None:
    """List the model presets."""
    rows = [
        {"name": p.name, "description": p.description, "family": type(p.config).__name__}
        for p in PRESETS.values()
    ]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    for row in rows:
        typer.echo(f"{row['name']:<14} {row['description']}")


@app.command()
def show(model: str, set_: SetOption = None, as_json: JsonFlag = False) -> None:
    """Parameters, FLOPs, layers and ops by kind of a model."""
    try:
        summary = model_summary(load_model(model, set_))
    except ShardlabError as exc:
        fail(exc)
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
        return
    _print_summary(summary)


def _print_summary(s: dict[str, Any]) -> None:
    typer.echo(f"model       {s['name']}")
    typer.echo(f"params      {s['params']:,} ({human(s['params'])})")
    typer.echo(f"FLOPs/step  {s['flops_forward']:,} forward ({human(s['flops_forward'], 'FLOP')})")
    typer.echo(f"layers      {s['layers']}")
    typer.echo(f"ops         {s['ops']} ({s['values']} values)")
    for kind, n in s["ops_by_kind"].items():
        typer.echo(f"  {kind:<30} {n}")


@app.command()
def export(
    model: str,
    output: Annotated[Path, typer.Option("-o", "--output", help="Where to write the graph JSON.")],
    set_: SetOption = None,
) -> None:
    """Write a model's graph as JSON (format shardlab.graph/1)."""
    try:
        graph = load_model(model, set_)
    except ShardlabError as exc:
        fail(exc)
    output.write_text(dumps_graph(graph, indent=1))
    typer.echo(f"wrote {output} ({len(graph.ops)} ops, {graph.num_params():,} params)")


@app.command()
def validate(file: Path) -> None:
    """Check a graph JSON file; exit 1 with the precise error if it is malformed."""
    try:
        graph = load_graph_file(file)
    except ShardlabError as exc:
        fail(exc)
    typer.echo(f"ok: {file} ({len(graph.ops)} ops, {len(graph.values)} values)")


@app.command()
def schema() -> None:
    """Print the JSON schema of the graph format."""
    typer.echo(json.dumps(graph_schema(), indent=2))
