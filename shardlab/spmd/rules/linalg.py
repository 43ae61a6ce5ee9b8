"""Rules for `matmul` (`...mk,...kn->...mn`) and `linear` (`...k,kn,n->...n`)."""

from __future__ import annotations

from shardlab.ir import TensorType
from shardlab.ops import attach
from shardlab.placement import DistSpec, Partial
from shardlab.spmd.einsum import Signature, broadcast_letters, solve
from shardlab.spmd.result import RuleContext, RuleResult

BATCH = "abcdefgh"


def matmul_signature(ctx: RuleContext) -> Signature:
    """Batch dims broadcast numpy-style; transpose flags swap an operand's last two letters."""
    a, b = ctx.input_types
    out = ctx.output_types[0]
    batch = BATCH[: out.rank - 2]
    a_batch, b_batch = broadcast_letters(
        [TensorType(a.shape[:-2]), TensorType(b.shape[:-2])], len(batch), batch
    )
    a_mk = "km" if ctx.attrs.get("transpose_a") else "mk"
    b_kn = "nk" if ctx.attrs.get("transpose_b") else "kn"
    return Signature(
        inputs=(a_batch + a_mk, b_batch + b_kn), outputs=(batch + "mn",), linearity="multilinear"
    )


def matmul_rule(ctx: RuleContext) -> RuleResult:
    return solve(ctx, matmul_signature(ctx))


def linear_rule(ctx: RuleContext) -> RuleResult:
    """x @ w like matmul; a bias joins the output's partial sums (R -> P is free)."""
    x = ctx.input_types[0]
    batch = BATCH[: x.rank - 1]
    inputs = (batch + "k", "kn", "n")[: len(ctx.input_types)]
    result = solve(ctx, Signature(inputs, (batch + "n",), linearity="multilinear",
                                  linear_inputs=frozenset({0, 1})))  # fmt: skip
    if len(ctx.input_types) < 3:
        return result
    out_spec = result.output_specs[0]
    bias = tuple(
        o if isinstance(o, Partial) else b
        for o, b in zip(out_spec.placements, result.input_specs[2].placements, strict=True)
    )
    specs = (*result.input_specs[:2], DistSpec(ctx.mesh, bias))
    reason = result.reason
    if any(isinstance(p, Partial) for p in out_spec.placements):
        reason += "; the bias joins the partial sums (held by one rank of each group)"
    return RuleResult(specs, result.output_specs, reason, choices=result.choices, cost=result.cost)


attach("matmul", spmd_rule=matmul_rule)
attach("linear", spmd_rule=linear_rule)
