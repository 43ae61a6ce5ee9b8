"""Rules for `dropout(x) -> (y, mask)` and `dropout_grad(dy, mask) -> dx`.

Both are elementwise: every dim may shard. The mask is a function of each element's global
index, so a rank holding a block of x needs the block's global offsets: dropout always runs
the kernel `dropout_global_index` (on whole tensors it equals the op's own kernel).
dropout is linear in x (`y = x * mask / (1 - p)`): a `Partial(sum|avg)` input passes through
to y while the mask, which does not depend on x's values, comes out replicated. dropout_grad
is linear in dy with the mask replicated on that axis (a bool mask is never partial).
"""

from __future__ import annotations

from dataclasses import replace

from shardlab.ops import attach
from shardlab.spmd.einsum import Signature, solve
from shardlab.spmd.result import RuleContext, RuleResult

LETTERS = "abcdefgh"
KERNEL = "dropout_global_index"


def dropout_rule(ctx: RuleContext) -> RuleResult:
    """`abc->abc,abc`, multilinear in x; the mask is replicated where y is partial."""
    letters = LETTERS[: ctx.input_types[0].rank]
    sig = Signature(
        (letters,),
        (letters, letters),
        linearity="multilinear",
        value_free_outputs=frozenset({1}),
    )
    result = solve(ctx, sig)
    note = "; the mask is built from each element's global index (seed, offset of the block)"
    return replace(result, kernel=KERNEL, reason=result.reason + note)


def dropout_grad_rule(ctx: RuleContext) -> RuleResult:
    """`abc,abc->abc`, linear in dy."""
    letters = LETTERS[: ctx.input_types[0].rank]
    sig = Signature(
        (letters, letters), (letters,), linearity="multilinear", linear_inputs=frozenset({0})
    )
    return solve(ctx, sig)


attach("dropout", spmd_rule=dropout_rule)
attach("dropout_grad", spmd_rule=dropout_grad_rule)
