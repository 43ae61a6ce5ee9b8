"""`shardlab plan`: build the training plan of a model under a strategy and summarise it."""

from __future__ import annotations

import json
from typing import Annotated, Any

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
from shardlab.summary import human


@app.command("plan")
def plan_cmd(
    model: str,
    mesh: MeshOption,
    template: TemplateOption = None,
    annotate: AnnotateOption = None,
    set_: SetOption = None,
    optimizer: Annotated[str, typer.Option(help="adamw or sgd.")] = "adamw",
    as_json: JsonFlag = False,
) -> None:
    """Training graph, placements and the per-rank program; prints collectives and why."""
    from shardlab.plan import build_plan

    try:
        graph = load_model(model, set_)
        strategy = build_strategy(mesh, template, annotate)
        plan = build_plan(graph, strategy, optimizer=optimizer)
    except ShardlabError as exc:
        fail(exc)
    summary = plan.summary()
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
        return
    typer.echo(_text(summary))


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
    fallbacks = s["fallback_ops"]
    lines.append(
        f"fallback ops: {len(fallbacks)}" + (f" ({', '.join(fallbacks[:5])})" if fallbacks else "")
    )
    return "\n".join(lines)
