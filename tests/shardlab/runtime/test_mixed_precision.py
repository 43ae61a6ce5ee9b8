"""Mixed precision on the torch backend: bf16 values with fp32 masters, verified op by op.

`--dtype bfloat16` runs every rank in the dtypes the graph declares (`runtime.torch_device`,
precision "graph"); `runtime.mixed_precision` checks every op against itself computed
exactly on the run's own inputs, and the loss against the float32 reference.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest
from typer.testing import CliRunner

from shardlab.cli import app
from shardlab.errors import ExecutionError
from shardlab.models import build_model
from shardlab.plan import build_plan
from shardlab.runtime import mixed_precision as mixed
from shardlab.runtime.torch_launch import SETUP_ENV
from shardlab.runtime.verify import verify
from shardlab.strategy import Strategy

torch = pytest.importorskip("torch")

TINY = {"layers": 2, "hidden": 64, "heads": 4, "seq": 16, "batch": 8, "vocab": 128,
        "dtype": "bfloat16"}  # fmt: skip
LLAMA = {**TINY, "kv_heads": 2, "ffn": 128}


def test_round_to_bfloat16_matches_torch() -> None:
    x = np.random.default_rng(0).standard_normal(10_000).astype(np.float32) * 100
    x[:4] = [1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, -0.0, 65504.0]  # ties round to even
    want = torch.from_numpy(x).to(torch.bfloat16).float().numpy()
    assert np.array_equal(mixed.round_to(x, "bfloat16"), want)
    assert mixed.round_to(x, "float16").dtype == np.float32
    assert np.array_equal(mixed.round_to(x, "float32"), x)


def test_normwise_comparison() -> None:
    want = np.array([3.0, 4.0])  # norm 5
    assert mixed.compare_normwise(want * 1.004, want, 1e-2)[2]
    max_abs, rel, ok = mixed.compare_normwise(want * 1.02, want, 1e-2)
    assert not ok and rel == pytest.approx(0.02) and max_abs == pytest.approx(0.08)
    assert mixed.compare_normwise(np.zeros(2), np.zeros(2))[2]


@pytest.mark.parametrize(
    ("model", "mesh", "templates"),
    [
        ("gpt2", "dp=2", ["dp"]),
        ("llama3-8b", "tp=2", ["megatron_tp", "sequence_parallel"]),
        ("gpt2", "dp=2,tp=2", ["dp", "megatron_tp"]),
        ("llama3-8b", "dp=2", ["zero2"]),
        ("gpt2", "dp=2", ["fsdp"]),
    ],
)
def test_bf16_plans_verify_on_torch_ranks(model: str, mesh: str, templates: list[str]) -> None:
    graph = build_model(model, LLAMA if model == "llama3-8b" else TINY)
    report = verify(graph, Strategy.build(mesh, templates), compute_dtype="bfloat16",
                    backend="torch")  # fmt: skip
    assert report.ok, report.failed()[:3]
    assert report.compute_dtype == "bfloat16"
    # every op within a few bf16 roundings of itself computed exactly; the loss of the whole
    # step within 2% of float32's
    assert max(c.max_rel for c in report.checks[1:]) < mixed.LOCAL_RTOL / 2
    assert report.checks[0].kind == "loss" and report.checks[0].max_rel < 5e-3
    # the master weights and moments are checked, beside the bf16 params and gradients
    names = {c.name for c in report.checks}
    assert any(".master" in n for n in names) and any("exp_avg_sq" in n for n in names)


def test_bf16_pipeline_verifies_every_stage_op() -> None:
    graph = build_model("llama3-8b", {**LLAMA, "layers": 4})
    pipeline = {"pipeline": {"schedule": "1f1b", "microbatches": 4}}
    strategy = Strategy.build("pp=2,dp=2", ["dp"], options=pipeline)
    report = verify(graph, strategy, compute_dtype="bfloat16", backend="torch")
    assert report.ok, report.failed()[:3]
    names = {c.name for c in report.checks}
    assert any(n.endswith("#3") for n in names)  # each micro-batch's gradients, by stage op
    assert report.summary["schedule"] == "1f1b"


def test_a_two_percent_kernel_error_fails_in_bf16_at_that_op(
    monkeypatch: pytest.MonkeyPatch, faults: ModuleType
) -> None:
    graph = build_model("llama3-8b", LLAMA)
    strategy = Strategy.build("tp=2", ["megatron_tp"])
    monkeypatch.setenv(SETUP_ENV, faults.SETUP_TORCH)
    report = verify(graph, strategy, compute_dtype="bfloat16", backend="torch")
    assert not report.ok
    first = next(op for op in build_plan(graph, strategy).training.ops if op.kind == "linear")
    assert report.first_divergence == first.name


def test_what_cannot_run_mixed_is_refused() -> None:
    strategy = Strategy.build("dp=2", ["dp"])
    with pytest.raises(ExecutionError, match="use --backend torch"):
        verify(build_model("gpt2", TINY), strategy, compute_dtype="bfloat16")
    with pytest.raises(ExecutionError, match=r"declares no 16-bit floats.*dtype=bfloat16"):
        verify(build_model("gpt2", {**TINY, "dtype": "float32"}), strategy,
               compute_dtype="bfloat16", backend="torch")  # fmt: skip


def test_cli_verifies_in_bfloat16() -> None:
    sets = [x for k, v in TINY.items() for x in ("--set", f"{k}={v}")]
    args = ["verify", "gpt2", *sets, "--mesh", "dp=2", "--template", "dp"]
    result = CliRunner().invoke(app, [*args, "--backend", "torch", "--dtype", "bfloat16"])
    assert result.exit_code == 0, result.output
    assert "tensors compared in bfloat16" in result.output
