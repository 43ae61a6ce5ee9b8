"""`shardlab check`: a CI gate. A plan judged against budgets (`shardlab.check`), built in this
process (`--local MODEL --mesh ...`) or by a Shardlab service (`--server URL --token T
--model-id N --strategy-id M`, `check_remote`): prints the verdict as Markdown for a
pull-request comment, writes a JUnit XML report, and exits 0 when every budget holds, 1 when
one does not, 2 on any other error (a bad flag, a model that cannot be planned, a service
that refuses)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from shardlab.check import Budgets, judge
from shardlab.cli.check_remote import run_remote_check
from shardlab.cli.common import (
    AnnotateOption,
    JsonFlag,
    RecomputeOption,
    SetOption,
    TemplateOption,
    app,
    build_strategy,
    load_model,
)
from shardlab.cli.plan_cmd import pipelined
from shardlab.errors import ShardlabError

#: Exit status for anything but a verdict: CI tells a broken job from a failed budget.
ERROR_EXIT = 2


@app.command("check")
def check_cmd(
    cluster: Annotated[
        str, typer.Option(help="Cluster preset (h100-sxm-8x8) or file the plan is costed on.")
    ],
    model: Annotated[str | None, typer.Argument(help="With --local: preset or graph.")] = None,
    mesh: Annotated[str | None, typer.Option(help="With --local: the device mesh.")] = None,
    local: Annotated[
        bool,
        typer.Option("--local", help="Build the plan in this process (no server needed)."),
    ] = False,
    server: Annotated[
        str | None, typer.Option(help="A Shardlab service's URL: check through its API.")
    ] = None,
    token: Annotated[
        str | None, typer.Option(envvar="SHARDLAB_TOKEN", help="API token (--server).")
    ] = None,
    model_id: Annotated[int | None, typer.Option(help="With --server: a stored model.")] = None,
    strategy_id: Annotated[
        int | None, typer.Option(help="With --server: a stored strategy version.")
    ] = None,
    baseline_plan_id: Annotated[
        int | None, typer.Option(help="With --server: the built plan to compare with.")
    ] = None,
    timeout: Annotated[float, typer.Option(help="With --server: seconds to wait.")] = 600.0,
    template: TemplateOption = None,
    annotate: AnnotateOption = None,
    set_: SetOption = None,
    recompute: RecomputeOption = "none",
    schedule: Annotated[str, typer.Option(help="Pipeline schedule on a pp mesh.")] = "1f1b",
    microbatches: Annotated[int | None, typer.Option(help="Pipeline micro-batches.")] = None,
    virtual_stages: Annotated[int | None, typer.Option(help="Chunks per pipeline rank.")] = None,
    baseline: Annotated[
        Path | None,
        typer.Option(
            help="A plan saved with `shardlab plan ... --cluster -o FILE`: the step "
            "--max-regression-pct compares with."
        ),
    ] = None,
    must_fit: Annotated[
        bool, typer.Option("--must-fit/--may-oom", help="Fail a plan over the memory.")
    ] = True,
    max_step_time_s: Annotated[float | None, typer.Option(help="Most step seconds.")] = None,
    max_regression_pct: Annotated[
        float | None, typer.Option(help="Most percent slower than --baseline.")
    ] = None,
    max_fallback_ops: Annotated[
        int | None, typer.Option(help="Most ops on the replicated fallback.")
    ] = None,
    min_mfu: Annotated[float | None, typer.Option(help="Least MFU, a fraction (0.4).")] = None,
    junit: Annotated[Path | None, typer.Option(help="Write a JUnit XML report here.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Judge a plan against budgets: Markdown verdict, JUnit XML, exit 0 pass / 1 fail /
    2 error. `--local` builds the plan here, `--server` through a service's API."""
    from shardlab.plan import build_plan, load_plan

    try:
        budgets = Budgets(must_fit, max_step_time_s, max_regression_pct, max_fallback_ops,
                          min_mfu)  # fmt: skip
        if local == (server is not None):
            raise ShardlabError("say where to build the plan: --local MODEL --mesh ..., or "
                                "--server URL --token T --model-id N --strategy-id M")  # fmt: skip
        if server is not None:
            if token is None or model_id is None or strategy_id is None:
                raise ShardlabError("--server needs --token (or SHARDLAB_TOKEN), --model-id "
                                    "and --strategy-id")  # fmt: skip
            body = {
                "model_id": model_id,
                "strategy_id": strategy_id,
                "cluster": cluster,
                "baseline_plan_id": baseline_plan_id,
                "budgets": {k: v for k, v in vars(budgets).items() if v is not None},
            }
            check, report = run_remote_check(server, token, body, timeout)
            verdict_json, markdown = check["verdict"], check["markdown"]
            passed = bool(check["passed"])
        else:
            if model is None or mesh is None:
                raise ShardlabError("--local needs a MODEL and --mesh")
            if max_regression_pct is not None and baseline is None:
                raise ShardlabError("--max-regression-pct needs --baseline PLAN.json")
            before = load_plan(baseline).summary() if baseline is not None else None
            strategy = build_strategy(mesh, template, annotate, recompute)
            if "pp" in strategy.mesh.axis_names:
                strategy = pipelined(strategy, schedule, microbatches, virtual_stages, "time")
            plan = build_plan(load_model(model, set_), strategy, cluster=cluster)
            verdict = judge(plan.summary(), budgets, before)
            verdict_json, markdown, report = verdict.to_json(), verdict.markdown(), verdict.junit()
            passed = verdict.passed
    except ShardlabError as exc:
        typer.echo(f"error: {exc.message}", err=True)
        raise typer.Exit(ERROR_EXIT) from None
    typer.echo(json.dumps(verdict_json, indent=1) if as_json else markdown)
    if junit is not None:
        junit.write_text(report)
    if not passed:
        raise typer.Exit(1)
