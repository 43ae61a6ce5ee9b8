"""Exit codes scripts and CI can gate on: `plan --fail-if-oom`, `compare --fail-if-slower`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shardlab.cli import app

runner = CliRunner()
SMALL = ["llama3-8b", "--set", "layers=2", "--cluster", "h100-sxm-1x8"]


def test_plan_fails_if_oom_only_when_asked_and_says_by_how_much() -> None:
    # Llama-3-8B with plain data parallelism: 18 bytes a parameter, more than 80 GB a rank
    whole = ["plan", "llama3-8b", "--cluster", "h100-sxm-1x8", "--mesh", "dp=8", "--template",
             "dp"]  # fmt: skip
    out = runner.invoke(app, whole)
    assert out.exit_code == 0, out.output
    assert "DOES NOT FIT" in out.output
    out = runner.invoke(app, [*whole, "--fail-if-oom"])
    assert out.exit_code == 1
    assert "FAIL (--fail-if-oom): peak memory per rank" in out.output
    assert "does not fit in" in out.output
    fits = runner.invoke(app, ["plan", *SMALL, "--mesh", "dp=8", "--template", "dp",
                               "--fail-if-oom"])  # fmt: skip
    assert fits.exit_code == 0, fits.output
    assert "FAIL" not in fits.output


def test_plan_fails_if_oom_on_a_pipeline_too() -> None:
    piped = ["plan", "llama3-8b", "--cluster", "h100-sxm-1x8", "--mesh", "pp=2,dp=4",
             "--template", "dp", "--microbatches", "2", "--fail-if-oom"]  # fmt: skip
    out = runner.invoke(app, piped)
    assert out.exit_code == 1, out.output
    assert "FAIL (--fail-if-oom)" in out.output


def test_fail_if_oom_needs_a_cluster() -> None:
    out = runner.invoke(app, ["plan", "mlp_demo", "--mesh", "x=2", "--fail-if-oom"])
    assert out.exit_code == 1
    assert "--fail-if-oom needs --cluster" in out.output


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, float]:
    """Two costed plans of one model, the faster first, and B's step over A's."""
    tmp = tmp_path_factory.mktemp("gates")
    paths = {}
    for name, mesh, templates in (("dp", "dp=8", ["dp"]),
                                  ("tp", "dp=2,tp=4", ["dp", "megatron_tp"])):  # fmt: skip
        path = tmp / f"{name}.json"
        flags = [x for t in templates for x in ("--template", t)]
        out = runner.invoke(app, ["plan", *SMALL, "--mesh", mesh, *flags, "-o", str(path)])
        assert out.exit_code == 0, out.output
        paths[name] = path
    steps = {n: json.loads(p.read_text())["summary"]["cost"]["step_time_s"]
             for n, p in paths.items()}  # fmt: skip
    fast, slow = sorted(paths, key=steps.__getitem__)
    return paths[fast], paths[slow], steps[slow] / steps[fast] - 1


def test_compare_fails_if_b_is_slower_than_the_threshold(saved) -> None:
    fast, slow, regression = saved
    assert regression > 0.01
    out = runner.invoke(app, ["compare", str(fast), str(slow), "--fail-if-slower", "1"])
    assert out.exit_code == 1
    assert f"is {regression:+.1%} against A's" in out.output
    above = f"{regression * 100 + 1:.1f}"
    assert runner.invoke(app, ["compare", str(fast), str(slow), "--fail-if-slower", above]
                         ).exit_code == 0  # fmt: skip
    faster = runner.invoke(app, ["compare", str(slow), str(fast), "--fail-if-slower", "0"])
    assert faster.exit_code == 0, faster.output


def test_compare_gate_refuses_bad_input(saved, tmp_path: Path) -> None:
    fast, slow, _ = saved
    out = runner.invoke(app, ["compare", str(fast), str(slow), "--fail-if-slower", "-1"])
    assert out.exit_code == 1 and "--fail-if-slower must be a percentage >= 0, got -1" in out.output
    bare = tmp_path / "bare.json"
    out = runner.invoke(app, ["plan", "llama3-8b", "--set", "layers=2", "--mesh", "dp=8",
                              "--template", "dp", "-o", str(bare)])  # fmt: skip
    assert out.exit_code == 0, out.output
    out = runner.invoke(app, ["compare", str(fast), str(bare), "--fail-if-slower", "5"])
    assert out.exit_code == 1
    assert f"{bare} was saved without --cluster" in out.output
