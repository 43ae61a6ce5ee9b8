"""The torch backend: every rank in its own process, collectives over torch.distributed (gloo).

Ranks are forked from one forkserver (`runtime.torch_launch`): the first run pays for its start,
later runs take a few seconds each.
"""

from __future__ import annotations

import re
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest
from typer.testing import CliRunner

from shardlab.cli import app
from shardlab.errors import ExecutionError
from shardlab.models import build_model
from shardlab.placement import Partial
from shardlab.plan import build_plan, save_plan
from shardlab.runtime import torchdist
from shardlab.runtime.hazards import P2P_KINDS, SYNC_KINDS
from shardlab.runtime.torch_launch import SETUP_ENV
from shardlab.runtime.verify import verify
from shardlab.strategy import Strategy

pytest.importorskip("torch.distributed")
SYNC = SYNC_KINDS | P2P_KINDS

LLAMA = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 64,
         "seq": 8, "batch": 8, "dtype": "float32"}  # fmt: skip
#: buckets small enough that the data-parallel passes issue several overlapped all-reduces
SMALL_BUCKETS = {"passes": {"dp_fuse_allreduce": {"bucket_mb": 0.01}}}


@pytest.mark.parametrize(
    ("mesh", "templates", "options"),
    [
        ("dp=2", ["dp"], SMALL_BUCKETS),
        ("tp=2", ["megatron_tp"], {}),
        ("tp=2", ["megatron_tp", "sequence_parallel"], {}),
        ("dp=2,tp=2", ["dp", "megatron_tp", "sequence_parallel"], {}),
        ("dp=2", ["fsdp"], {}),
    ],
)
def test_small_llama_step_on_torch_ranks(mesh: str, templates: list[str], options: dict) -> None:
    strategy = Strategy.build(mesh, templates, options=options)
    plan = build_plan(build_model("llama3-8b", LLAMA), strategy, optimizer="adamw")
    report = verify(plan, backend="torch")
    assert report.ok, report.failed()[:3]
    assert report.summary["compared"] >= 41 and all(c.ok for c in report.checks)
    if options is SMALL_BUCKETS:  # the async collectives of the dp passes, waited on
        reduces = [op for op in plan.program.ops if op.kind == "all_reduce"]
        assert len(reduces) > 1 and all(op.stream == "comm:dp" for op in reduces)
        assert any(op.kind == "wait" for op in plan.program.ops)


def test_local_compute_runs_as_torch_ops() -> None:
    plan = build_plan(build_model("llama3-8b", LLAMA), Strategy.build("tp=2", ["megatron_tp"]),
                      optimizer="adamw")  # fmt: skip
    report = verify(plan, backend="torch")
    assert report.ok, report.failed()[:3]
    counts = report.summary["torch_ops"]
    compute = [op for op in plan.program.ops if op.comm is None and op.kind not in SYNC]
    assert counts["torch"] + counts["numpy"] == 2 * len(compute)  # every rank's compute ops
    assert [row["rank"] for row in counts["per_rank"]] == [0, 1]
    # the rank-aware kernels (vocab-parallel embedding and loss, ...) run their torch versions
    assert "embedding_vocab_parallel" in {op.kernel for op in compute}
    assert counts["numpy"] == 0 and counts["numpy_kinds"] == []


def test_a_broken_torch_op_fails_verification_at_that_op(
    monkeypatch: pytest.MonkeyPatch, faults: ModuleType
) -> None:
    graph = build_model("llama3-8b", LLAMA)
    strategy = Strategy.build("tp=2", ["megatron_tp"])
    monkeypatch.setenv(SETUP_ENV, faults.SETUP_TORCH)
    report = verify(graph, strategy, backend="torch")
    assert not report.ok
    first = next(op for op in build_plan(graph, strategy).training.ops if op.kind == "linear")
    assert report.first_divergence == first.name
    assert verify(graph, strategy).ok  # the simulated backend never runs the torch op


def test_a_wrong_collective_fails_verification() -> None:
    plan = build_plan(build_model("llama3-8b", LLAMA), Strategy.build("tp=2", ["megatron_tp"]),
                      optimizer="sgd")  # fmt: skip
    ops = list(plan.program.ops)
    i = next(i for i, op in enumerate(ops) if op.kind == "all_reduce")
    step = ops[i].comm
    assert step is not None
    ops[i] = replace(ops[i], comm=replace(step, src=Partial("max")))  # max where sum is due
    broken = replace(plan, program=replace(plan.program, ops=ops))
    report = verify(broken, backend="torch")
    assert not report.ok and report.first_divergence is not None


def test_nproc_must_match_the_mesh() -> None:
    plan = build_plan(build_model("mlp_demo"), Strategy.build("x=2", ["dp"]), optimizer="sgd")
    with pytest.raises(ExecutionError, match=r"3 processes requested but the mesh .* has 2"):
        torchdist.run_torchdist(plan.program, {}, nproc=3)
    args = ["verify", "mlp_demo", "--mesh", "x=2", "--template", "dp", "--backend", "torch"]
    result = CliRunner().invoke(app, [*args, "--nproc", "3"])
    assert result.exit_code == 1
    assert "--nproc 3 does not match the mesh x=2, which has 2 ranks" in result.output


def test_missing_torch_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ExecutionError, match="backend 'torch' needs PyTorch"):
        verify(build_model("mlp_demo"), Strategy.build("x=2", ["dp"]), backend="torch")


def test_cli_and_module_entry_point(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["verify", "mlp_demo", "--mesh", "x=2", "--template", "dp", "--backend", "torch"]
    result = CliRunner().invoke(app, [*args, "--nproc", "2"])
    assert result.exit_code == 0 and result.output.startswith("PASS"), result.output
    ran = re.search(r"local compute: (\d+) of (\d+) ops ran as torch ops", result.output)
    assert ran is not None and 0 < int(ran[1]) <= int(ran[2]), result.output
    plan = build_plan(build_model("mlp_demo"), Strategy.build("x=2", [], ["w0=S(1)", "w1=S(0)"]),
                      optimizer="adamw")  # fmt: skip
    assert torchdist.main([str(save_plan(plan, tmp_path / "plan.json"))]) == 0
    assert capsys.readouterr().out.startswith("PASS")
