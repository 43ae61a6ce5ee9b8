"""Rules for elementwise ops: broadcasting letters, and how partial values pass through.

`add`/`sub` are affine: partial inputs pass through when every input is partial (a
replicated input becomes partial for free). `mul` is multilinear (one input partial, the
others replicated); `div` is linear in its numerator; `neg`, `scale` and float-to-float
`cast` are linear. Every other elementwise op is non-linear: partial inputs are resolved.
"""

from __future__ import annotations

from shardlab.ops import attach
from shardlab.spmd.einsum import Signature, broadcast_letters, solve
from shardlab.spmd.result import RuleContext, RuleResult

LETTERS = "abcdefgh"
LINEARITY = {
    "add": ("affine", None),
    "sub": ("affine", None),
    "mul": ("multilinear", None),
    "div": ("multilinear", frozenset({0})),
    "neg": ("multilinear", None),
    "scale": ("multilinear", None),
}
NONLINEAR_UNARY = (
    "relu",
    "gelu",
    "silu",
    "sigmoid",
    "tanh",
    "exp",
    "log",
    "square",
    "sqrt",
    "rsqrt",
)


def elementwise_rule(ctx: RuleContext) -> RuleResult:
    out = ctx.output_types[0]
    letters = LETTERS[: out.rank]
    inputs = broadcast_letters(list(ctx.input_types), out.rank, letters)
    linearity, linear_inputs = LINEARITY.get(ctx.kind, ("none", None))
    if ctx.kind == "cast" and ctx.input_types[0].is_float and out.is_float:
        linearity = "multilinear"
    return solve(ctx, Signature(tuple(inputs), (letters,), linearity=linearity,
                                linear_inputs=linear_inputs))  # fmt: skip


for _kind in (*LINEARITY, *NONLINEAR_UNARY, "cast"):
    attach(_kind, spmd_rule=elementwise_rule)
