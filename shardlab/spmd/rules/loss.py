"""Rules for the losses `cross_entropy` and `mse_loss` (scalar losses).

Every input letter is contracted: a rank's loss over its block of tokens is a `Partial(avg)`
of the global mean (equal blocks) or a `Partial(sum)` of the global sum, by `reduction`.

- cross_entropy `ab..v,ab..->` (logits, labels -> loss[, lse]): the leading letters shard
  with the labels; the training graph's log-sum-exp per label (attr `lse`) is laid out as
  the labels are read. Sharding the vocab `v` is the vocab-parallel cross entropy of torch's
  loss_parallel() and Megatron-LM (kernel `cross_entropy_vocab_parallel`): inside the op it
  all-reduces, over the vocab axes, each label's max logit and sum of exp(logit - max) in
  float32, then the target logit (zero on the ranks that do not hold it) in the logits'
  dtype (listed as `InnerComm`s), so the loss and the log-sum-exp come out replicated over
  the vocab axes. The backward reads the kept log-sum-exp and issues none (`backward.py`).
- mse_loss `ab..,ab..->`: non-linear (squared), so partial inputs are resolved.
"""

from __future__ import annotations

from dataclasses import replace

from shardlab.ir import TensorType
from shardlab.ops import attach
from shardlab.ops.loss import LSE_DTYPE
from shardlab.placement import DistSpec, Replicate
from shardlab.spmd.einsum import GLOBAL_MEAN, Signature, solve
from shardlab.spmd.result import InnerComm, RuleContext, RuleResult

LETTERS = "abcdefg"
VOCAB_KERNEL = "cross_entropy_vocab_parallel"


def _reduction_op(ctx: RuleContext) -> str:
    return "sum" if ctx.attrs.get("reduction", "mean") == "sum" else "avg"


def cross_entropy_signature(ctx: RuleContext) -> Signature:
    """Of the loss alone: leading letters contracted by avg/sum; `v` contracted (the kernel
    all-reduces what it needs, `cross_entropy_rule`)."""
    lead = LETTERS[: ctx.input_types[0].rank - 1]
    contraction = dict.fromkeys(lead, _reduction_op(ctx))
    contraction["v"] = "sum"
    return Signature(
        inputs=(lead + "v", lead),
        outputs=("",),
        contraction=contraction,
        kernels={"v": VOCAB_KERNEL},
    )


def _loss_only(ctx: RuleContext) -> RuleContext:
    """`ctx` without the log-sum-exp output (attr `lse`): the rule solves for the loss."""
    return replace(
        ctx,
        output_types=ctx.output_types[:1],
        output_hints=ctx.output_hints[:1],
        inplace=ctx.inplace[:1],
        deferrable=ctx.deferrable[:1],
    )


def vocab_parallel_comms(logits: TensorType, axes: tuple[str, ...]) -> tuple[InnerComm, ...]:
    """The all-reduces of the vocab-parallel cross entropy over `axes`, one value per label
    each: the max and the sum of exponentials in float32 (`LSE_DTYPE`), the target logit in
    the logits' dtype (as torch's loss_parallel() issues them)."""
    stats = TensorType(logits.shape[:-1], LSE_DTYPE)
    target = TensorType(logits.shape[:-1], logits.dtype)
    over = ", ".join(axes)
    return (
        InnerComm("all_reduce", "max", axes, stats,
                  f"vocab-parallel cross entropy: the max logit per token over {over}, "
                  "for a stable log-sum-exp"),
        InnerComm("all_reduce", "sum", axes, stats,
                  f"vocab-parallel cross entropy: the sum of exp(logit - max) per token "
                  f"over {over}, the softmax denominator"),
        InnerComm("all_reduce", "sum", axes, target,
                  f"vocab-parallel cross entropy: the target logit per token over {over}, "
                  "from the rank that holds it"),
    )  # fmt: skip


def _replicated_on(spec: DistSpec, axes: tuple[str, ...]) -> DistSpec:
    """`spec` with `axes` replicated (the kernel's all-reduces made it whole there)."""
    names = spec.mesh.axis_names
    placements = tuple(
        Replicate() if names[k] in axes else p for k, p in enumerate(spec.placements)
    )
    return DistSpec(spec.mesh, placements)


def cross_entropy_rule(ctx: RuleContext) -> RuleResult:
    """The loss's placements from the einsum solver; the log-sum-exp per label (when the
    training graph asks for it) is laid out as the labels are read: sharded with the
    tokens, whole over the vocab axes."""
    result = solve(_loss_only(ctx), cross_entropy_signature(ctx))
    outputs = (*result.output_specs, *result.input_specs[1:2] * (len(ctx.output_types) - 1))
    result = replace(result, output_specs=outputs)
    if result.kernel not in (VOCAB_KERNEL, GLOBAL_MEAN[VOCAB_KERNEL]):
        return result
    axes = tuple(c.axis for c in result.choices if c.choice == "v")
    over = ", ".join(axes)
    note = (
        f"; vocab parallel over {over}: the max, the sum of exponentials and the target "
        "logit are all-reduced inside the op, so the loss is whole on every rank of the group"
    )
    return replace(
        result,
        output_specs=tuple(_replicated_on(s, axes) for s in result.output_specs),
        reason=result.reason + note,
        inner_comms=vocab_parallel_comms(ctx.input_types[0], axes),
    )


def mse_loss_rule(ctx: RuleContext) -> RuleResult:
    letters = LETTERS[: ctx.input_types[0].rank]
    op = _reduction_op(ctx)
    sig = Signature((letters, letters), ("",), contraction=dict.fromkeys(letters, op))
    return solve(ctx, sig)


attach("cross_entropy", spmd_rule=cross_entropy_rule)
attach("mse_loss", spmd_rule=mse_loss_rule)
