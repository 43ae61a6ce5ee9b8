"""The Typer app and what every command shares: loading models, strategy options, errors."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, NoReturn

import typer

from shardlab.errors import PresetError, ShardlabError
from shardlab.ir import Graph
from shardlab.models import PRESETS, build_model, parse_overrides
from shardlab.strategy import Strategy
from shardlab.templates import TEMPLATES
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
MeshOption = Annotated[
    str, typer.Option("--mesh", help="Device mesh as axis=size pairs, e.g. dp=2,tp=4.")
]
TemplateOption = Annotated[
    list[str] | None,
    typer.Option(
        "--template",
        help="Strategy template, optionally on a named axis (e.g. dp:x; repeatable, applied "
        f"in order): {', '.join(TEMPLATES)}.",
    ),
]
RecomputeOption = Annotated[
    str,
    typer.Option(
        "--recompute",
        help="Activation recomputation: none, selective (the attention core) or full "
        "(every layer keeps only its input).",
    ),
]
AnnotateOption = Annotated[
    list[str] | None,
    typer.Option(
        "--annotate",
        help="Placement for values matching a glob: 'w0=S(1)' or 'x=dp:S(0)' (repeatable).",
    ),
]

ScheduleOption = Annotated[
    str | None,
    typer.Option(help="Pipeline schedule on a pp mesh axis: gpipe, 1f1b (default), interleaved."),
]
MicrobatchesOption = Annotated[
    int | None, typer.Option(help="Pipeline micro-batches (default: one per stage).")
]
VirtualStagesOption = Annotated[
    int | None, typer.Option(help="Model chunks per pipeline rank (interleaved; default 2).")
]
DeviceOption = Annotated[
    str,
    typer.Option(
        help="Device of the torch ranks: cpu (gloo) or cuda (NCCL, one GPU per rank).",
    ),
]


def load_model(model: str, overrides: list[str] | None = None) -> Graph:
    """A preset (with overrides) or a validated graph file."""
    path = Path(model)
    if model not in PRESETS and (path.suffix == ".json" or path.exists()):
        if overrides:
            raise PresetError("--set applies to presets, not to graph files", model=model)
        return load_graph_file(path)
    return build_model(model, parse_overrides(overrides or []))


def build_strategy(
    mesh: str,
    templates: list[str] | None,
    annotations: list[str] | None,
    recompute: str = "none",
) -> Strategy:
    """The strategy of the command line (`--recompute` is a strategy option)."""
    options = {"recompute": recompute} if recompute != "none" else {}
    return Strategy.build(mesh, templates or [], annotations or [], options)


def fail(exc: ShardlabError) -> NoReturn:
    """Print a user error in one line and exit with status 1."""
    typer.echo(f"error: {exc.message}", err=True)
    raise typer.Exit(1)
