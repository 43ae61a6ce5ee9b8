"""Sharding commands: `complete` (placements of every value) and `explain` (why)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from shardlab.cli.common import (
    AnnotateOption,
    JsonFlag,
    MeshOption,
    SetOption,
    TemplateOption,
    app,
    build_strategy,
    fail,
    load_model,
)
from shardlab.errors import ShardlabError
from shardlab.spmd.complete import CompletedGraph, complete
from shardlab.spmd.explain import explain, format_explanation


def _complete(
    model: str,
    set_: list[str] | None,
    mesh: str,
    template: list[str] | None,
    annotate: list[str] | None,
) -> CompletedGraph:
    graph = load_model(model, set_)
    return complete(graph, build_strategy(mesh, template, annotate))


@app.command("complete")
def complete_cmd(
    model: str,
    mesh: MeshOption,
    template: TemplateOption = None,
    annotate: AnnotateOption = None,
    set_: SetOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Propagate placements: print every value's placement, fallback and reshard counts."""
    try:
        done = _complete(model, set_, mesh, template, annotate)
    except ShardlabError as exc:
        fail(exc)
    summary = done.summary()
    if as_json:
        summary["placements"] = {name: str(spec) for name, spec in done.specs.items()}
        summary["fallback_reasons"] = {op: done.rules[op].reason for op in done.fallback_ops()}
        typer.echo(json.dumps(summary, indent=2))
        return
    graph = done.graph
    width = max(len(name) for name in graph.values)
    for name, value in graph.values.items():
        typer.echo(f"{name:<{width}}  {value.type!s:<24} {done.specs[name]}")
    typer.echo("")
    typer.echo(f"strategy      {summary['strategy']}")
    typer.echo(f"values        {summary['values']}, ops {summary['ops']}")
    typer.echo(f"fallback ops  {len(summary['fallback_ops'])}")
    for op in summary["fallback_ops"]:
        typer.echo(f"  {op}: {done.rules[op].reason}")
    typer.echo(f"reshards      {summary['reshards']} inputs of {summary['reshard_ops']} ops")


@app.command("explain")
def explain_cmd(
    model: str,
    mesh: MeshOption,
    value: Annotated[str, typer.Option("--value", help="The value to explain.")],
    template: TemplateOption = None,
    annotate: AnnotateOption = None,
    set_: SetOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Why a value has its placement: the chain of decisions back to an annotation."""
    try:
        done = _complete(model, set_, mesh, template, annotate)
        if as_json:
            steps = [
                {
                    "value": s.value,
                    "spec": s.spec,
                    "decisions": [
                        {"source": d.source, "op": d.op, "spec": d.spec, "detail": d.detail}
                        for d in s.decisions
                    ],
                    "because_of": s.next_value,
                }
                for s in explain(done, value)
            ]
            typer.echo(json.dumps(steps, indent=2))
            return
        typer.echo(format_explanation(done, value))
    except ShardlabError as exc:
        fail(exc)
