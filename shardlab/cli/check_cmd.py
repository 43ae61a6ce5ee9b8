"""`shardlab check`: a CI gate. A plan judged against budgets (`shardlab.check`), built in this
process (`--local MODEL --mesh ...`) or by a Shardlab service (`--server URL --token T`, the
model by `--model-id N` or `--preset NAME --set k=v`, the strategy by `--strategy-id M` or
inline by `--mesh --template --annotate ...`; `check_remote`): prints the verdict as
Markdown for a pull-request comment, writes a JUnit XML report, and exits 0 when every
budget holds, 1 when one does not, 2 on any other error (a bad flag, a model that cannot be
planned, a service that refuses)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from shardlab.check import Budgets, check_verifiable, judge
from shardlab.cli.check_remote import model_ref, run_remote_check, strategy_ref
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
from shardlab.cli.plan_cmd import schedule_flags
from shardlab.errors import ShardlabError
from shardlab.models import parse_overrides

if TYPE_CHECKING:
    from shardlab.plan import Plan

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
    preset: Annotated[
        str | None,
        typer.Option(help="With --server: the model by preset (with --set), stored or reused."),
    ] = None,
    strategy_id: Annotated[
        int | None, typer.Option(help="With --server: a stored strategy version.")
    ] = None,
    strategy_name: Annotated[
        str | None,
        typer.Option(help="With --server --mesh: the strategy's name (default: mesh+templates)."),
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
    verify: Annotated[
        bool, typer.Option(help="Verify one training step against one device (small models).")
    ] = False,
    baseline_name: Annotated[
        str | None,
        typer.Option(
            help="--server: the team's baseline to compare with (default: the "
            "baseline of the model on the cluster, if any)."
        ),
    ] = None,
    junit: Annotated[Path | None, typer.Option(help="Write a JUnit XML report here.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Judge a plan against budgets: Markdown verdict, JUnit XML, exit 0 pass / 1 fail /
    2 error. `--local` builds the plan here, `--server` through a service's API."""
    from shardlab.plan import build_plan, load_plan

    try:
        budgets = Budgets(must_fit, max_step_time_s, max_regression_pct, max_fallback_ops,
                          min_mfu, verify)  # fmt: skip
        if local == (server is not None):
            raise ShardlabError("say where to build the plan: --local MODEL --mesh ..., or "
                                "--server URL --token T (--model-id N or --preset NAME) "
                                "(--strategy-id M or --mesh ...)")  # fmt: skip
        if server is not None:
            if token is None:
                raise ShardlabError("--server needs --token (or SHARDLAB_TOKEN)")
            if model is not None:
                raise ShardlabError("with --server name the model by --preset or --model-id")
            definition = {
                "templates": template or [],
                "annotations": annotate or [],
                "options": _inline_options(mesh, recompute, schedule, microbatches,
                                           virtual_stages),
            }  # fmt: skip
            body = {
                **model_ref(model_id, preset, parse_overrides(set_ or [])),
                **strategy_ref(strategy_id, mesh, strategy_name, definition),
                "cluster": cluster,
                "baseline_plan_id": baseline_plan_id,
                "baseline": baseline_name,
                "budgets": {k: v for k, v in vars(budgets).items() if v is not None},
            }
            check, report = run_remote_check(server, token, body, timeout)
            verdict_json, markdown = check["verdict"], check["markdown"]
            passed = bool(check["passed"])
        else:
            if model is None or mesh is None:
                raise ShardlabError("--local needs a MODEL and --mesh")
            if preset is not None or strategy_name is not None or baseline_name is not None:
                raise ShardlabError("--preset, --strategy-name and --baseline-name are for "
                                    "--server; with --local the MODEL argument names the "
                                    "preset and --baseline a plan file")  # fmt: skip
            if max_regression_pct is not None and baseline is None:
                raise ShardlabError("--max-regression-pct needs --baseline PLAN.json")
            before = load_plan(baseline).summary() if baseline is not None else None
            strategy = build_strategy(mesh, template, annotate, recompute)
            strategy = schedule_flags(strategy, schedule, microbatches, virtual_stages, "time")
            plan = build_plan(load_model(model, set_), strategy, cluster=cluster)
            verdict = judge(plan.summary(), budgets, before, _verify(plan) if verify else None)
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


def _inline_options(
    mesh: str | None,
    recompute: str,
    schedule: str,
    microbatches: int | None,
    virtual_stages: int | None,
) -> dict[str, Any]:
    """The options of an inline strategy for `--server`, as `--local` builds them
    (recomputation; on a `pp` mesh the pipeline settings, else gradient accumulation),
    checked here first."""
    if mesh is None:
        return {"recompute": recompute} if recompute != "none" else {}
    strategy = build_strategy(mesh, None, None, recompute)
    strategy = schedule_flags(strategy, schedule, microbatches, virtual_stages, "time")
    return {key: value for key, value in strategy.options.items() if value != {}}


def _verify(plan: Plan) -> dict[str, Any]:
    """Verify `plan` here (refused up front for a model too large to verify)."""
    from shardlab.runtime.verify import verify
    from shardlab.summary import model_summary

    check_verifiable(int(model_summary(plan.model)["params"]), plan.strategy.mesh.size)
    return verify(plan).to_json()
