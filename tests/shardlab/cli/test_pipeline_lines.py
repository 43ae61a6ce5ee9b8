"""`shardlab plan` on a pp mesh says what its figures are: which bubble, why the stages hold
different numbers of layers, and the plan's memory line."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from shardlab.cli import app
from shardlab.summary import human_bytes

ARGS = ["plan", "llama3-8b", "--set", "layers=8", "--set", "batch=16", "--mesh", "pp=4,dp=2,tp=8",
        "--template", "dp", "--template", "megatron_tp", "--cluster", "h100-sxm-8x8",
        "--schedule", "1f1b", "--microbatches", "8"]  # fmt: skip


def test_a_pipelined_plan_explains_its_bubble_split_and_memory() -> None:
    result = CliRunner().invoke(app, ARGS)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    split = next(line for line in lines if line.strip().startswith("split "))
    counts = [int(n) for n in re.findall(r"split ([\d / ]+) layers", split)[0].split(" / ")]
    assert sum(counts) == 8 and len(set(counts)) > 1
    assert "stage 0 also runs the embedding and stage 3 the head and loss" in split
    assert "balances FLOPs" in split and split.count(" ms") == 1
    bubble = next(line for line in lines if "bubble" in line)
    found = re.search(r"bubble ([\d.]+)% of the step .* equal stages: ([\d.]+)%\)", bubble)
    assert found is not None, bubble
    assert float(found[2]) == 27.3  # (4 - 1) / (8 + 4 - 1)
    assert float(found[1]) < float(found[2])  # the layout overlaps what the formula cannot
    memory = next(line for line in lines if line.strip().startswith("memory per rank"))
    assert re.search(r"peak [\d.]+ GiB \(stage \d\) of 74.51 GiB$", memory), memory
    assert "(1 micro-batch in flight)" in result.output
    assert "1 micro-batches" not in result.output


def test_a_tied_embedding_names_its_all_reduce_with_size_and_time() -> None:
    args = ["plan", "gpt2", "--set", "layers=4", "--mesh", "pp=2,dp=2", "--template", "dp",
            "--cluster", "h100-sxm-1x8"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    tied = [line for line in result.output.splitlines() if "tied weight" in line]
    assert len(tied) == 1, result.output
    pattern = (
        r"embed\.weight is read on stages 0 and 1: .* all-reduced between them "
        r"\(Megatron-LM's embedding group\); ([\d.]+ MiB) per rank, ([\d.]+) ms"
    )
    found = re.search(pattern, tied[0])
    assert found is not None, tied[0]
    # gpt2's vocab x hidden gradient as float32 main grads (Megatron all-reduces main_grad,
    # not the bf16 gradient): 50257 x 768 x 4 bytes
    assert found[1] == human_bytes(50257 * 768 * 4)
    assert float(found[2]) > 0
