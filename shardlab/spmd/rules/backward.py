"""Rules for the kinds autodiff emits: gradient seeds, fused backward kernels, optimizers.

Weight gradients come out `Partial(sum)` wherever the forward sharded a contracted letter
(the batch of a data-parallel step): that is what makes the gradient all-reduce (or, with
sharded parameters, reduce-scatter) appear in front of the optimizer.
"""

from __future__ import annotations

import dataclasses

from shardlab.ops import attach
from shardlab.ops.base import attr_int, normalize_dim
from shardlab.ops.reduce import reduce_dims
from shardlab.placement import DistSpec, Shard
from shardlab.spmd.einsum import UNSHARDABLE, Signature, broadcast_letters, solve
from shardlab.spmd.result import RuleContext, RuleResult
from shardlab.spmd.rules.attention import GRAD_HEAD_KERNEL, cheaper

LETTERS = "abcdefg"


def fill_rule(ctx: RuleContext) -> RuleResult:
    """No inputs: the output takes its annotation, else replicated; computed whole, then cut."""
    letters = LETTERS[: ctx.output_types[0].rank]
    result = solve(ctx, Signature((), (letters,)))
    return RuleResult(result.input_specs, result.output_specs, result.reason,
                      kernel="replicated", choices=result.choices, cost=result.cost)  # fmt: skip


def pointwise_grad_rule(ctx: RuleContext) -> RuleResult:
    """dx = f'(x) * dy: elementwise, linear in dy."""
    letters = LETTERS[: ctx.output_types[0].rank]
    sig = Signature((letters, letters), (letters,), linearity="multilinear",
                    linear_inputs=frozenset({1}))  # fmt: skip
    return solve(ctx, sig)


def main_grad_rule(ctx: RuleContext) -> RuleResult:
    """The float32 main gradient keeps the 16-bit gradient's placement, partial sums
    included, so the gradient reduction runs in float32 as Megatron-LM's does."""
    spec = ctx.input_specs[0] or DistSpec.replicated(ctx.mesh)
    reason = (
        f"main_grad: keeps the gradient's placement {spec}; it is reduced as the float32 "
        "main gradient (Megatron-LM reduces bf16 training's gradients in fp32)"
    )
    return RuleResult((spec,), (spec,), reason)


def optimizer_rule(ctx: RuleContext) -> RuleResult:
    """Elementwise over (param, grad, state...): each rank updates its own block, in the
    layout of the parameter and its states; a partial gradient is reduced into it."""
    letters = LETTERS[: ctx.output_types[0].rank]
    n_in, n_out = len(ctx.input_types), len(ctx.output_types)
    sig = Signature((letters,) * n_in, (letters,) * n_out, scatter_partials=False)
    return solve(ctx, sig)


def norm_grad_rule(ctx: RuleContext) -> RuleResult:
    """(x, w, dy) -> dx, dw[, db]: the normalised dim stays whole; dw sums over the rest."""
    x = ctx.input_types[0]
    lead, last = LETTERS[: x.rank - 1], LETTERS[x.rank - 1]
    outs = (lead + last, *([last] * (len(ctx.output_types) - 1)))
    sig = Signature((lead + last, last, lead + last), outs, whole=frozenset({last}))
    return solve(ctx, sig)


def attention_grad_rule(ctx: RuleContext) -> RuleResult:
    """(q, k, v, dy) -> dq, dk, dv over batch and heads; sequences and head dims whole.
    With the kv heads `g` whole and the query heads sharded (fewer kv heads than ranks),
    dk and dv are partial sums over the ranks sharing a kv head; the cheaper form wins."""
    shared = Signature(("bshd", "bthd", "bthe", "bshe"), ("bshd", "bthd", "bthe"),
                       whole=frozenset("stde"))  # fmt: skip
    alone = Signature(("bshd", "btgd", "btge", "bshe"), ("bshd", "btgd", "btge"),
                      whole=frozenset("stdeg"), kernels={"h": GRAD_HEAD_KERNEL})  # fmt: skip
    return cheaper(solve(ctx, shared), solve(ctx, alone))


