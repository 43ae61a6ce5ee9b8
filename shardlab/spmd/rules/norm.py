"""Rules for `layer_norm(x, weight, bias)` and `rms_norm(x, weight)`: `abc,c,c->abc`.

The normalised (last) dim stays whole, so weight and bias, which carry only that letter,
are replicated. Every other dim follows x: batch and sequence sharding both work without
communication. Normalisation is not linear: partial inputs are resolved first.
"""

from __future__ import annotations

from shardlab.ops import attach
from shardlab.spmd.einsum import Signature, solve
from shardlab.spmd.result import RuleContext, RuleResult

LETTERS = "abcdefgh"


def norm_rule(ctx: RuleContext) -> RuleResult:
    letters = LETTERS[: ctx.input_types[0].rank]
    last = letters[-1]
    params = (last,) * (len(ctx.input_types) - 1)
    return solve(ctx, Signature((letters, *params), (letters,), whole=frozenset({last})))


for _kind in ("layer_norm", "rms_norm"):
    attach(_kind, spmd_rule=norm_rule)
