"""The `shardlab` command: models, show, export -> validate -> load, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shardlab.cli import app
from shardlab.models import PRESETS, build_model
from shardlab.validate import load_graph_file

runner = CliRunner()


def test_models_lists_every_preset() -> None:
    result = runner.invoke(app, ["models", "--json"])
    assert result.exit_code == 0
    assert [row["name"] for row in json.loads(result.output)] == list(PRESETS)


def test_show_reports_the_published_parameter_count() -> None:
    result = runner.invoke(app, ["show", "llama3-8b", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["params"] == 8_030_261_248
    assert summary["layers"] == 32
    assert summary["ops_by_kind"]["scaled_dot_product_attention"] == 32


def test_show_with_overrides_in_text_form() -> None:
    result = runner.invoke(app, ["show", "gpt2", "--set", "layers=2", "--set", "seq=128"])
    assert result.exit_code == 0, result.output
    assert "layers      2" in result.output
    assert "params      " in result.output and "FLOPs/step" in result.output


@pytest.mark.parametrize("name", list(PRESETS))
def test_export_validate_load_gives_an_identical_graph(name: str, tmp_path: Path) -> None:
    out = tmp_path / f"{name}.json"
    assert runner.invoke(app, ["export", name, "-o", str(out)]).exit_code == 0
    result = runner.invoke(app, ["validate", str(out)])
    assert result.exit_code == 0 and result.output.startswith("ok:")
    assert load_graph_file(out) == build_model(name)
    shown = json.loads(runner.invoke(app, ["show", str(out), "--json"]).output)
    assert shown["params"] == build_model(name).num_params()


def test_export_applies_overrides(tmp_path: Path) -> None:
    out = tmp_path / "small.json"
    assert (
        runner.invoke(app, ["export", "gpt2", "-o", str(out), "--set", "layers=3"]).exit_code == 0
    )
    assert load_graph_file(out) == build_model("gpt2", {"layers": 3})
    result = runner.invoke(app, ["show", str(out), "--set", "layers=2"])
    assert result.exit_code == 1 and "--set applies to presets" in result.output


def test_validate_fails_with_the_precise_error() -> None:
    bad = Path(__file__).parent.parent / "malformed" / "contracted_dim.json"
    result = runner.invoke(app, ["validate", str(bad)])
    assert result.exit_code == 1
    assert "op 'mm' (matmul): contracted dims disagree" in result.output


def test_unknown_preset_and_bad_override_exit_1() -> None:
    result = runner.invoke(app, ["show", "llama9"])
    assert result.exit_code == 1 and "unknown model preset 'llama9'" in result.output
    result = runner.invoke(app, ["show", "gpt2", "--set", "depth=2"])
    assert result.exit_code == 1 and "no setting 'depth'" in result.output


def test_installed_console_script_runs() -> None:
    exe = Path(sys.executable).parent / "shardlab"
    proc = subprocess.run([str(exe), "show", "gpt2", "--json"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["params"] == 124_439_808
