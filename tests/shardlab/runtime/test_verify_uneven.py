"""Uneven shards verify numerically on the simulated mesh (issue 21's acceptance).

gpt2 with Megatron tensor parallelism on tp=4 keeps the real vocab 50257 (blocks of 12565,
12564, 12564, 12564 rows: vocab-parallel embedding and cross entropy), a batch of 6 runs on
dp=4 (2, 2, 1, 1 sequences: the mean loss is a partial sum of per-rank shares), and llama
and sequence parallelism run on odd sizes too.
"""

from __future__ import annotations

import pytest

from shardlab.models import build_model
from shardlab.placement import index_ranges
from shardlab.plan import build_plan
from shardlab.runtime.verify import verify
from shardlab.strategy import Strategy

TINY_GPT2 = {"layers": 1, "hidden": 16, "heads": 4, "seq": 4, "batch": 2, "vocab": 50257}
GPT2 = {"layers": 1, "hidden": 32, "heads": 4, "seq": 8, "batch": 6, "vocab": 257}
LLAMA = {"layers": 1, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 96, "vocab": 257,
         "seq": 8, "batch": 6, "dtype": "float32"}  # fmt: skip


def test_gpt2_real_vocab_50257_on_tp4_is_vocab_parallel_and_verifies() -> None:
    plan = build_plan(build_model("gpt2", TINY_GPT2), Strategy.build("tp=4", ["megatron_tp"]))
    program = plan.program
    embed = next(op for op in program.ops if op.kind == "embedding")
    table = embed.inputs[1]
    assert str(program.specs[table]) == "S(0)"
    assert embed.kernel == "embedding_vocab_parallel"
    rows = [index_ranges((50257, 16), program.mesh, (program.specs[table].placements), r)[0]
            for r in program.mesh.ranks]  # fmt: skip
    assert rows == [(0, 12565), (12565, 25129), (25129, 37693), (37693, 50257)]
    loss = next(op for op in program.ops if op.kind == "cross_entropy")
    assert loss.kernel == "cross_entropy_vocab_parallel"
    report = verify(plan)
    assert report.ok, (report.first_divergence, report.failed()[:3])


@pytest.mark.parametrize(
    ("preset", "config", "mesh", "templates"),
    [
        ("gpt2", GPT2, "dp=4", ["dp"]),
        ("gpt2", GPT2, "tp=4", ["megatron_tp"]),
        ("gpt2", GPT2, "dp=4,tp=4", ["dp", "megatron_tp"]),
        (
            "gpt2",
            {**GPT2, "hidden": 24, "heads": 6, "seq": 7},
            "dp=2,tp=3",
            ["dp", "megatron_tp", "sequence_parallel"],
        ),
        ("gpt2", GPT2, "dp=4", ["dp", "fsdp"]),
        ("gpt2", GPT2, "dp=4", ["dp", "zero2"]),
        ("llama3-8b", LLAMA, "dp=4", ["dp"]),
        ("llama3-8b", LLAMA, "tp=4", ["megatron_tp"]),
        ("llama3-8b", {**LLAMA, "seq": 7}, "dp=2,tp=4", ["dp", "megatron_tp", "sequence_parallel"]),
    ],
    ids=lambda v: v if isinstance(v, str) else "+".join(v) if isinstance(v, list) else None,
)
def test_uneven_training_steps_verify(
    preset: str, config: dict[str, object], mesh: str, templates: list[str]
) -> None:
    report = verify(build_model(preset, config), Strategy.build(mesh, templates))
    assert report.ok, (report.first_divergence, report.failed()[:3])
    assert report.summary["compared"] > 20


def test_uneven_batch_mean_loss_is_a_scaled_partial_sum() -> None:
    plan = build_plan(build_model("gpt2", GPT2), Strategy.build("dp=4", ["dp"]))
    loss = next(op for op in plan.program.ops if op.kind == "cross_entropy")
    assert loss.kernel == "global_mean"
    program = plan.program
    assert [str(program.specs[v]) for v in loss.inputs] == ["S(0)", "S(0)"]  # no gather
    assert str(program.specs[loss.outputs[0]]) == "P(sum)"


def test_pad_vocab_pads_the_table_as_megatron_does_and_verifies() -> None:
    config = {**TINY_GPT2, "pad_vocab": 128 * 4}
    model = build_model("gpt2", config)
    assert model.type_of("embed.weight").shape == (50688, 16)  # 50257 -> 99 x 512
    assert model.meta["config"]["pad_vocab"] == 512
    plan = build_plan(model, Strategy.build("tp=4", ["megatron_tp"]))
    table = plan.program.specs["embed.weight"]
    blocks = {index_ranges((50688, 16), plan.program.mesh, table.placements, r)[0][1]
              - index_ranges((50688, 16), plan.program.mesh, table.placements, r)[0][0]
              for r in plan.program.mesh.ranks}  # fmt: skip
    assert blocks == {12672}  # even blocks
    report = verify(plan)
    assert report.ok, (report.first_divergence, report.failed()[:3])
