"""Tied weights across pipeline stages (Megatron-LM's embedding group), on the simulated mesh.

GPT ties `lm_head` to `embed.weight`: the first stage reads it in the embedding, the last in
the head. Each holds a replica, accumulates its partial gradient over the micro-batches, the
two all-reduce it after their last backward unit and run the same optimizer step, so after one
step both replicas are bit-identical and equal the one-device update.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from shardlab.autodiff import training_graph
from shardlab.cli import app
from shardlab.models import build_model
from shardlab.passes.pipeline import PipelineProgram, build_pipeline
from shardlab.passes.pipeline_passes import apply_stage_passes
from shardlab.passes.send_wait import pipeline_send_wait
from shardlab.placement import local_shape
from shardlab.runtime.distribute import assemble
from shardlab.runtime.pipeline_exec import run_pipeline_blocks, verify_pipeline
from shardlab.runtime.pipeline_interleave import run_pipeline_interleavings
from shardlab.runtime.reference import run_reference, source_values
from shardlab.strategy import Strategy

GPT = {"layers": 2, "hidden": 64, "heads": 4, "seq": 8, "batch": 8, "vocab": 128,
       "dtype": "float32"}  # fmt: skip
TIED = "embed.weight"
REASON = (
    "tied weight embed.weight is read on stages 0 and {last}: its gradient is all-reduced "
    "between them (Megatron-LM's embedding group)"
)


def _build(mesh: str, templates: list[str], m: int, schedule: str = "1f1b",
           layers: int = 2) -> tuple[PipelineProgram, dict[str, Any]]:  # fmt: skip
    config = {**GPT, "layers": layers}
    micro = build_model("gpt2", {**config, "batch": GPT["batch"] // m})
    pipeline = build_pipeline(micro, Strategy.build(mesh, templates), microbatches=m,
                              schedule=schedule)  # fmt: skip
    return pipeline, config


def _replicas(pipeline: PipelineProgram, blocks: list[dict[str, Any]], value: str) -> list[Any]:
    """The global view of serial value `value` on every stage that holds it."""
    out = []
    for s, program in enumerate(pipeline.stages):
        held = program.values.get(value)
        if held is not None:
            shape = program.types[held].shape
            out.append(assemble(blocks[s][held], program.specs[held], shape))
    return out


CASES = [
    ("pp=2", [], 2, "1f1b", 2),
    ("pp=2,dp=2", ["dp"], 2, "1f1b", 2),
    ("pp=2,tp=2", ["megatron_tp"], 2, "1f1b", 2),
    ("pp=2,dp=2", ["fsdp"], 2, "1f1b", 2),
    ("pp=2,dp=2", ["zero2"], 2, "gpipe", 2),
    ("pp=2", [], 2, "interleaved", 4),
    ("pp=4", [], 4, "1f1b", 4),
]


@pytest.mark.parametrize(("mesh", "templates", "m", "schedule", "layers"), CASES)
def test_tied_gpt_pipeline_verifies_and_its_replicas_stay_equal(
    mesh: str, templates: list[str], m: int, schedule: str, layers: int
) -> None:
    config = {**GPT, "layers": layers}
    report = verify_pipeline("gpt2", Strategy.build(mesh, templates), microbatches=m,
                             schedule=schedule, overrides=config)  # fmt: skip
    assert report.ok, report.failed()[:3]
    assert report.summary["compared"] > 100
    last = report.summary["pp"] - 1
    assert report.summary["tied_weights"] == [
        {"param": TIED, "stages": [0, last], "reason": REASON.format(last=last)}
    ]
    pipeline, _ = _build(mesh, templates, m, schedule, layers)
    full = training_graph(build_model("gpt2", config))
    env = run_reference(full)
    blocks = run_pipeline_blocks(pipeline, {v.name: env[v.name] for v in source_values(full)})
    for value in (f"{TIED}.new", f"{TIED}.exp_avg.new", f"{TIED}.exp_avg_sq.new"):
        first, *others = _replicas(pipeline, blocks, value)
        assert len(others) == 1  # the first and the last stage, not the middle ones
        assert others[0].tobytes() == first.tobytes()  # the same bits on both stages
        np.testing.assert_allclose(first, env[value], rtol=0, atol=1e-9)
    assert not np.allclose(env[f"{TIED}.new"], env[TIED])  # the step moved the weight


def test_the_all_reduce_is_in_the_stage_programs_and_explains_itself() -> None:
    pipeline, _ = _build("pp=4", [], 4, layers=4)
    for s, program in enumerate(pipeline.stages):
        tied = [op for op in program.ops if op.name.startswith("tied_all_reduce:")]
        if s in (1, 2):
            assert tied == [] and TIED not in program.types  # middle stages hold no replica
            continue
        peer = 3 - s
        assert [op.kind for op in tied] == ["send", "recv"]
        for op in tied:
            assert op.reason == REASON.format(last=3)
            assert op.stream == "comm:pp" and op.attrs["peer_stage"] == peer
            assert (op.attrs["collective"], op.attrs["tied_weight"]) == ("all_reduce", TIED)
            assert op.attrs["group"] == [0, 3]
        # after the last backward unit (its partial summed over all 4 micro-batches), before
        # the optimizer; both stages sum the partials in the same order
        names = [op.name for op in program.ops]
        last_backward = max(i for i, op in enumerate(program.ops) if op.name.endswith("#3"))
        first = names.index(tied[0].name)
        reduce = names.index("embed.weight.grad_acc")
        assert last_backward < first < reduce < names.index("embed.weight.adamw")
        assert program.ops[reduce].inputs == ("lm_head.bwd3.acc", "embed.bwd0.acc")
        sent = tied[0].inputs[0]
        assert sent == ("embed.bwd0.acc" if s == 0 else "lm_head.bwd3.acc")
    # the head's gradient is no longer sent back to the first stage every micro-batch
    assert all(c.value != "lm_head.bwd3" for c in pipeline.crossing)


def test_fsdp_stages_gather_their_own_replica() -> None:
    """Under FSDP every stage gathers its own shard of the tied weight before use; the
    gathered copy never crosses stages."""
    pipeline, _ = _build("pp=2,dp=2", ["fsdp"], 2)
    for program in pipeline.stages:
        gathers = [op for op in program.ops if op.kind == "all_gather" and TIED in op.inputs]
        assert len(gathers) >= 2 and all(op.stream == "comm:dp" for op in gathers)
        sends = [op for op in program.ops if op.kind == "send"]
        assert not any(TIED in str(op.attrs["value"]) for op in sends)


def test_stage_passes_and_send_wait_keep_a_tied_pipeline_correct() -> None:
    training = training_graph(build_model("gpt2", {**GPT, "batch": GPT["batch"] // 2}))

    def transform(p: PipelineProgram) -> PipelineProgram:
        out, _ = apply_stage_passes(p, training, None)
        return pipeline_send_wait(out)[0]

    report = verify_pipeline("gpt2", Strategy.build("pp=2,dp=2", ["dp"]), microbatches=2,
                             overrides=GPT, transform=transform)  # fmt: skip
    assert report.ok, report.failed()[:3]


def test_a_tied_pipeline_is_hazard_free_under_random_interleavings() -> None:
    pipeline, config = _build("pp=2,dp=2", ["dp"], 2)
    full = training_graph(build_model("gpt2", config))
    env = run_reference(full)
    sources = {v.name: env[v.name] for v in source_values(full)}
    blocks = run_pipeline_interleavings(pipeline, sources, n=3)
    first, last = _replicas(pipeline, blocks, f"{TIED}.new")
    assert first.tobytes() == last.tobytes()


def test_cli_verifies_a_tied_gpt_pipeline() -> None:
    sets = [arg for k, v in GPT.items() for arg in ("--set", f"{k}={v}")]
    args = ["verify", "gpt2", *sets, "--mesh", "pp=2", "--schedule", "1f1b",
            "--microbatches", "2"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert result.output.startswith("PASS")


#: a bf16 GPT: its parameters' gradients are summed as float32 main gradients
BF16 = {**GPT, "dtype": "bfloat16"}


@pytest.mark.parametrize(
    ("mesh", "templates", "shards"), [("pp=2,dp=2", ["dp"], 1), ("pp=2,tp=2", ["megatron_tp"], 2)]
)
def test_a_bf16_tied_weight_exchanges_and_sums_float32_main_grads(
    mesh: str, templates: list[str], shards: int
) -> None:
    """As Megatron-LM's embedding group all-reduces `main_grad`: each stage casts its bf16
    partial to float32 where it is made, accumulates it over the micro-batches in float32,
    and the stages exchange float32 blocks (vocab-sharded under tensor parallelism) and sum
    them in float32 into the main gradient; the replicas stay bit-identical."""
    m = 2
    micro = build_model("gpt2", {**BF16, "batch": BF16["batch"] // m})
    pipeline = build_pipeline(micro, Strategy.build(mesh, templates), microbatches=m)
    block = BF16["vocab"] * BF16["hidden"] // shards
    for s, made in ((0, "embed.bwd0"), (1, "lm_head.bwd3")):
        program = pipeline.stages[s]
        exchange = [op for op in program.ops if op.name.startswith("tied_all_reduce:")]
        assert [op.kind for op in exchange] == ["send", "recv"]
        for op in exchange:
            (value,) = op.inputs or op.outputs
            spec = program.specs[value]
            assert program.types[value].dtype == "float32"
            assert math.prod(local_shape(program.types[value].shape, spec.mesh,
                                         spec.placements)) == block  # fmt: skip
        casts = [op for op in program.ops if op.name.startswith(f"{made}.main_grad#")]
        assert [op.kind for op in casts] == ["main_grad"] * m  # every micro-batch
        for op in casts:
            assert program.types[op.inputs[0]].dtype == "bfloat16"
            assert program.types[op.outputs[0]].dtype == "float32"
        (total,) = [op for op in program.ops if op.name == "embed.weight.grad_acc"]
        assert [program.types[v].dtype for v in (*total.inputs, *total.outputs)] == ["float32"] * 3
        assert total.outputs == ("embed.weight.grad",)
        assert f"{TIED}.grad16" not in program.types  # no 16-bit sum, no cast after it
    report = verify_pipeline("gpt2", Strategy.build(mesh, templates), microbatches=m,
                             overrides=BF16)  # fmt: skip
    assert report.ok, report.failed()[:3]
    compared = {c.name for c in report.checks}
    assert {f"{TIED}.grad", "lm_head.bwd3"} <= compared
    full = training_graph(build_model("gpt2", BF16))
    env = run_reference(full)
    blocks = run_pipeline_blocks(pipeline, {v.name: env[v.name] for v in source_values(full)})
    for value in (f"{TIED}.new", f"{TIED}.master.new", f"{TIED}.exp_avg.new"):
        first, last = _replicas(pipeline, blocks, value)
        assert first.tobytes() == last.tobytes()
        np.testing.assert_allclose(first, env[value], rtol=0, atol=1e-9)
