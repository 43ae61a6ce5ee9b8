"""Rules for reductions (`sum`, `mean`, `max`) and `softmax` / `log_softmax`.

A reduction is `abc->ac` (keepdim: `abc->a_c`, the kept size-1 dim never sharded). A reduced
letter that is sharded is contracted: every rank reduces its block and the output is
`Partial(sum)` for sum, `Partial(avg)` for mean (equal blocks, so the mean of the block means
is the mean), `Partial(max)` for max. sum and mean are linear: `Partial(sum|avg)` inputs pass
through. max passes only `Partial(max)` through (max of maxima), the other partials are
resolved first. softmax and log_softmax keep their `dim` whole and resolve partial inputs;
every other dim follows the input.
"""

from __future__ import annotations

from shardlab.ops import attach
from shardlab.ops.base import attr_int, normalize_dim
from shardlab.ops.reduce import reduce_dims
from shardlab.spmd.einsum import UNSHARDABLE, Signature, solve
from shardlab.spmd.result import RuleContext, RuleResult

LETTERS = "abcdefgh"
#: kind -> (Partial op of a contracted letter, partial ops that pass through).
REDUCTIONS = {
    "sum": ("sum", frozenset({"sum", "avg"})),
    "mean": ("avg", frozenset({"sum", "avg"})),
    "max": ("max", frozenset({"max"})),
}


def reduce_signature(ctx: RuleContext) -> Signature:
    """`abc->ac` for a reduction over dim 1; kept reduced dims become `_`."""
    x = ctx.input_types[0]
    letters = LETTERS[: x.rank]
    dims = reduce_dims(x.rank, ctx.attrs, ctx.kind)
    keep = bool(ctx.attrs.get("keepdim", False))
    out = "".join(
        (UNSHARDABLE if d in dims else ch) for d, ch in enumerate(letters) if keep or d not in dims
    )
    op, passthrough = REDUCTIONS[ctx.kind]
    return Signature(
        inputs=(letters,),
        outputs=(out,),
        contraction={letters[d]: op for d in dims},
        linearity="multilinear",
        passthrough=passthrough,
    )


def reduce_rule(ctx: RuleContext) -> RuleResult:
    return solve(ctx, reduce_signature(ctx))


def softmax_rule(ctx: RuleContext) -> RuleResult:
    """The softmax dim stays whole; the other dims follow the input; partials are resolved."""
    x = ctx.input_types[0]
    letters = LETTERS[: x.rank]
    dim = normalize_dim(attr_int(ctx.attrs, "dim", -1), x.rank, f"{ctx.kind}: attribute 'dim'")
    return solve(ctx, Signature((letters,), (letters,), whole=frozenset({letters[dim]})))


for _kind in REDUCTIONS:
    attach(_kind, spmd_rule=reduce_rule)
for _kind in ("softmax", "log_softmax"):
    attach(_kind, spmd_rule=softmax_rule)
