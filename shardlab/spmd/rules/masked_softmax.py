"""Rules for eager attention's `masked_softmax(x)` and `masked_softmax_grad(y, dy)`.

- masked_softmax `...qk->...qk` (scores -> probabilities): the leading dims (batch, heads)
  shard; the key dim `k` stays whole (the softmax runs over it); the query dim `q` shards,
  and when causal each rank masks from its block's global query offset (kernel
  `masked_softmax_query_offset`, as `attention_query_offset` does for the fused attention).
  Non-linear: partial inputs are resolved.
- masked_softmax_grad `...qk,...qk->...qk` (y, dy): the same letters; the mask is already in
  y (zeros), so a block of queries needs no offset. Linear in dy with y replicated.
"""

from __future__ import annotations

from dataclasses import replace

from shardlab.ops import attach
from shardlab.spmd.einsum import Signature, solve
from shardlab.spmd.result import RuleContext, RuleResult

OFFSET_KERNEL = "masked_softmax_query_offset"


def _letters(ctx: RuleContext) -> str:
    """`...qk` for the input's rank: leading letters, then query and key."""
    return "abcdefqk"[8 - ctx.input_types[0].rank :]


def masked_softmax_rule(ctx: RuleContext) -> RuleResult:
    """Leading dims and (with the offset kernel when causal) queries shard; keys stay whole."""
    letters = _letters(ctx)
    causal = bool(ctx.attrs.get("causal", False)) and len(letters) >= 2
    kernels = {letters[-2]: OFFSET_KERNEL} if causal else {}
    result = solve(ctx, Signature((letters,), (letters,), whole=frozenset(letters[-1]),
                                  kernels=kernels))  # fmt: skip
    if result.kernel == OFFSET_KERNEL:
        note = "; the query dim is sharded, so each rank masks from its block's global offset"
        return replace(result, reason=result.reason + note)
    return result


def masked_softmax_grad_rule(ctx: RuleContext) -> RuleResult:
    """(y, dy) -> dx: the forward's letters, linear in dy."""
    letters = _letters(ctx)
    sig = Signature((letters, letters), (letters,), whole=frozenset(letters[-1]),
                    linearity="multilinear", linear_inputs=frozenset({1}))  # fmt: skip
    return solve(ctx, sig)


attach("masked_softmax", spmd_rule=masked_softmax_rule)
attach("masked_softmax_grad", spmd_rule=masked_softmax_grad_rule)
