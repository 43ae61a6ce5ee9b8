"""Decoder-only transformers: the GPT-2 and Llama families as forward graphs.

Both share one block layout so that templates can match the same module paths:
`embed`, `layers.{i}.attn_norm`, `layers.{i}.attn.{q,k,v,o}_proj`, `layers.{i}.mlp_norm`,
`layers.{i}.mlp.{gate,up,down}_proj`, `final_norm`, `lm_head`, `loss`. Linear weights are
[in, out]. GPT-2 uses LayerNorm, biases, learned positions, GELU (tanh) and ties `lm_head`
to `embed`; Llama uses RMSNorm, RoPE, grouped-query attention and SwiGLU. GPT-2's fused
`c_attn` is written as separate q/k/v projections (same parameters, shardable per head).
"""

from __future__ import annotations

import dataclasses

from shardlab.ir import Graph, OpRole
from shardlab.models.builder import GraphBuilder
from shardlab.models.config import TransformerConfig


def build_transformer(cfg: TransformerConfig, name: str) -> Graph:
    """The forward graph of one training step's loss: tokens, labels -> scalar loss."""
    cfg.check()
    b = GraphBuilder(name, meta={"preset": name, "config": dataclasses.asdict(cfg)})
    tokens = b.input("tokens", (cfg.batch, cfg.seq), "int64")
    labels = b.input("labels", (cfg.batch, cfg.seq), "int64")
    with b.scope("embed"):
        embed = b.param("weight", (cfg.vocab, cfg.hidden), cfg.dtype)
        h = b.op("embedding", [tokens, embed])
    rope: tuple[str, str] | None = None
    if cfg.family == "gpt2":
        h = _learned_positions(b, cfg, h)
    else:
        with b.scope("rope"):
            cos, sin = b.ops(
                "rope_cache",
                [],
                attrs={
                    "seq": cfg.seq,
                    "head_dim": cfg.head_dim,
                    "theta": cfg.rope_theta,
                    "dtype": cfg.dtype,
                },
                output_names=["cos", "sin"],
            )
            rope = (cos, sin)
    for i in range(cfg.layers):
        with b.scope(f"layers.{i}"):
            h = b.op(
                "add", [h, _attention(b, cfg, _norm(b, cfg, h, "attn_norm"), rope)], "attn_residual"
            )
            h = b.op("add", [h, _mlp(b, cfg, _norm(b, cfg, h, "mlp_norm"))], "mlp_residual")
    h = _norm(b, cfg, h, "final_norm")
    with b.scope("lm_head"):
        if cfg.family == "gpt2":
            logits = b.op("matmul", [h, embed], attrs={"transpose_b": True})
        else:
            weight = b.param("weight", (cfg.hidden, cfg.vocab), cfg.dtype)
            logits = b.op("linear", [h, weight])
    with b.scope("loss"):
        loss = b.op("cross_entropy", [logits, labels], role=OpRole.LOSS)
    return b.build([loss])


def _learned_positions(b: GraphBuilder, cfg: TransformerConfig, h: str) -> str:
    with b.scope("pos_embed"):
        table = b.param("weight", (cfg.max_positions, cfg.hidden), cfg.dtype)
        pos = b.op("slice", [table], "rows", {"dim": 0, "start": 0, "stop": cfg.seq})
        return b.op("add", [h, pos], "add")


def _norm(b: GraphBuilder, cfg: TransformerConfig, x: str, module: str) -> str:
    with b.scope(module):
        weight = b.param("weight", (cfg.hidden,), cfg.dtype)
        if cfg.family == "gpt2":
            bias = b.param("bias", (cfg.hidden,), cfg.dtype)
            return b.op("layer_norm", [x, weight, bias], attrs={"eps": cfg.norm_eps})
        return b.op("rms_norm", [x, weight], attrs={"eps": cfg.norm_eps})


def _attention(
    b: GraphBuilder, cfg: TransformerConfig, x: str, rope: tuple[str, str] | None
) -> str:
    bias = cfg.family == "gpt2"
    hd, dt = cfg.head_dim, cfg.dtype
    with b.scope("attn"):
        heads = {"q": cfg.heads, "k": cfg.kv_heads, "v": cfg.kv_heads}
        split: dict[str, str] = {}
        for part, n in heads.items():
            proj = b.linear(x, f"{part}_proj", cfg.hidden, n * hd, bias=bias, dtype=dt)
            split[part] = b.op(
                "reshape", [proj], f"{part}_heads", {"shape": [cfg.batch, cfg.seq, n, hd]}
            )
        if rope is not None:
            for part in ("q", "k"):
                split[part] = b.op("rotary_embedding", [split[part], *rope], f"{part}_rotary")
        ctx = b.op(
            "scaled_dot_product_attention",
            [split["q"], split["k"], split["v"]],
            "sdpa",
            {"causal": True},
        )
        merged = b.op(
            "reshape", [ctx], "merge_heads", {"shape": [cfg.batch, cfg.seq, cfg.heads * hd]}
        )
        return b.linear(merged, "o_proj", cfg.heads * hd, cfg.hidden, bias=bias, dtype=dt)


def _mlp(b: GraphBuilder, cfg: TransformerConfig, x: str) -> str:
    dt = cfg.dtype
    with b.scope("mlp"):
        if cfg.family == "gpt2":
            up = b.linear(x, "up_proj", cfg.hidden, cfg.ffn, bias=True, dtype=dt)
            act = b.op("gelu", [up], "act", {"approximate": "tanh"})
            return b.linear(act, "down_proj", cfg.ffn, cfg.hidden, bias=True, dtype=dt)
        gate = b.linear(x, "gate_proj", cfg.hidden, cfg.ffn, bias=False, dtype=dt)
        up = b.linear(x, "up_proj", cfg.hidden, cfg.ffn, bias=False, dtype=dt)
        act = b.op("mul", [b.op("silu", [gate], "act"), up], "gated")
        return b.linear(act, "down_proj", cfg.ffn, cfg.hidden, bias=False, dtype=dt)
