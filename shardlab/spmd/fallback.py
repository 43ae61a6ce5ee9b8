"""The generated replicated rule (seed 003): any op works before it has a real rule.

Built from the op's signature alone: every input is required `Replicate()`, every rank
computes the whole op, outputs come out `Replicate()`. It is flagged (`fallback=True`) and
counted by completion, never silent. An output that overwrites an input in place (a parameter
or optimizer-state update) is given back that input's spec, so a fallback never silently
changes where state lives: the rank keeps its own block of the replicated result.
"""

from __future__ import annotations

from shardlab.placement import DistSpec
from shardlab.spmd.result import RuleContext, RuleResult


def replicated_rule(ctx: RuleContext) -> RuleResult:
    """The fallback rule for an op kind without a sharding rule."""
    replicated = DistSpec.replicated(ctx.mesh)
    outputs = []
    kept = []
    for j in range(len(ctx.output_types)):
        source = ctx.inplace[j] if j < len(ctx.inplace) else None
        spec = ctx.input_specs[source] if source is not None else None
        if spec is not None and spec != replicated:
            outputs.append(spec)
            kept.append(f"output {j} updates input {source} in place and keeps its spec {spec}")
        else:
            outputs.append(replicated)
    reason = (
        f"{ctx.kind} has no sharding rule: fallback to the replicated rule, every rank "
        "computes the whole op on replicated inputs"
    )
    if kept:
        reason += "; " + "; ".join(kept)
    return RuleResult(
        input_specs=(replicated,) * len(ctx.input_types),
        output_specs=tuple(outputs),
        reason=reason,
        fallback=True,
        kernel="replicated",
    )
