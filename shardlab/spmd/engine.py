"""`infer`: apply the sharding rule of an op kind (or the replicated fallback)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from shardlab.errors import PlacementError
from shardlab.ir import TensorType
from shardlab.mesh import Mesh
from shardlab.ops import get_op, infer_types
from shardlab.placement import DistSpec, Placement, check_placements
from shardlab.spmd.fallback import replicated_rule
from shardlab.spmd.result import RuleContext, RuleResult

Rule = Callable[[RuleContext], RuleResult]


def rule_for(kind: str) -> tuple[Rule, bool]:
    """The rule of `kind` and whether it is the generated fallback."""
    rule = get_op(kind).spmd_rule
    return (rule, False) if rule is not None else (replicated_rule, True)


def infer(
    kind: str,
    input_types: Sequence[TensorType],
    input_specs: Sequence[DistSpec | None],
    attrs: Mapping[str, Any],
    mesh: Mesh,
    output_hints: Sequence[DistSpec | Sequence[Placement | None] | None] = (),
    inplace: Sequence[int | None] = (),
    input_hints: Sequence[DistSpec | Sequence[Placement | None] | None] = (),
    deferrable: Sequence[bool] = (),
) -> RuleResult:
    """The RuleResult of applying `kind` to inputs that arrive in `input_specs`.

    A None spec is a value whose placement is still free. Specs that do not fit their input
    raise PlacementError naming the input. `input_hints` are the placements inputs must be
    used in where that is decided elsewhere (`RuleContext.input_hints`); `deferrable` says
    per output whether its consumers pass a partial value through.
    """
    if len(input_specs) != len(input_types):
        raise PlacementError(
            f"{kind}: {len(input_specs)} input specs for {len(input_types)} inputs"
        )
    for i, (t, spec) in enumerate(zip(input_types, input_specs, strict=True)):
        if spec is None:
            continue
        if spec.mesh != mesh:
            raise PlacementError(f"{kind}: input {i} is placed on another mesh ({spec.mesh})")
        check_placements(t.shape, mesh, spec.placements, what=f"{kind} input {i}")
    ctx = RuleContext(
        kind=kind,
        mesh=mesh,
        input_types=tuple(input_types),
        output_types=tuple(infer_types(kind, input_types, dict(attrs))),
        input_specs=tuple(input_specs),
        attrs=dict(attrs),
        output_hints=tuple(_hint(h) for h in output_hints),
        inplace=tuple(inplace),
        input_hints=tuple(_hint(h) for h in input_hints),
        deferrable=tuple(deferrable),
    )
    rule, _ = rule_for(kind)
    return rule(ctx)


def _hint(
    hint: DistSpec | Sequence[Placement | None] | None,
) -> tuple[Placement | None, ...] | None:
    if hint is None:
        return None
    return tuple(hint.placements) if isinstance(hint, DistSpec) else tuple(hint)
