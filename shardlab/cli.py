"""The `shardlab` command.

`MODEL` arguments are a preset name (`llama3-8b`) or the path of a graph JSON file;
`--set key=value` overrides preset fields. User errors print one line naming the culprit
and exit with status 1.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from shardlab.errors import PresetError, ShardlabError
from shardlab.graph_json import dumps_graph, graph_schema
from shardlab.ir import Graph
from shardlab.models import PRESETS, build_model, parse_overrides
from shardlab.summary import human, model_summary
from shardlab.validate import load_graph_file

app = typer.Typer(
    help="Shardlab: plan, cost and verify how a model is split across a device mesh.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

SetOption = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a preset field, e.g. --set layers=2 (repeatable)."),
]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON.")]


def load_model(model: str, overrides: list[str] | None = None) -> Graph:
    """A preset (with overrides) or a validated graph file."""
    path = Path(model)
    if model not in PRESETS and (path.suffix == ".json" or path.exists()):
        if overrides:
            raise PresetError("--set applies to presets, not to graph files", model=model)
        return load_graph_file(path)
    return build_model(model, parse_overrides(overrides or []))


def _fail(exc: ShardlabError) -> None:
    typer.echo(f"error: {exc.message}", err=True)
    raise typer.Exit(1)


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
        _fail(exc)
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
        _fail(exc)
    output.write_text(dumps_graph(graph, indent=1))
    typer.echo(f"wrote {output} ({len(graph.ops)} ops, {graph.num_params():,} params)")


@app.command()
def validate(file: Path) -> None:
    """Check a graph JSON file; exit 1 with the precise error if it is malformed."""
    try:
        graph = load_graph_file(file)
    except ShardlabError as exc:
        _fail(exc)
    typer.echo(f"ok: {file} ({len(graph.ops)} ops, {len(graph.values)} values)")


@app.command()
def schema() -> None:
    """Print the JSON schema of the graph format."""
    typer.echo(json.dumps(graph_schema(), indent=2))


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
) -> None:
    """Start the web service (API under /api, UI at /)."""
    import uvicorn

    from backend.app import create_app

    typer.echo(f"shardlab: serving on http://{host}:{port}/", err=True)
    uvicorn.run(create_app(), host=host, port=port, log_level="info")


def main() -> None:  # pragma: no cover - console entry for `python -m shardlab.cli`
    sys.exit(app())


if __name__ == "__main__":  # pragma: no cover
    main()
