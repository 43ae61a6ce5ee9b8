"""The torch backend on more models and meshes: GPT, ZeRO-2, 4 ranks and pipelines.

Every rank is its own gloo process (`runtime.torch_launch`); pipelines run each stage's
program on its ranks with real send/recv between stages (`runtime.torch_pipeline`). A
broken kernel reaches the ranks through the rank setup hook (`torch_faults.py`).
"""

from __future__ import annotations

from dataclasses import replace
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from shardlab.autodiff import training_graph
from shardlab.cli import app
from shardlab.errors import ExecutionError
from shardlab.models import build_model
from shardlab.passes.pipeline import PipelineProgram, build_pipeline
from shardlab.plan import build_plan
from shardlab.runtime import kernels, torchdist
from shardlab.runtime.distribute import assemble
from shardlab.runtime.pipeline_exec import verify_pipeline
from shardlab.runtime.reference import run_reference, source_values
from shardlab.runtime.torch_launch import SETUP_ENV
from shardlab.runtime.torch_pipeline import run_pipeline_torch
from shardlab.runtime.verify import verify
from shardlab.strategy import Strategy

pytest.importorskip("torch.distributed")

#: gpt2 ties its embeddings: a pipeline's first and last stage each hold a replica and
#: all-reduce its gradient (Megatron-LM's embedding group)
GPT = {"layers": 2, "hidden": 64, "heads": 4, "seq": 8, "batch": 8, "vocab": 128,
       "dtype": "float32"}  # fmt: skip
PP4 = {"schedule": "1f1b", "microbatches": 4}
#: four layers: interleaved pipelines need pp x virtual stages chunks of at least one layer
LLAMA = {"layers": 4, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 64,
         "seq": 8, "batch": 8, "dtype": "float32"}  # fmt: skip
ONE_F_ONE_B = {"schedule": "1f1b", "microbatches": 2}
INTERLEAVED = {"schedule": "interleaved", "microbatches": 2, "virtual_stages": 2}
SP = ["megatron_tp", "sequence_parallel"]


def _strategy(mesh: str, templates: list[str], pipeline: dict[str, Any] | None) -> Strategy:
    options = {"pipeline": pipeline} if pipeline is not None else {}
    return Strategy.build(mesh, templates, options=options)


@pytest.mark.parametrize(
    ("mesh", "templates", "annotations"),
    [
        ("x=2", ["dp"], []),
        ("x=2", [], ["w0=S(1)", "w1=S(0)"]),
        ("x=4", ["dp"], []),
        ("x=4", [], ["w0=S(1)", "w1=S(0)"]),
    ],
)
def test_mlp_demo_dp_and_model_parallel(
    mesh: str, templates: list[str], annotations: list[str]
) -> None:
    report = verify(build_model("mlp_demo"), Strategy.build(mesh, templates, annotations),
                    backend="torch")  # fmt: skip
    assert report.ok, report.failed()[:3]


@pytest.mark.parametrize(
    ("model", "config", "mesh", "templates", "pipeline"),
    [
        ("gpt2", GPT, "dp=2", ["dp"], None),
        ("gpt2", GPT, "tp=2", ["megatron_tp"], None),
        ("gpt2", GPT, "tp=2", SP, None),
        ("gpt2", GPT, "dp=2", ["fsdp"], None),
        ("gpt2", GPT, "dp=2", ["zero2"], None),
        ("gpt2", GPT, "dp=2,tp=2", ["dp", *SP], None),
        ("gpt2", GPT, "dp=4", ["fsdp"], None),
        ("gpt2", GPT, "dp=2,tp=2", ["zero2", "megatron_tp"], None),
        ("gpt2", GPT, "pp=2", [], ONE_F_ONE_B),
        ("gpt2", {**GPT, "layers": 4}, "pp=2", [], INTERLEAVED),
        ("gpt2", GPT, "pp=2,tp=2", ["megatron_tp"], ONE_F_ONE_B),
        ("gpt2", GPT, "pp=2,dp=2", ["dp"], ONE_F_ONE_B),
        ("gpt2", {**GPT, "layers": 4}, "pp=4", [], PP4),
        ("llama3-8b", LLAMA, "dp=2", ["zero2"], None),
        ("llama3-8b", LLAMA, "tp=4", SP, None),
        ("llama3-8b", LLAMA, "dp=4", ["fsdp"], None),
        ("llama3-8b", LLAMA, "dp=2,tp=2", ["zero2", "megatron_tp"], None),
        ("llama3-8b", LLAMA, "pp=2", [], ONE_F_ONE_B),
        ("llama3-8b", LLAMA, "pp=2", [], INTERLEAVED),
        ("llama3-8b", LLAMA, "pp=4", [], PP4),
        ("llama3-8b", LLAMA, "pp=2,dp=2", ["dp"], {"schedule": "1f1b", "microbatches": 4}),
        ("llama3-8b", LLAMA, "pp=2,dp=2", ["zero2"], ONE_F_ONE_B),
        ("llama3-8b", LLAMA, "pp=2,dp=2", ["fsdp"], INTERLEAVED),
        ("llama3-8b", LLAMA, "pp=2,tp=2", SP, INTERLEAVED),
    ],
)
def test_step_on_torch_ranks(
    model: str,
    config: dict[str, Any],
    mesh: str,
    templates: list[str],
    pipeline: dict[str, Any] | None,
) -> None:
    report = verify(build_model(model, config), _strategy(mesh, templates, pipeline),
                    backend="torch")  # fmt: skip
    assert report.ok, report.failed()[:3]
    assert report.summary["compared"] > 40 and all(c.ok for c in report.checks)
    if pipeline is not None:
        assert report.summary["schedule"] == pipeline["schedule"]


