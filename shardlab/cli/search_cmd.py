"""`shardlab search`: the best strategies for a model on a cluster, ranked, with the Pareto
front of step time against memory and why the winner won."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from shardlab.cli.common import JsonFlag, SetOption, app, fail
from shardlab.cli.progress import StderrProgress
from shardlab.errors import ShardlabError
from shardlab.models.config import parse_overrides
from shardlab.search.evaluate import Evaluation
from shardlab.search.run import search


@app.command("search")
def search_cmd(
    model: Annotated[str, typer.Argument(help="A transformer preset (llama3-8b, gpt, ...).")],
    cluster: Annotated[str, typer.Option(help="Cluster preset or file: h100-sxm-8x8.")],
    set_: SetOption = None,
    gpus: Annotated[int | None, typer.Option(help="Use this many GPUs (default: all).")] = None,
    global_batch: Annotated[
        int | None, typer.Option(help="Sequences per step (default: the preset's batch).")
    ] = None,
    memory_headroom: Annotated[
        float, typer.Option(help="Keep this share of device memory free.")
    ] = 0.1,
    max_tp: Annotated[int | None, typer.Option(help="Largest tensor-parallel degree.")] = None,
    min_dp: Annotated[int, typer.Option(help="Smallest data-parallel degree.")] = 1,
    cross_node_tp: Annotated[
        bool, typer.Option(help="Allow tensor parallelism across nodes.")
    ] = False,
    top: Annotated[int, typer.Option(help="Candidates to list.")] = 5,
    workers: Annotated[int | None, typer.Option(help="Worker processes (default: cores).")] = None,
    ray: Annotated[
        str | None,
        typer.Option(
            help="Plan on this Ray cluster (default: $SHARDLAB_RAY_ADDRESS).", metavar="ADDRESS"
        ),
    ] = None,
    progress: Annotated[
        bool, typer.Option(help="Report progress on stderr (stdout stays the result).")
    ] = True,
    json_: JsonFlag = False,
) -> None:
    """Search meshes, templates, recomputation and schedules; rank what fits."""
    report = StderrProgress("search") if progress else None
    try:
        result = search(
            model, cluster, overrides=parse_overrides(set_ or []), gpus=gpus,
            global_batch=global_batch, headroom=memory_headroom, max_tp=max_tp, min_dp=min_dp,
            cross_node_tp=cross_node_tp, workers=workers, ray_address=ray, progress=report,
        )  # fmt: skip
    except ShardlabError as exc:
        fail(exc)
    finally:
        if report is not None:
            report.close()
    if json_:
        typer.echo(json.dumps(result.to_json(), indent=1))
        return
    fits = result.feasible
    typer.echo(
        f"{model} on {result.gpus} GPUs of {result.cluster}, global batch "
        f"{result.global_batch}: {result.planned} candidates planned in "
        f"{result.seconds:.1f} s ({len(result.ranked)} distinct plans), {len(fits)} fit, "
        f"{len(result.pruned)} meshes pruned, {len(result.skipped)} candidates skipped by "
        "their bounds"
    )
    for i, e in enumerate(result.ranked[:top], start=1):
        state = "" if e.fits else f"  ({e.reason})"
        typer.echo(f"{i:3}. {_figures(e)}  {e.candidate.label()}{state}")
        for twin in e.same_plan:
            typer.echo(f"{'':30}same plan: {twin.label()}")
    front = result.pareto()
    if front:
        typer.echo("Pareto front (step time against peak memory per rank):")
        for e in front:
            typer.echo(f"     {_figures(e)}  {e.candidate.label()}")
    for line in result.why():
        typer.echo(line)
    screening = result.screening_line()
    if screening:
        typer.echo(screening)
    for p in result.pruned:
        typer.echo(f"pruned {p.what}: {p.reason}")
    for p in result.skipped[:top]:
        typer.echo(f"skipped {p.what}: {p.reason}")
    if len(result.skipped) > top:
        typer.echo(f"... and {len(result.skipped) - top} more skipped (--json lists them)")
    if not fits:
        raise typer.Exit(1)


def _figures(e: Evaluation) -> str:
    step = f"{e.step_time_s * 1e3:9.1f} ms" if e.step_time_s is not None else "        –   "
    return f"{step} {(e.peak_memory_bytes or 0) / (1 << 30):6.1f} GiB"
