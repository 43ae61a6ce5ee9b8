"""`infer`: apply the sharding rule of an op kind (or the replicated fallback).

Rules are pure functions of their `RuleContext`, so answers are cached: a model's repeated
layers ask the same questions, and each is solved once.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
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
    input_versions: Sequence[frozenset[tuple[Placement, ...]]] = (),
) -> RuleResult:
    """The RuleResult of applying `kind` to inputs that arrive in `input_specs`.

    A None spec is a value whose placement is still free. Specs that do not fit their input
    raise PlacementError naming the input. `input_hints` are the placements inputs must be
    used in where that is decided elsewhere (`RuleContext.input_hints`); `deferrable` says
    per output whether its consumers pass a partial value through; `input_versions` the
    other placements each input is already available in (`RuleContext.input_versions`).
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
        input_versions=tuple(input_versions),
    )
    key = _cache_key(ctx)
    if key is None:
        return rule_for(kind)[0](ctx)
    if key not in _RESULTS:
        if len(_RESULTS) >= MAX_CACHED:
            _RESULTS.clear()
        _RESULTS[key] = rule_for(kind)[0](ctx)
    return _RESULTS[key]


#: Cached rule answers (`infer`); cleared when full.
MAX_CACHED = 100_000
_RESULTS: dict[Hashable, RuleResult] = {}


def _cache_key(ctx: RuleContext) -> Hashable | None:
    """Everything a rule may look at, hashable; None when an attribute is not."""
    try:
        attrs = _frozen(ctx.attrs)
        hash(attrs)
    except TypeError:
        return None
    return (
        ctx.kind,
        ctx.mesh,
        ctx.input_types,
        ctx.input_specs,
        attrs,
        ctx.output_hints,
        ctx.inplace,
        ctx.input_hints,
        ctx.deferrable,
        ctx.input_versions,
    )


def _frozen(value: Any) -> Hashable:
    if isinstance(value, Mapping):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    frozen: Hashable = value
    return frozen


def _hint(
    hint: DistSpec | Sequence[Placement | None] | None,
) -> tuple[Placement | None, ...] | None:
    if hint is None:
        return None
    return tuple(hint.placements) if isinstance(hint, DistSpec) else tuple(hint)
