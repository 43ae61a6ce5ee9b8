"""The transformer builder: where dropout goes (Megatron-LM's GPT), eager attention from
catalog ops, and what its backward keeps (Korthikanti et al. 2022's activation bytes)."""

from __future__ import annotations

import zlib
from collections import Counter

import pytest

from shardlab.cost.memory import MemoryProfile, memory_profile
from shardlab.ir import Graph
from shardlab.models import build_model
from shardlab.plan import build_plan
from shardlab.strategy import Strategy
from tests.shardlab.conftest import SBH, A, B, S

SMALL = {"layers": 2, "hidden": 64, "heads": 4, "ffn": 128, "vocab": 128, "seq": 16, "batch": 4,
         "dropout": 0.1}  # fmt: skip


def dropouts(g: Graph) -> dict[str, tuple[str, str]]:
    """dropout op name -> (the value it drops, the op that reads its output first)."""
    out = {}
    for op in g.ops:
        if op.kind == "dropout":
            reader = next(c.name for c in g.consumers(op.outputs[0]))
            out[op.name] = (op.inputs[0], reader)
    return out


def test_gpt_dropout_sits_where_megatron_puts_it() -> None:
    flash = build_model("gpt", SMALL)
    assert dropouts(flash) == {
        "pos_embed.dropout": ("pos_embed.add", "layers.0.attn_norm"),
        **{
            f"layers.{i}.{m}.dropout": (f"layers.{i}.{m}.{proj}", f"layers.{i}.{m}_residual")
            for i in range(2)
            for m, proj in (("attn", "o_proj"), ("mlp", "down_proj"))
        },
    }
    eager = build_model("gpt", {**SMALL, "attention": "eager"})
    probs = {k: v for k, v in dropouts(eager).items() if k not in dropouts(flash)}
    assert probs == {
        f"layers.{i}.attn.probs_dropout": (f"layers.{i}.attn.probs", f"layers.{i}.attn.context")
        for i in range(2)
    }
    for op in eager.ops:
        if op.kind == "dropout":
            assert op.attrs == {"p": 0.1, "seed": zlib.crc32(op.name.encode())}
            assert op.outputs == (f"{op.name}.out", f"{op.name}.mask")
            assert eager.type_of(f"{op.name}.mask").dtype == "bool"
    seeds = [op.attrs["seed"] for op in eager.ops if op.kind == "dropout"]
    assert len(set(seeds)) == len(seeds) == 7  # embedding + 3 per layer


def test_no_dropout_op_at_p_zero_and_existing_presets_keep_none() -> None:
    for name, overrides in [("gpt", {**SMALL, "dropout": 0}), ("gpt2", {"layers": 2}),
                            ("llama3-8b", {"layers": 2})]:  # fmt: skip
        kinds = Counter(op.kind for op in build_model(name, overrides).ops)
        assert kinds["dropout"] == 0 and kinds["scaled_dot_product_attention"] == 2
        assert kinds["masked_softmax"] == 0


def test_llama_accepts_dropout_after_its_embedding() -> None:
    g = build_model("llama3-8b", {"layers": 1, "seq": 16, "batch": 2, "dropout": 0.05})
    assert set(dropouts(g)) == {"embed.dropout", "layers.0.attn.dropout", "layers.0.mlp.dropout"}
    assert dropouts(g)["embed.dropout"] == ("embed", "layers.0.attn_norm")


def test_eager_attention_is_built_from_catalog_ops() -> None:
    g = build_model("gpt", {**SMALL, "attention": "eager"})
    ops = [op for op in g.ops if op.scope == "layers.0.attn"]
    assert [(op.name.split(".")[-1], op.kind) for op in ops] == [
        ("q_heads", "reshape"), ("k_heads", "reshape"), ("v_heads", "reshape"),
        ("q_t", "permute"), ("k_t", "permute"), ("v_t", "permute"),
        ("scores", "matmul"), ("probs", "masked_softmax"), ("probs_dropout", "dropout"),
        ("context", "matmul"), ("context_t", "permute"), ("merge_heads", "reshape"),
        ("dropout", "dropout"),
    ]  # fmt: skip
    assert g.type_of("layers.0.attn.scores").shape == (4, 4, 16, 16)
    assert g.op("layers.0.attn.scores").attrs == {"transpose_b": True}
    assert g.op("layers.0.attn.probs").attrs == {"scale": 0.25, "causal": True}
    assert g.type_of("layers.0.attn.merge_heads").shape == (4, 16, 64)


def test_eager_attention_repeats_kv_heads_for_grouped_queries() -> None:
    g = build_model("llama3-8b", {"layers": 1, "hidden": 64, "heads": 4, "kv_heads": 2,
                                  "seq": 8, "batch": 2, "attention": "eager"})  # fmt: skip
    assert g.type_of("layers.0.attn.k_expand").shape == (2, 8, 2, 1, 16)
    assert g.type_of("layers.0.attn.k_repeat").shape == (2, 8, 2, 2, 16)
    assert g.type_of("layers.0.attn.v_groups").shape == (2, 8, 4, 16)
    assert g.op("layers.0.attn.k_t").inputs == ("layers.0.attn.k_groups",)


# --- what backward keeps: Korthikanti et al. (2022), section 4 -------------------------------


def _profile(model: Graph, t: int, templates: list[str]) -> MemoryProfile:
    plan = build_plan(model, Strategy.build(f"tp={t}", templates), passes=False)
    return memory_profile(plan.program, plan.training)


def test_eager_attention_keeps_q_k_probs_mask_dropped_and_v_not_the_scores(
    gpt3_layers: Graph,
) -> None:
    """5as^2b + 6sbh: Q, K (2sbh each), softmax output (2as^2b), dropout mask (as^2b, one
    byte), dropout output (2as^2b), V (2sbh); plus the o_proj input (2sbh)."""
    kept = _profile(gpt3_layers, 1, ["megatron_tp"]).kept_for_backward
    as2b = A * S * S * B
    attn = {k.value.split(".", 3)[-1]: k.bytes for k in kept if k.scope == "layers.0.attn"}
    assert attn == {
        "q_t": 2 * SBH, "k_t": 2 * SBH, "v_t": 2 * SBH, "probs": 2 * as2b,
        "probs_dropout.mask": as2b, "probs_dropout.out": 2 * as2b, "merge_heads": 2 * SBH,
        "dropout.mask": SBH,
    }  # fmt: skip


@pytest.mark.parametrize("t", [1, 2, 8])
@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_activations_per_layer_are_korthikantis(
    gpt3_layers: Graph, t: int, sequence_parallel: bool
) -> None:
    """sbh(10 + 24/t + 5as/(ht)) with tensor parallelism t, sbh(34/t + 5as/(ht)) with
    sequence parallelism too (t = 1: sbh(34 + 5as/h)); 16-bit activations, 1-byte masks."""
    templates = ["megatron_tp", "sequence_parallel"] if sequence_parallel else ["megatron_tp"]
    got = _profile(gpt3_layers, t, templates).kept_for_backward_by_scope["layers.0"]
    per_layer = 34 * SBH // t if sequence_parallel else 10 * SBH + 24 * SBH // t
    assert got == per_layer + 5 * A * S * S * B // t
