"""Templates write annotations only, for the named axis, composably."""

from __future__ import annotations

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


def test_fsdp_picks_a_dim_that_still_divides_after_tp() -> None:
    mesh = Mesh((2, 4), ("dp", "tp"))
    graph = build_model("llama3-8b", {**SMALL, "hidden": 8, "heads": 4, "kv_heads": 1, "ffn": 16})
    uses = (TemplateUse("megatron_tp", "tp"), TemplateUse("fsdp", "dp"))
    anns = _by_pattern(template_annotations(graph, mesh, uses))
    # o_proj.weight [8, 8] is S(0) on tp (4): dim 0 still divides by 2*4 -> S(0) on dp too
    assert anns["layers.0.attn.o_proj.weight"].placements == (("dp", Shard(0)),)
    # k_proj.weight [8, 2] is replicated on tp (1 kv head for 4 ranks); dim 0 (8) divides by 2
    assert anns["layers.0.attn.k_proj.weight"].placements == (("dp", Shard(0)),)
