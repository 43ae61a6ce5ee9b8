"""`shardlab complete` and `shardlab explain`."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from shardlab.cli import app

runner = CliRunner()
SMALL = ["--set", "layers=2"]


def test_complete_prints_placements_and_counts() -> None:
    args = ["complete", "llama3-8b", "--mesh", "dp=8,tp=8", "--template", "dp",
            "--template", "megatron_tp", *SMALL]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "layers.0.mlp.up_proj.weight" in result.output
    assert "fallback ops  0" in result.output
    data = json.loads(runner.invoke(app, [*args, "--json"]).output)
    assert data["placements"]["layers.1.mlp.down_proj.weight"] == "RS(0)"
    assert data["placements"]["tokens"] == "S(0)R"
    assert data["fallback_ops"] == []
    assert data["reshards"] > 0


def test_complete_with_user_annotations_on_the_seed_demo() -> None:
    result = runner.invoke(app, ["complete", "mlp_demo", "--mesh", "x=2", "--annotate", "w0=S(1)",
                                 "--annotate", "w1=S(0)", "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    placements = json.loads(result.output)["placements"]
    assert placements["y"] == "S(1)" and placements["z"] == "P(sum)"


def test_explain_names_the_template() -> None:
    result = runner.invoke(app, ["explain", "llama3-8b", "--mesh", "dp=2,tp=2", "--template", "dp",
                                 "--template", "megatron_tp", *SMALL, "--value",
                                 "layers.0.mlp_norm"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.output.startswith("layers.0.mlp_norm: S(0)R")
    assert "template:megatron_tp" in result.output


def test_errors_exit_1_with_the_culprit() -> None:
    result = runner.invoke(app, ["complete", "mlp_demo", "--mesh", "x=2", "--annotate", "w9=S(0)"])
    assert result.exit_code == 1 and "matches no value" in result.output
    # the dp template trains every rank on as many samples: 16 over 3 ranks is refused,
    # naming the input and its batch (an annotation may still split it unevenly)
    result = runner.invoke(app, ["complete", "mlp_demo", "--mesh", "x=3", "--template", "dp"])
    assert result.exit_code == 1
    assert "input 'x' has a batch of 16, which does not divide over the 3 ranks" in result.output
    result = runner.invoke(app, ["complete", "mlp_demo", "--mesh", "x=3", "--annotate", "x=S(0)"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["explain", "mlp_demo", "--mesh", "x=2", "--value", "nope"])
    assert result.exit_code == 1 and "no value 'nope'" in result.output


def test_microbatches_on_a_mesh_without_pp_accumulate_gradients() -> None:
    """`--microbatches 2` on a flat mesh was silently ignored (issue 34): it accumulates the
    gradients of 2 micro-batches (strategy option `microbatches`); `--virtual-stages` is
    refused, naming the mesh."""
    small = ["llama3-8b", "--set", "layers=2", "--set", "batch=32", "--mesh", "dp=8",
             "--template", "dp"]  # fmt: skip
    result = runner.invoke(
        app, ["plan", *small, "--cluster", "h100-sxm-1x8", "--microbatches", "2"]
    )
    assert result.exit_code == 0, result.output
    assert "gradient accumulation: 2 micro-batches one after another" in result.output
    assert "(one micro-batch)" in result.output and "pp=1" not in result.output
    check = ["check", *small, "--local", "--cluster", "h100-sxm-1x8", "--json"]
    result = runner.invoke(app, [*check, "--microbatches", "2"])
    assert result.exit_code == 0, result.output
    for command in (["plan", *small], ["check", *small, "--local", "--cluster", "h100-sxm-1x8"]):
        result = runner.invoke(app, [*command, "--microbatches", "0"])
        assert result.exit_code != 0
        assert "option 'microbatches' must be a positive integer, got 0" in result.output
        result = runner.invoke(app, [*command, "--virtual-stages", "2"])
        assert result.exit_code != 0
        assert "--virtual-stages 2 needs a 'pp' mesh axis" in result.output
