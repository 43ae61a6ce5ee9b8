"""Explanations: the chain of decisions behind a value's placement."""

from __future__ import annotations

from shardlab.models import build_model
from shardlab.spmd.complete import complete
from shardlab.spmd.explain import explain, format_explanation
from shardlab.strategy import Strategy

SMALL = {"layers": 1, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 64,
         "seq": 8, "batch": 4, "dtype": "float32"}  # fmt: skip


def test_explains_why_a_norm_output_is_replicated_on_tp() -> None:
    done = complete(
        build_model("llama3-8b", SMALL), Strategy.build("dp=2,tp=2", ["dp", "megatron_tp"])
    )
    steps = explain(done, "layers.0.mlp_norm")
    assert steps[0].value == "layers.0.mlp_norm" and steps[0].spec == "S(0)R"
    assert steps[0].decisions[0].source == "producer"
    assert steps[1].value == "layers.0.attn_residual"
    assert any("template:megatron_tp" in d.detail for d in steps[1].decisions)
    assert steps[-1].value in {"tokens", "embed", "embed.weight"}


def test_explains_a_partial_sum_of_a_row_parallel_projection() -> None:
    done = complete(
        build_model("llama3-8b", SMALL), Strategy.build("dp=2,tp=2", ["dp", "megatron_tp"])
    )
    text = format_explanation(done, "layers.0.mlp.down_proj")
    assert text.startswith("layers.0.mlp.down_proj: S(0)P(sum)")
    assert "'k' is contracted, so outputs are Partial(sum)" in text
    assert "layers.0.mlp.gated" in text
