"""Rules for `scaled_dot_product_attention`, `rotary_embedding` and `rope_cache`.

- sdpa `bshd,bthd,bthe->bshe` (q, k, v -> out): batch `b` and heads `h` shard; the heads
  letter is shared by q and k/v although Hq != Hkv with grouped-query attention: sharding
  both head dims n ways keeps each query head's kv head on its rank (the solver checks that
  n divides both). The kv sequence `t` and head dims `d`, `e` stay whole. The query sequence
  `s` shards with k/v whole; when causal the rank's queries start at a global offset (kernel
  `attention_query_offset`). Softmax makes it non-linear: partial inputs are resolved.
  When there are fewer kv heads than ranks (Megatron keeps those projections replicated),
  the query heads shard alone: `bshd,btgd,btge->bshe` with the kv heads `g` whole, and each
  rank's query heads read their kv heads by global index (kernel `attention_head_offset`).
  The rule solves both forms and keeps the cheaper.
- attention_grad follows the same two forms; with the kv heads whole, dk and dv come out
  partial sums over the ranks that share a kv head.
- rotary_embedding `bsnd,se,se->bsnd` (x, cos, sin): `b`, `n` and `s` shard (cos/sin follow
  x on `s`); `d`, `e` stay whole. Linear in x with cos/sin replicated.
- rope_cache (no inputs) `->se,se`: outputs come out as hinted, else replicated; every rank
  computes the whole table and keeps its block (kernel `replicated`).
"""

from __future__ import annotations

from dataclasses import replace

from shardlab.ops import attach
from shardlab.spmd.einsum import Signature, solve
from shardlab.spmd.result import RuleContext, RuleResult

SDPA = "scaled_dot_product_attention"
OFFSET_KERNEL = "attention_query_offset"
HEAD_KERNEL = "attention_head_offset"
GRAD_HEAD_KERNEL = "attention_grad_head_offset"


def sdpa_signature(ctx: RuleContext) -> Signature:
    """Batch, heads and (k/v whole) query sequence shard; causal needs the offset kernel."""
    causal = bool(ctx.attrs.get("causal", True))
    return Signature(
        inputs=("bshd", "bthd", "bthe"),
        outputs=("bshe",),
        whole=frozenset("tde"),
        kernels={"s": OFFSET_KERNEL} if causal else {},
    )


def sdpa_query_heads_signature(ctx: RuleContext) -> Signature:
    """Query heads shard alone; the kv heads `g` stay whole (fewer kv heads than ranks)."""
    return Signature(
        inputs=("bshd", "btgd", "btge"),
        outputs=("bshe",),
        whole=frozenset("tdeg"),
        kernels={"s": HEAD_KERNEL, "h": HEAD_KERNEL},
    )


def cheaper(*results: RuleResult) -> RuleResult:
    """The result whose choices cost least in total (the first one on a tie)."""
    return min(results, key=lambda r: round(r.cost, 6))


def sdpa_rule(ctx: RuleContext) -> RuleResult:
    result = cheaper(solve(ctx, sdpa_signature(ctx)), solve(ctx, sdpa_query_heads_signature(ctx)))
    if result.kernel == HEAD_KERNEL:
        note = (
            "; the query heads are sharded and the kv heads are whole (fewer kv heads than "
            "ranks), so each rank's query heads read their kv heads by global index"
        )
        return replace(result, reason=result.reason + note)
    if result.kernel == OFFSET_KERNEL:
        note = (
            "; the query sequence is sharded and k/v hold the whole sequence, so each rank "
            "applies the causal mask from its block's global query offset"
        )
        return replace(result, reason=result.reason + note)
    return result


def rotary_rule(ctx: RuleContext) -> RuleResult:
    sig = Signature(
        inputs=("bsnd", "se", "se"),
        outputs=("bsnd",),
        whole=frozenset("de"),
        linearity="multilinear",
        linear_inputs=frozenset({0}),
    )
    return solve(ctx, sig)


def rope_cache_rule(ctx: RuleContext) -> RuleResult:
    result = solve(ctx, Signature(inputs=(), outputs=("se", "se")))
    note = "; every rank computes the whole table and keeps its block"
    return replace(result, reason=result.reason + note, kernel="replicated")


attach(SDPA, spmd_rule=sdpa_rule)
attach("rotary_embedding", spmd_rule=rotary_rule)
attach("rope_cache", spmd_rule=rope_cache_rule)