def cross_entropy_grad_rule(ctx: RuleContext) -> RuleResult:
    """(logits, labels, dloss, lse) -> dlogits: tokens and the vocab may both be sharded.

    Kernel `cross_entropy_grad_sharded` divides a mean by the global token count and, with
    the vocab sharded (the vocab-parallel loss backward), takes the softmax of its block of
    the vocab from the forward's log-sum-exp per label (whole on the vocab axes), so it
    issues no all-reduce; dlogits stay vocab-sharded and the LM head's weight gradient is
    computed on each rank's vocab block only.
    """
    logits = ctx.output_types[0]
    lead, vocab = LETTERS[: logits.rank - 1], LETTERS[logits.rank - 1]
    kernels = dict.fromkeys(lead + vocab, "cross_entropy_grad_sharded")
    return solve(ctx, Signature((lead + vocab, lead, "", lead), (lead + vocab,), kernels=kernels))


def embedding_grad_rule(ctx: RuleContext) -> RuleResult:
    """(ids, dy) -> dtable: ids' letters are contracted (a partial sum), H follows dy; the
    vocab `v` shards with kernel `embedding_grad_vocab_parallel` (each rank scatter-adds
    only the ids inside its rows: Megatron's vocab-parallel embedding backward)."""
    ids = ctx.input_types[0]
    lead = LETTERS[: ids.rank]
    sig = Signature((lead, lead + "h"), ("vh",), kernels={"v": "embedding_grad_vocab_parallel"})
    return solve(ctx, sig)


def broadcast_to_rule(ctx: RuleContext) -> RuleResult:
    """x -> x broadcast to `shape`: x's dims follow, broadcast (size-1) dims stay whole."""
    out = ctx.output_types[0]
    letters = LETTERS[: out.rank]
    x_letters = broadcast_letters([ctx.input_types[0], out], out.rank, letters)[0]
    result = solve(ctx, Signature((x_letters,), (letters,), linearity="multilinear"))
    sharded = any(isinstance(p, Shard) for p in result.output_specs[0].placements)
    return dataclasses.replace(result, kernel="shape_attr_local") if sharded else result


def slice_grad_rule(ctx: RuleContext) -> RuleResult:
    """dy -> zeros with dy at the sliced positions: the sliced dim whole, linear in dy."""
    letters = LETTERS[: ctx.input_types[0].rank]
    dim = normalize_dim(attr_int(ctx.attrs, "dim"), len(letters), "slice_grad: attribute 'dim'")
    sig = Signature((letters,), (letters,), whole=frozenset({letters[dim]}),
                    linearity="multilinear")  # fmt: skip
    return solve(ctx, sig)


def max_grad_rule(ctx: RuleContext) -> RuleResult:
    """(x, y, dy) -> dx: the reduced dims whole (ties are counted there), linear in dy."""
    x = ctx.input_types[0]
    letters = LETTERS[: x.rank]
    dims = reduce_dims(x.rank, ctx.attrs, "max_grad")
    keep = bool(ctx.attrs.get("keepdim", False))
    reduced = "".join(
        (UNSHARDABLE if d in dims else ch) for d, ch in enumerate(letters) if keep or d not in dims
    )
    sig = Signature((letters, reduced, reduced), (letters,),
                    whole=frozenset(letters[d] for d in dims),
                    linearity="multilinear", linear_inputs=frozenset({2}))  # fmt: skip
    return solve(ctx, sig)


attach("fill", spmd_rule=fill_rule)
attach("broadcast_to", spmd_rule=broadcast_to_rule)
attach("slice_grad", spmd_rule=slice_grad_rule)
attach("max_grad", spmd_rule=max_grad_rule)
for _kind in ("relu_grad", "gelu_grad", "silu_grad", "sigmoid_grad", "tanh_grad"):
    attach(_kind, spmd_rule=pointwise_grad_rule)
attach("main_grad", spmd_rule=main_grad_rule)
attach("sgd", spmd_rule=optimizer_rule)
attach("adamw", spmd_rule=optimizer_rule)
attach("layer_norm_grad", spmd_rule=norm_grad_rule)
attach("rms_norm_grad", spmd_rule=norm_grad_rule)
attach("attention_grad", spmd_rule=attention_grad_rule)
attach("cross_entropy_grad", spmd_rule=cross_entropy_grad_rule)
attach("embedding_grad", spmd_rule=embedding_grad_rule)
