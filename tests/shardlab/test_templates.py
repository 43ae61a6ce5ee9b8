"""Templates write annotations only, for the named axis, composably."""

from __future__ import annotations

from shardlab.autodiff import training_graph
from shardlab.mesh import Mesh
from shardlab.models import build_model
from shardlab.placement import Replicate, Shard
from shardlab.strategy import TemplateUse
from shardlab.templates import template_annotations

SMALL = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 64,
         "seq": 8, "batch": 4}  # fmt: skip


def _by_pattern(anns):  # type: ignore[no-untyped-def]
    return {a.pattern: a for a in anns}


def test_dp_shards_the_batch_of_every_input() -> None:
    mesh = Mesh((2,), ("dp",))
    anns = template_annotations(
        build_model("gpt2", {"layers": 1}), mesh, (TemplateUse("dp", "dp"),)
    )
    assert {a.pattern for a in anns} == {"tokens", "labels"}
    assert all(a.placements == (("dp", Shard(0)),) and a.source == "template:dp" for a in anns)


def test_megatron_writes_column_row_vocab_and_residual() -> None:
    mesh = Mesh((2,), ("tp",))
    anns = _by_pattern(template_annotations(build_model("llama3-8b", SMALL), mesh,
                                            (TemplateUse("megatron_tp", "tp"),)))  # fmt: skip
    assert anns["layers.*.attn.q_proj.weight"].placements == (("tp", Shard(1)),)
    assert anns["layers.*.mlp.down_proj.weight"].placements == (("tp", Shard(0)),)
    assert anns["embed.weight"].placements == (("tp", Shard(0)),)
    assert anns["lm_head.weight"].placements == (("tp", Shard(1)),)
    assert anns["layers.*.attn_residual"].placements == (("tp", Replicate()),)


def test_fsdp_shards_a_dim_tensor_parallelism_leaves_alone_in_any_order() -> None:
    """FSDP2 on a TP-sharded weight gathers its TP shard with one all-gather over dp: the
    dp shard must not nest inside the tp shard of the same dim (gathering dp would then be
    an all-to-all). Written before or after megatron_tp alike."""
    mesh = Mesh((2, 4), ("dp", "tp"))
    graph = build_model("llama3-8b", {**SMALL, "hidden": 8, "heads": 4, "kv_heads": 1, "ffn": 16})
    for uses in ((TemplateUse("megatron_tp", "tp"), TemplateUse("fsdp", "dp")),
                 (TemplateUse("fsdp", "dp"), TemplateUse("megatron_tp", "tp"))):  # fmt: skip
        anns = _by_pattern(template_annotations(graph, mesh, uses))
        # o_proj.weight [8, 8] is S(0) on tp (row-parallel): dp takes dim 1
        assert anns["layers.0.attn.o_proj.weight"].placements == (("dp", Shard(1)),)
        # q_proj.weight [8, 8] is S(1) on tp (column-parallel): dp takes dim 0
        assert anns["layers.0.attn.q_proj.weight"].placements == (("dp", Shard(0)),)
        # k_proj.weight [8, 2] is replicated on tp (1 kv head for 4 ranks): dim 0 divides
        assert anns["layers.0.attn.k_proj.weight"].placements == (("dp", Shard(0)),)


def test_data_sharding_covers_every_parameter_and_state_at_any_dp() -> None:
    """ZeRO and FSDP shard 1/dp whether or not dp divides the dims: at dp=6 and 12 no dim
    of Llama's weights (64, 128, vocab 64) divides, and every one is sharded all the same
    (uneven blocks, as DTensor cuts them)."""
    training = training_graph(build_model("llama3-8b", {**SMALL, "batch": 12}), "adamw")
    for dp in (4, 6, 12):
        mesh = Mesh((dp,), ("dp",))
        for template in ("zero1", "fsdp"):
            anns = template_annotations(training, mesh, (TemplateUse(template, "dp"),))
            sharded = {a.pattern for a in anns}
            kind = "STATE" if template == "zero1" else "PARAM"
            wanted = {v.name for v in training.values.values() if v.kind.name == kind
                      and training.producer(v.name) is None}  # fmt: skip
            assert wanted <= sharded, (dp, template, sorted(wanted - sharded)[:3])
