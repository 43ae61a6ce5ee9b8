"""Rules for the losses `cross_entropy` and `mse_loss` (scalar outputs).

Every input letter is contracted: a rank's loss over its block of tokens is a `Partial(avg)`
of the global mean (equal blocks) or a `Partial(sum)` of the global sum, by `reduction`.

- cross_entropy `ab..v,ab..->` (logits, labels): the leading letters shard with the labels.
  Sharding the vocab `v` is Megatron's vocab-parallel cross entropy (kernel
  `cross_entropy_vocab_parallel`): all-reduce the max and the sum of exponentials of the
  logits over the vocab axes inside the op (listed as `InnerComm`s), then each rank emits
  its share of the log-sum-exp minus the target logit if it holds it: `Partial(sum)` over
  the vocab axes whatever the reduction.
- mse_loss `ab..,ab..->`: non-linear (squared), so partial inputs are resolved.
"""

from __future__ import annotations

from dataclasses import replace

from shardlab.ir import TensorType
from shardlab.ops import attach
from shardlab.spmd.einsum import Signature, solve
from shardlab.spmd.result import InnerComm, RuleContext, RuleResult

LETTERS = "abcdefg"
VOCAB_KERNEL = "cross_entropy_vocab_parallel"


def _reduction_op(ctx: RuleContext) -> str:
    return "sum" if ctx.attrs.get("reduction", "mean") == "sum" else "avg"


def cross_entropy_signature(ctx: RuleContext) -> Signature:
    """Leading letters contracted by avg/sum; `v` contracted by sum (vocab parallel)."""
    lead = LETTERS[: ctx.input_types[0].rank - 1]
    contraction = dict.fromkeys(lead, _reduction_op(ctx))
    contraction["v"] = "sum"
    return Signature(
        inputs=(lead + "v", lead),
        outputs=("",),
        contraction=contraction,
        kernels={"v": VOCAB_KERNEL},
    )


def cross_entropy_rule(ctx: RuleContext) -> RuleResult:
    result = solve(ctx, cross_entropy_signature(ctx))
    if result.kernel != VOCAB_KERNEL:
        return result
    logits = ctx.input_types[0]
    axes = tuple(c.axis for c in result.choices if c.choice == "v")
    # The statistics are kept in float32 whatever the logits' dtype, as Megatron does.
    stats = TensorType(logits.shape[:-1], "float32")
    over = ", ".join(axes)
    comms = (
        InnerComm("all_reduce", "max", axes, stats,
                  f"vocab-parallel cross entropy: the max logit per token over {over}, "
                  "for a stable log-sum-exp"),
        InnerComm("all_reduce", "sum", axes, stats,
                  f"vocab-parallel cross entropy: the sum of exp(logit - max) per token "
                  f"over {over}, the softmax denominator"),
    )  # fmt: skip
    note = (
        f"; vocab parallel over {over}: the log-sum-exp is all-reduced inside the op and each "
        "rank adds its share of it minus the target logit where it holds the target"
    )
    return replace(result, reason=result.reason + note, inner_comms=comms)


def mse_loss_rule(ctx: RuleContext) -> RuleResult:
    letters = LETTERS[: ctx.input_types[0].rank]
    op = _reduction_op(ctx)
    sig = Signature((letters, letters), ("",), contraction=dict.fromkeys(letters, op))
    return solve(ctx, sig)


attach("cross_entropy", spmd_rule=cross_entropy_rule)
attach("mse_loss", spmd_rule=mse_loss_rule)
