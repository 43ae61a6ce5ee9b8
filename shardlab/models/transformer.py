"""Decoder-only transformers: the GPT-2, Megatron-LM GPT and Llama families as forward graphs.

All share one block layout so that templates can match the same module paths:
`embed`, `layers.{i}.attn_norm`, `layers.{i}.attn.{q,k,v,o}_proj`, `layers.{i}.mlp_norm`,
`layers.{i}.mlp.{gate,up,down}_proj`, `final_norm`, `lm_head`, `loss`. Linear weights are
[in, out]. GPT-2 uses LayerNorm, biases, learned positions (a table of `max_positions` rows),
GELU (tanh) and ties `lm_head` to `embed`; `gpt` (the GPT of Narayanan et al. 2021 and
Korthikanti et al. 2022) is the same block with a position table of exactly `seq` rows and
dropout; Llama uses RMSNorm, RoPE, grouped-query attention and SwiGLU. GPT-2's fused
`c_attn` is written as separate q/k/v projections (same parameters, shardable per head).
`tie_embeddings` decides whether `lm_head` reuses `embed.weight` or has its own weight;
`pad_vocab` pads their vocab rows as Megatron-LM does (`TransformerConfig.padded_vocab`).

Dropout (config `dropout` > 0), where Megatron-LM's GPT has it: after the embedding (and
position add), `pos_embed.dropout` (`embed.dropout` without learned positions); on the
attention probabilities, `layers.{i}.attn.probs_dropout` (eager attention only); after the
attention output projection, `layers.{i}.attn.dropout`, and after the MLP down projection,
`layers.{i}.mlp.dropout`, both before their residual add. Each dropout op's `seed` is the
CRC-32 of its name, so every mask differs and a graph rebuilds identically. Outputs:
`<op>.out` and `<op>.mask` (bool).

Attention (config `attention`): "flash" is one fused `scaled_dot_product_attention` op whose
backward recomputes the probabilities; it is modelled without attention-probability dropout
(the kernel's dropout mask is regenerated, never stored, and the catalog's fused op has no
dropout). "eager" builds it from catalog ops, as Megatron-LM's unfused path:
q, k, v permuted to [b, heads, s, d] (k/v heads repeated for grouped-query attention),
`scores` = q k^T, `probs` = masked_softmax(scores) (scale, causal mask), dropout, `context`
= probs v, permuted back and merged; backward keeps q, k, the softmax output, the dropout
mask and output, and v (Korthikanti et al.'s 5as^2b + 6sbh bytes in 16 bits), not the scores.
"""

from __future__ import annotations

import dataclasses
import math
import zlib

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
        embed = b.param("weight", (cfg.padded_vocab, cfg.hidden), cfg.dtype)
        h = b.op("embedding", [tokens, embed])
    rope: tuple[str, str] | None = None
    if cfg.family in LEARNED_POSITIONS:
        h = _learned_positions(b, cfg, h)
    else:
        with b.scope("embed"):
            h = _dropout(b, cfg, h, "dropout")
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
        if cfg.tie_embeddings:
            logits = b.op("matmul", [h, embed], attrs={"transpose_b": True})
        else:
            weight = b.param("weight", (cfg.hidden, cfg.padded_vocab), cfg.dtype)
            logits = b.op("linear", [h, weight])
    with b.scope("loss"):
        loss = b.op("cross_entropy", [logits, labels], role=OpRole.LOSS)
    return b.build([loss])


#: Families with a learned position table (the rest use RoPE); gpt2's has `max_positions`
#: rows and is sliced to `seq`, gpt's has exactly `seq`.
LEARNED_POSITIONS = ("gpt2", "gpt")
#: Families with LayerNorm, biases on every linear and a GELU MLP (the rest: Llama's).
GPT_BLOCK = ("gpt2", "gpt")


def _learned_positions(b: GraphBuilder, cfg: TransformerConfig, h: str) -> str:
    with b.scope("pos_embed"):
        if cfg.family == "gpt2":
            table = b.param("weight", (cfg.max_positions, cfg.hidden), cfg.dtype)
            pos = b.op("slice", [table], "rows", {"dim": 0, "start": 0, "stop": cfg.seq})
        else:
            pos = b.param("weight", (cfg.seq, cfg.hidden), cfg.dtype)
        return _dropout(b, cfg, b.op("add", [h, pos], "add"), "dropout")


