"""The CI gate: `shardlab.check` judges real plans against budgets, and `shardlab check
--local` prints the Markdown verdict, writes JUnit XML and exits 0 / 1 / 2."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shardlab.check import Budgets, CheckError, judge, markdown_text
from shardlab.cli import app
from shardlab.models import build_model
from shardlab.plan import build_plan
from shardlab.strategy import Strategy

runner = CliRunner()
SMALL = ["llama3-8b", "--set", "layers=2", "--cluster", "h100-sxm-1x8"]
DP = ["--mesh", "dp=8", "--template", "dp"]
TP = ["--mesh", "dp=2,tp=4", "--template", "dp", "--template", "megatron_tp"]


@pytest.fixture(scope="module")
def summaries() -> dict[str, dict]:
    """Plan summaries of llama3-8b: 2 layers with data parallelism and with tensor
    parallelism, and all 32 layers with plain data parallelism (over the memory)."""
    small, whole = build_model("llama3-8b", {"layers": 2}), build_model("llama3-8b")
    dp, tp = Strategy.build("dp=8", ["dp"]), Strategy.build("dp=2,tp=4", ["dp", "megatron_tp"])
    return {
        "dp": build_plan(small, dp, cluster="h100-sxm-1x8").summary(),
        "tp": build_plan(small, tp, cluster="h100-sxm-1x8").summary(),
        "oom": build_plan(whole, dp, cluster="h100-sxm-1x8").summary(),
    }


def test_every_budget_is_named_with_its_figure(summaries) -> None:
    dp, tp = summaries["dp"], summaries["tp"]
    step = dp["cost"]["step_time_s"]
    verdict = judge(dp, Budgets(max_step_time_s=2 * step, max_fallback_ops=0, min_mfu=0.01))
    assert verdict.passed
    assert [r.budget for r in verdict.results] == ["must_fit", "max_step_time_s",
                                                   "max_fallback_ops", "min_mfu"]  # fmt: skip
    assert verdict.results[1].figure == f"{step * 1e3:.1f} ms"
    slower = step / tp["cost"]["step_time_s"] - 1
    assert slower > 0.05  # data parallelism of this 2-layer model is slower than dp x tp
    regressed = judge(dp, Budgets(max_regression_pct=5), baseline=tp)
    assert not regressed.passed
    (result,) = [r for r in regressed.results if r.budget == "max_regression_pct"]
    assert result.figure.startswith(f"{slower * 100:+.1f}%") and not result.passed
    assert judge(dp, Budgets(max_regression_pct=0), baseline=dp).passed
    oom = judge(summaries["oom"], Budgets())
    assert not oom.passed and oom.results[0].budget == "must_fit"
    assert judge(summaries["oom"], Budgets(must_fit=False)).passed


def test_bad_budgets_are_refused_by_name(summaries) -> None:
    with pytest.raises(CheckError, match="budget max_step_time_s must be a number >= 0, got -1"):
        Budgets(max_step_time_s=-1)
    with pytest.raises(CheckError, match="min_mfu is a fraction"):
        Budgets(min_mfu=40)
    with pytest.raises(CheckError, match="needs a baseline"):
        judge(summaries["dp"], Budgets(max_regression_pct=5))
    unpriced = build_plan(build_model("llama3-8b", {"layers": 2}), Strategy.build("dp=8", ["dp"]))
    with pytest.raises(CheckError, match="no predicted cost"):
        judge(unpriced.summary(), Budgets())


def test_markdown_and_junit_say_what_failed(summaries) -> None:
    verdict = judge(summaries["dp"], Budgets(max_regression_pct=5), baseline=summaries["tp"])
    text = verdict.markdown(link="http://shardlab/#/plans/7")
    assert text.startswith("❌ **Shardlab check failed**") and "(max_regression_pct)" in text
    assert "| max_regression_pct |" in text and "**FAIL**" in text
    assert "[Open the plan in Shardlab](http://shardlab/#/plans/7)" in text
    suite = ET.fromstring(verdict.junit())
    assert suite.get("tests") == "2" and suite.get("failures") == "1"
    failed = [c for c in suite.iter("testcase") if c.find("failure") is not None]
    assert [c.get("name") for c in failed] == ["max_regression_pct"]


def test_a_hostile_plan_name_is_text_in_the_markdown(summaries) -> None:
    verdict = judge({**summaries["dp"], "model": "m [click](http://evil.example) ![i](x)\n# H"},
                    Budgets())  # fmt: skip
    head = verdict.markdown().splitlines()[0]
    assert "\\[click\\](http://evil.example) \\!\\[i\\](x) # H" in head
    assert verdict.markdown().count("\n") == len(verdict.results) + 4  # no line of its own
    assert markdown_text("a|b_c*d`e<f>~g\\h") == "a\\|b\\_c\\*d\\`e\\<f\\>\\~g\\\\h"


def test_a_deleted_baseline_fails_the_regression_budget_saying_why(summaries) -> None:
    verdict = judge(summaries["dp"], Budgets(max_regression_pct=5),
                    baseline_gone="its plan was deleted")  # fmt: skip
    (result,) = [r for r in verdict.results if r.budget == "max_regression_pct"]
    assert not result.passed and result.figure == "its plan was deleted"
    assert not verdict.passed


def test_cli_check_exits_0_on_pass_1_on_fail_2_on_error(tmp_path: Path) -> None:
    base = tmp_path / "base.json"
    out = runner.invoke(app, ["plan", *SMALL, *TP, "-o", str(base)])
    assert out.exit_code == 0, out.output
    check = ["check", *SMALL, "--local"]
    same = runner.invoke(app, [*check, *TP, "--baseline", str(base), "--max-regression-pct", "5"])
    assert same.exit_code == 0, same.output
    assert "✅ **Shardlab check passed**" in same.output
    report = tmp_path / "junit.xml"
    slower = runner.invoke(app, [*check, *DP, "--baseline", str(base), "--max-regression-pct",
                                 "5", "--junit", str(report)])  # fmt: skip
    assert slower.exit_code == 1, slower.output
    assert "❌ **Shardlab check failed**" in slower.output and "max_regression_pct" in slower.output
    assert ET.fromstring(report.read_text()).get("failures") == "1"
    oom = runner.invoke(app, ["check", "llama3-8b", "--cluster", "h100-sxm-1x8", "--local", *DP])
    assert oom.exit_code == 1 and "| must_fit |" in oom.output
    # a batch of 2 over dp=3: the dp template names the batch that does not divide
    odd = [*check, "--set", "batch=2", "--mesh", "dp=3", "--template", "dp"]
    for bad, says in (([*check, *DP, "--max-step-time-s", "-1"], "max_step_time_s must be"),
                      ([*check, *DP, "--max-regression-pct", "5"], "needs --baseline"),
                      (["check", *SMALL, *DP], "say where to build the plan"),
                      (odd, "has a batch of 2, which does not divide")):  # fmt: skip
        result = runner.invoke(app, bad)
        assert result.exit_code == 2, (bad, result.output)
        assert says in result.output