def _recv_the_second_micro_batch_first(pipeline: PipelineProgram) -> PipelineProgram:
    """Stage 1 receives stage 0's activation of micro-batch 1 before that of micro-batch 0,
    which stage 0 sends first."""
    stage = pipeline.stages[1]
    ops = list(stage.ops)
    first, second = [
        i for i, op in enumerate(ops) if op.kind == "recv" and op.attrs["peer_stage"] == 0
    ][:2]
    ops = [*ops[:first], ops[second], *ops[first:second], *ops[second + 1 :]]
    stages = [*pipeline.stages[:1], replace(stage, ops=ops), *pipeline.stages[2:]]
    return replace(pipeline, stages=stages)


def test_a_stage_may_receive_in_another_order_than_its_peer_sent() -> None:
    report = verify_pipeline("llama3-8b", Strategy.build("pp=2", []), microbatches=2,
                             overrides=LLAMA, transform=_recv_the_second_micro_batch_first,
                             backend="torch")  # fmt: skip
    assert report.ok, report.failed()[:3]


@pytest.mark.parametrize(("mesh", "templates", "layers", "m", "dtype"),
                         [("pp=4", [], 4, 4, "float32"), ("pp=2,dp=2", ["dp"], 2, 2, "float32"),
                          ("pp=2,dp=2", ["dp"], 2, 2, "bfloat16")])  # fmt: skip
def test_tied_replicas_are_equal_on_torch_ranks_after_a_step(
    mesh: str, templates: list[str], layers: int, m: int, dtype: str
) -> None:
    """The first and last stage's replicas of the tied embedding (and its Adam moments) are
    bit-identical on every rank after the step, and equal the one-device update; in bf16
    the stages exchange and sum float32 main gradients (Megatron-LM's main_grad)."""
    config = {**GPT, "layers": layers, "dtype": dtype}
    micro = build_model("gpt2", {**config, "batch": GPT["batch"] // m})
    pipeline = build_pipeline(micro, Strategy.build(mesh, templates), microbatches=m)
    full = training_graph(build_model("gpt2", config))
    env = run_reference(full)
    blocks = run_pipeline_torch(pipeline, {v.name: env[v.name] for v in source_values(full)})
    first, last = pipeline.stages[0], pipeline.stages[-1]
    sent = [op.inputs[0] for op in first.ops if op.name.startswith("tied_all_reduce:")
            and op.kind == "send"]  # fmt: skip
    assert [first.types[v].dtype for v in sent] == ["float32"]
    for serial in ("embed.weight.new", "embed.weight.exp_avg.new", "embed.weight.exp_avg_sq.new"):
        a, b = first.values[serial], last.values[serial]
        for r0, r1 in zip(first.mesh.ranks, last.mesh.ranks, strict=True):
            assert blocks[0][a][r0].tobytes() == blocks[-1][b][r1].tobytes()
        got = assemble(blocks[-1][b], last.specs[b], last.types[b].shape)
        np.testing.assert_allclose(got, env[serial], rtol=0, atol=1e-9)


def test_a_broken_kernel_fails_at_the_same_op_as_on_the_simulated_mesh(
    monkeypatch: pytest.MonkeyPatch, faults: ModuleType
) -> None:
    graph = build_model("llama3-8b", LLAMA)
    strategy = Strategy.build("tp=2", ["megatron_tp"])
    monkeypatch.setitem(
        kernels.KERNELS, "default", faults.linear_two_percent_off(kernels.KERNELS["default"])
    )
    simulated = verify(graph, strategy)
    monkeypatch.setitem(kernels.KERNELS, "default", kernels.default_kernel)
    monkeypatch.setenv(SETUP_ENV, faults.SETUP)
    report = verify(graph, strategy, backend="torch")
    assert not report.ok and not simulated.ok
    first = next(op for op in build_plan(graph, strategy).training.ops if op.kind == "linear")
    assert report.first_divergence == simulated.first_divergence == first.name


def test_a_broken_kernel_fails_a_pipeline(
    monkeypatch: pytest.MonkeyPatch, faults: ModuleType
) -> None:
    monkeypatch.setenv(SETUP_ENV, faults.SETUP)
    report = verify(build_model("llama3-8b", LLAMA), _strategy("pp=2", [], ONE_F_ONE_B),
                    backend="torch")  # fmt: skip
    assert not report.ok
    assert report.first_divergence == "loss"
    assert report.failed()[0].name == "loss" and len(report.failed()) > 1


def test_a_flat_run_refuses_a_stage_program() -> None:
    graph = build_model("llama3-8b", {**LLAMA, "batch": 4})
    stage = build_pipeline(graph, Strategy.build("pp=2", []), microbatches=2).stages[0]
    send = next(op for op in stage.ops if op.kind == "send")
    value = send.inputs[0]
    only_the_send = replace(stage, ops=[replace(send, deps=())])
    with pytest.raises(ExecutionError, match="send needs a pipeline's stage-to-stage"):
        torchdist.run_torchdist(only_the_send, {value: np.zeros(stage.types[value].shape)})


@pytest.mark.parametrize(
    ("mesh", "extra"),
    [
        ("pp=2", ["--nproc", "2", "--schedule", "1f1b", "--microbatches", "2"]),
        ("pp=2,tp=2", ["--template", "megatron_tp", "--nproc", "4", "--schedule",
                       "interleaved", "--virtual-stages", "2", "--microbatches", "2"]),
    ],
)  # fmt: skip
def test_cli_verifies_a_pipeline_on_torch_ranks(mesh: str, extra: list[str]) -> None:
    sets = [arg for k, v in LLAMA.items() for arg in ("--set", f"{k}={v}")]
    args = ["verify", "llama3-8b", *sets, "--mesh", mesh, "--backend", "torch", *extra]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert result.output.startswith("PASS") and "pipeline" in result.output
