"""`shardlab import`: a module file or a Hugging Face config -> a graph file `plan` reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("torch")
pytest.importorskip("transformers")

from shardlab.cli import app
from shardlab.validate import load_graph_file

runner = CliRunner()

MODULE = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(16, 32)
        self.down = nn.Linear(32, 16)

    def forward(self, x, target):
        y = self.down(torch.relu(self.up(x)))
        return torch.nn.functional.mse_loss(y, target)


def build():
    x = torch.zeros(4, 16)
    return Net(), (x, x)


def build_alone():
    return Net()
"""


def test_import_module_file_then_plan_it(tmp_path: Path) -> None:
    source = tmp_path / "net.py"
    source.write_text(MODULE)
    out = tmp_path / "net.json"
    result = runner.invoke(app, ["import", f"{source}:build", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "1,072 params" in result.output  # 16*32 + 32 + 32*16 + 16
    graph = load_graph_file(out)
    assert graph.num_params() == 1072
    assert graph.ops_by_kind()["mse_loss"] == 1
    planned = runner.invoke(app, ["plan", str(out), "--mesh", "dp=2", "--template", "dp"])
    assert planned.exit_code == 0, planned.output


def test_import_module_with_inputs_from_the_command_line(tmp_path: Path) -> None:
    source = tmp_path / "net.py"
    source.write_text(MODULE)
    out = tmp_path / "net.json"
    args = ["import", f"{source}:build_alone", "-o", str(out),
            "--input", "x=8x16:float32", "--input", "target=8x16"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert load_graph_file(out).type_of("x").shape == (8, 16)
    missing = runner.invoke(app, ["import", f"{source}:build_alone", "-o", str(out)])
    assert missing.exit_code == 1 and "--input" in missing.output
    bad = runner.invoke(app, ["import", f"{source}:nothing", "-o", str(out)])
    assert bad.exit_code == 1 and "no function 'nothing'" in bad.output


def test_import_hf_config(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 128, "max_position_embeddings": 64,
    }))  # fmt: skip
    out = tmp_path / "llama.json"
    args = ["import", "--hf-config", str(config), "--batch", "2", "--seq", "16", "-o", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "26,784 params" in result.output and "opaque" not in result.output
    assert load_graph_file(out).type_of("input_ids").shape == (2, 16)
    config.write_text(json.dumps({"model_type": "t5"}))
    refused = runner.invoke(app, ["import", "--hf-config", str(config), "-o", str(out)])
    assert refused.exit_code == 1
    assert "unsupported model_type 't5' in field 'model_type'" in refused.output
