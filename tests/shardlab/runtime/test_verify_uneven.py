"""Uneven shards verify numerically on the simulated mesh (issue 21's acceptance).

Blocks are DTensor's (`torch.chunk`: ceil-sized, the tail ones short or empty). gpt2 with
Megatron tensor parallelism on tp=4 keeps the real vocab 50257 (blocks of 12565, 12565,
12565, 12562 rows: vocab-parallel embedding and cross entropy), a batch of 6 annotated on
dp=4 runs as 2, 2, 2, 0 sequences (the last rank's block is empty; the mean loss is a
partial sum of per-rank shares, 0 on the empty rank), and llama and sequence parallelism
run on odd sizes too. Empty blocks elsewhere: a vocab of 6 on tp=4 (2, 2, 2, 0 rows of the
table and of the logits), and mlp_demo with parameters annotated over more ranks than
they have rows or columns.
"""

from __future__ import annotations

import pytest

from shardlab.mesh import Mesh
from shardlab.models import build_model
from shardlab.placement import empty_blocks, index_ranges
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
    assert rows == [(0, 12565), (12565, 25130), (25130, 37695), (37695, 50257)]
    loss = next(op for op in program.ops if op.kind == "cross_entropy")
    assert loss.kernel == "cross_entropy_vocab_parallel"
    report = verify(plan)
    assert report.ok, (report.first_divergence, report.failed()[:3])


#: The dp template's annotations, written out: the template refuses a batch its axis does
#: not divide (every rank trains on as many samples); an annotation may still split one, and
#: then it is cut as DTensor cuts it.
BATCH = ["tokens=dp:S(0)", "labels=dp:S(0)"]


def strategy(mesh: str, templates: list[str], batch: int) -> Strategy:
    """`templates` on `mesh`; "dp" written out as its annotations (`BATCH`) where the batch
    does not divide over the dp axis."""
    dp = Mesh.parse(mesh).axis_size("dp") if "dp" in templates else 1
    if batch % dp == 0:
        return Strategy.build(mesh, templates)
    return Strategy.build(mesh, [t for t in templates if t != "dp"], BATCH)


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
        ("gpt2", {**GPT2, "batch": 8}, "dp=4", ["dp", "fsdp"]),  # 257 rows: 65 x3, 62
        ("gpt2", {**GPT2, "batch": 8}, "dp=4", ["dp", "zero2"]),
        ("gpt2", {**GPT2, "vocab": 6}, "tp=4", ["megatron_tp"]),  # 2, 2, 2, 0 rows
        ("llama3-8b", LLAMA, "dp=4", ["dp"]),
        ("llama3-8b", LLAMA, "tp=4", ["megatron_tp"]),
        ("llama3-8b", {**LLAMA, "seq": 7}, "dp=2,tp=4", ["dp", "megatron_tp", "sequence_parallel"]),
        ("llama3-8b", {**LLAMA, "seq": 6}, "tp=4", ["megatron_tp", "sequence_parallel"]),
    ],
    ids=lambda v: v if isinstance(v, str) else "+".join(v) if isinstance(v, list) else None,
)
def test_uneven_training_steps_verify(
    preset: str, config: dict[str, object], mesh: str, templates: list[str]
) -> None:
    batch = int(config["batch"])  # type: ignore[call-overload]
    report = verify(build_model(preset, config), strategy(mesh, templates, batch))
    assert report.ok, (report.first_divergence, report.failed()[:3])
    assert report.summary["compared"] > 20


def test_uneven_batch_mean_loss_is_a_scaled_partial_sum() -> None:
    plan = build_plan(build_model("gpt2", GPT2), strategy("dp=4", ["dp"], 6))
    program = plan.program
    tokens = program.specs["tokens"]
    sizes = [
        index_ranges((6, 8), program.mesh, tokens.placements, r)[0] for r in program.mesh.ranks
    ]
    assert sizes == [(0, 2), (2, 4), (4, 6), (6, 6)]  # DTensor's blocks: the last one empty
    loss = next(op for op in program.ops if op.kind == "cross_entropy")
    assert loss.kernel == "global_mean"
    assert [str(program.specs[v]) for v in loss.inputs] == ["S(0)", "S(0)"]  # no gather
    assert str(program.specs[loss.outputs[0]]) == "P(sum)"


#: mlp_demo with values annotated over more ranks than a dim has: w0's 6 columns on tp=4
#: are 2, 2, 2, 0 (the matmuls compute on the empty block), w1's and the labels' 3 classes
#: are 1, 1, 1, 0 (fewer than the ranks: no rule splits them; w1 moves to its rows, 2, 2,
#: 2, 0, by all_to_all and back, the labels are gathered); the batch of 6 on dp=2.
MLP = {"batch": 6, "hidden": 6, "classes": 3}
MLP_ANNOTATIONS = ["w0=tp:S(1)", "w1=tp:S(1)", "x=dp:S(0)", "label=dp:S(0),tp:S(1)"]


def test_parameters_with_empty_blocks_verify() -> None:
    plan = build_plan(
        build_model("mlp_demo", MLP), Strategy.build("dp=2,tp=4", [], MLP_ANNOTATIONS)
    )
    program = plan.program
    for name, dim, sizes in (("w0", 1, (2, 2, 2, 0)), ("w1", 1, (1, 1, 1, 0))):
        spec, shape = program.specs[name], program.types[name].shape
        (empty,) = empty_blocks(shape, program.mesh, spec.placements)
        assert (empty.dim, empty.sizes, empty.axes) == (dim, sizes, ("tp",))
    kinds = {op.comm.kind for op in program.ops if op.comm is not None}
    assert {"all_gather", "all_to_all", "local_partial"} <= kinds
    report = verify(plan)
    assert report.ok, (report.first_divergence, report.failed()[:3])
    assert report.summary["compared"] > 5


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