def _dropout(b: GraphBuilder, cfg: TransformerConfig, x: str, name: str) -> str:
    """`dropout` named `<scope>.<name>` when the config has dropout; else x unchanged."""
    if not cfg.dropout:
        return x
    seed = zlib.crc32(".".join(filter(None, (b.path, name))).encode())
    attrs = {"p": cfg.dropout, "seed": seed}
    return b.ops("dropout", [x], name, attrs, output_names=["out", "mask"])[0]


def _norm(b: GraphBuilder, cfg: TransformerConfig, x: str, module: str) -> str:
    with b.scope(module):
        weight = b.param("weight", (cfg.hidden,), cfg.dtype)
        if cfg.family in GPT_BLOCK:
            bias = b.param("bias", (cfg.hidden,), cfg.dtype)
            return b.op("layer_norm", [x, weight, bias], attrs={"eps": cfg.norm_eps})
        return b.op("rms_norm", [x, weight], attrs={"eps": cfg.norm_eps})


def _attention(
    b: GraphBuilder, cfg: TransformerConfig, x: str, rope: tuple[str, str] | None
) -> str:
    bias = cfg.family in GPT_BLOCK
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
        if cfg.attention == "eager":
            ctx = _eager_attention(b, cfg, split["q"], split["k"], split["v"])
        else:
            ctx = b.op(
                "scaled_dot_product_attention",
                [split["q"], split["k"], split["v"]],
                "sdpa",
                {"causal": True},
            )
        merged = b.op(
            "reshape", [ctx], "merge_heads", {"shape": [cfg.batch, cfg.seq, cfg.heads * hd]}
        )
        out = b.linear(merged, "o_proj", cfg.heads * hd, cfg.hidden, bias=bias, dtype=dt)
        return _dropout(b, cfg, out, "dropout")


def _eager_attention(b: GraphBuilder, cfg: TransformerConfig, q: str, k: str, v: str) -> str:
    """Causal attention from catalog ops: q, k, v [b, s, n, d] -> context [b, s, heads, d]."""
    to_heads = {"perm": [0, 2, 1, 3]}  # [b, s, n, d] <-> [b, n, s, d]
    split = {"q": q, "k": _repeat_kv(b, cfg, k, "k"), "v": _repeat_kv(b, cfg, v, "v")}
    qt, kt, vt = (b.op("permute", [split[p]], f"{p}_t", to_heads) for p in ("q", "k", "v"))
    scores = b.op("matmul", [qt, kt], "scores", {"transpose_b": True})
    attrs = {"scale": 1.0 / math.sqrt(cfg.head_dim), "causal": True}
    probs = _dropout(b, cfg, b.op("masked_softmax", [scores], "probs", attrs), "probs_dropout")
    context = b.op("matmul", [probs, vt], "context")
    return b.op("permute", [context], "context_t", to_heads)


def _repeat_kv(b: GraphBuilder, cfg: TransformerConfig, x: str, part: str) -> str:
    """Each of the kv heads of x [b, s, kv_heads, d] repeated heads // kv_heads times."""
    group = cfg.heads // cfg.kv_heads
    if group == 1:
        return x
    bs, hd = [cfg.batch, cfg.seq], cfg.head_dim
    one = b.op("reshape", [x], f"{part}_expand", {"shape": [*bs, cfg.kv_heads, 1, hd]})
    wide = b.op("broadcast_to", [one], f"{part}_repeat", {"shape": [*bs, cfg.kv_heads, group, hd]})
    return b.op("reshape", [wide], f"{part}_groups", {"shape": [*bs, cfg.heads, hd]})


def _mlp(b: GraphBuilder, cfg: TransformerConfig, x: str) -> str:
    dt = cfg.dtype
    with b.scope("mlp"):
        if cfg.family in GPT_BLOCK:
            up = b.linear(x, "up_proj", cfg.hidden, cfg.ffn, bias=True, dtype=dt)
            act = b.op("gelu", [up], "act", {"approximate": "tanh"})
            down = b.linear(act, "down_proj", cfg.ffn, cfg.hidden, bias=True, dtype=dt)
        else:
            gate = b.linear(x, "gate_proj", cfg.hidden, cfg.ffn, bias=False, dtype=dt)
            up = b.linear(x, "up_proj", cfg.hidden, cfg.ffn, bias=False, dtype=dt)
            act = b.op("mul", [b.op("silu", [gate], "act"), up], "gated")
            down = b.linear(act, "down_proj", cfg.ffn, cfg.hidden, bias=False, dtype=dt)
        return _dropout(b, cfg, down, "dropout")
