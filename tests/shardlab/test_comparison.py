"""`shardlab.compare`: two plans side by side, and saved plans through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import shardlab
from shardlab.cli import app
from shardlab.comparison import show
from shardlab.models import build_model
from shardlab.plan import PlanFileError, build_plan, load_plan, save_plan
from shardlab.strategy import Strategy

runner = CliRunner()
MODEL = {"layers": 2}


@pytest.fixture(scope="module")
def dp_and_tp() -> tuple[shardlab.plan.Plan, shardlab.plan.Plan]:
    model = build_model("llama3-8b", MODEL)
    dp = build_plan(model, Strategy.build("dp=8", ["dp"]), cluster="h100-sxm-1x8")
    tp = build_plan(model, Strategy.build("dp=2,tp=4", ["dp", "megatron_tp"]),
                    cluster="h100-sxm-1x8")  # fmt: skip
    return dp, tp


def test_headline_deltas_are_b_minus_a(dp_and_tp: tuple[shardlab.plan.Plan, ...]) -> None:
    dp, tp = dp_and_tp
    result = shardlab.compare(dp, tp)
    rows = {d.name: d for d in result.headline}
    assert dp.cost is not None and tp.cost is not None
    step = rows["step time (s)"]
    assert (step.a, step.b) == (dp.cost.step_time, tp.cost.step_time)
    assert step.delta == tp.cost.step_time - dp.cost.step_time
    peak = {d.name: d for d in result.memory}["peak"]
    assert (peak.a, peak.b) == (dp.cost.memory.peak_bytes, tp.cost.memory.peak_bytes)


def test_time_per_scope_adds_up_to_each_plans_op_times(
    dp_and_tp: tuple[shardlab.plan.Plan, ...],
) -> None:
    dp, tp = dp_and_tp
    result = shardlab.compare(dp, tp)
    assert dp.cost is not None and tp.cost is not None
    assert sum(d.a for d in result.scopes) == pytest.approx(sum(dp.cost.op_times.values()))
    assert sum(d.b for d in result.scopes) == pytest.approx(sum(tp.cost.op_times.values()))
    names = {d.name for d in result.scopes}
    assert {"layers.0 compute", "layers.1 compute", "layers.0 comm"} <= names


def test_placements_that_differ_are_listed(dp_and_tp: tuple[shardlab.plan.Plan, ...]) -> None:
    dp, tp = dp_and_tp
    diff = {v: (a, b) for v, a, b in shardlab.compare(dp, tp).placements}
    assert diff["layers.0.mlp.up_proj.weight"] == ("R", "tp:S(1)")
    assert "tokens" not in diff  # sharded on the batch dim in both


def test_a_plan_compared_with_itself_has_no_deltas(
    dp_and_tp: tuple[shardlab.plan.Plan, ...],
) -> None:
    dp = dp_and_tp[0]
    result = shardlab.compare(dp, dp)
    assert all(d.delta == 0 for d in [*result.headline, *result.scopes, *result.collectives])
    assert result.placements == []


def test_saved_plans_reload_and_compare_on_the_cli(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    base = ["plan", "llama3-8b", "--set", "layers=2", "--cluster", "h100-sxm-1x8"]
    out = runner.invoke(app, [*base, "--mesh", "dp=8", "--template", "dp", "-o", str(a)])
    assert out.exit_code == 0, out.output
    assert "MFU" in out.output and "tokens/s" in out.output and "memory per rank" in out.output
    trace = tmp_path / "t.json"
    out = runner.invoke(app, [*base, "--mesh", "dp=2,tp=4", "--template", "dp", "--template",
                              "megatron_tp", "-o", str(b), "--trace", str(trace)])  # fmt: skip
    assert out.exit_code == 0, out.output
    assert json.loads(trace.read_text())["traceEvents"]
    saved = json.loads(a.read_text())
    reloaded = load_plan(a)
    assert reloaded.summary() == saved["summary"]
    result = runner.invoke(app, ["compare", str(a), str(b), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert {row["name"] for row in data["headline"]} >= {"step time (s)", "MFU", "tokens/s"}
    text = runner.invoke(app, ["compare", str(a), str(b)]).output
    assert "time per scope" in text and "placements that differ" in text


def test_a_broken_plan_file_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "shardlab.plan/1",\n "model": ')
    with pytest.raises(PlanFileError, match=r"bad\.json': invalid JSON at line 2"):
        load_plan(bad)
    bad.write_text('{"format": "other"}')
    with pytest.raises(PlanFileError, match=r"format must be 'shardlab\.plan/1'"):
        load_plan(bad)
    result = runner.invoke(app, ["compare", str(bad), str(bad)])
    assert result.exit_code == 1 and "format must be" in result.output


def test_save_plan_without_a_cluster_round_trips(tmp_path: Path) -> None:
    plan = build_plan("mlp_demo", Strategy.build("x=2", ["dp"]))
    path = save_plan(plan, tmp_path / "p.json")
    assert load_plan(path).summary() == plan.summary()
    with pytest.raises(Exception, match="--trace needs --cluster"):
        raise_from_cli(["plan", "mlp_demo", "--mesh", "x=2", "--trace", str(tmp_path / "t")])


def raise_from_cli(args: list[str]) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 1
    raise RuntimeError(result.output)


@pytest.mark.parametrize(
    ("value", "unit", "signed", "text"),
    [
        (1.21252, "s", False, "1.213 s"),
        (0.0421, "s", False, "42.1 ms"),
        (-3.5e-5, "s", True, "-35 µs"),
        (1.22138e11, "B", False, "113.7 GiB"),
        (8192, "B", True, "+8 KiB"),
        (0, "B", False, "0 B"),
        (0.351712, "%", False, "35.2%"),
        (0.296623, "%", True, "+29.7 pt"),
        (54049.2, "tok/s", False, "54,049/s"),
        (742, "", True, "+742"),
    ],
)
def test_figures_print_with_their_units(value: float, unit: str, signed: bool, text: str) -> None:
    assert show(value, unit, signed=signed) == text


def test_plans_of_different_batches_warn_and_lead_with_throughput(
    dp_and_tp: tuple[shardlab.plan.Plan, ...], tmp_path: Path
) -> None:
    dp, _ = dp_and_tp
    bigger = build_plan(build_model("llama3-8b", {**MODEL, "batch": 64}),
                        Strategy.build("dp=8", ["dp"]), cluster="h100-sxm-1x8")  # fmt: skip
    result = shardlab.compare(dp, bigger)
    assert result.warnings == [
        "the plans' global batch differs (A 8, B 64): a step does different work, so compare "
        "tokens/s, not step time"
    ]
    assert result.headline[0].name == "tokens/s"
    assert shardlab.compare(dp, dp).warnings == []  # same work: step time stays where it was
    assert shardlab.compare(dp, dp).headline[0].name == "program ops"
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    save_plan(dp, a)
    save_plan(bigger, b)
    text = runner.invoke(app, ["compare", str(a), str(b)]).output
    lines = text.splitlines()
    assert lines[3].startswith("warning: the plans' global batch differs (A 8, B 64)")
    headline = lines[lines.index("headline") + 1]
    assert headline.split()[0] == "tokens/s" and headline.count("/s") == 4
    step = next(line for line in lines if line.lstrip().startswith("step time"))
    assert step.count(" ms") == 3 and "e+" not in text  # seconds with units, no exponents
    mfu = next(line for line in lines if line.lstrip().startswith("MFU"))
    assert "%" in mfu and " pt" in mfu
    data = json.loads(runner.invoke(app, ["compare", str(a), str(b), "--json"]).output)
    assert data["warnings"] == result.warnings
    assert data["headline"][0]["unit"] == "tok/s" and isinstance(data["headline"][0]["a"], float)
