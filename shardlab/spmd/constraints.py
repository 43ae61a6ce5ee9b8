"""Annotations -> per-value constraints: the placements asked for, by mesh axis.

Templates first, in order, then the user's annotations; a later one overrides an earlier
one on the same value and mesh axis. Every constrained value is checked to fit its
placements (an error names the value and the annotations that asked).

Repeated layers are resolved once: when every annotation that reaches a repeated layer is a
glob that cannot tell layers apart (`layers.*.attn.q_proj.weight`; see
`Repeats.match`), the annotations are resolved on one layer of each class and the other
layers of the class share its slots (`Constraints.layer_blind`). Otherwise (a template
that names each layer's parameters, a user annotation on `layers.3.*`) every value is
resolved by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from shardlab.annotation import Annotation, match_values
from shardlab.errors import PlacementError
from shardlab.ir import Graph, ValueKind
from shardlab.placement import DistSpec, Placement, Replicate, check_placements, local_shape
from shardlab.repeats import Repeats, is_glob, layer_blind, repeats_of, translate
from shardlab.strategy import Strategy, StrategyError
from shardlab.templates import parameter_of, template_annotations

#: per mesh axis index, the placement asked for and the annotation asking
Slot = dict[int, tuple[Placement, Annotation]]


@dataclass
class Constraints:
    """The resolved annotations of a graph under a strategy."""

    slots: dict[str, Slot]
    unmatched: list[Annotation] = field(default_factory=list)
    #: the layers of a class share their slots (resolved once, see the module docstring)
    layer_blind: bool = False


def resolve_annotations(graph: Graph, strategy: Strategy) -> Constraints:
    """Per value, per mesh axis index, the placement asked for and the annotation asking."""
    mesh = strategy.mesh
    repeats = repeats_of(graph)
    annotations = [*template_annotations(graph, mesh, strategy.templates), *strategy.annotations]
    blind = all(_blind(ann, repeats) for ann in annotations)
    slots: dict[str, Slot] = {}
    unmatched: list[Annotation] = []
    for ann in annotations:
        if blind:
            matched = _on_representatives(ann, graph, repeats)
        else:
            matched = repeats.match(ann.pattern, graph.values.keys())
        if not matched:
            if ann.source == "user":
                raise StrategyError(
                    f"annotation {ann.text()!r} matches no value of graph {graph.name!r}",
                    annotation=ann.text(),
                )
            unmatched.append(ann)
        for name in matched:
            slot = slots.setdefault(name, {})
            for axis, placement in ann.placements:
                slot[mesh.axis_index(axis)] = (placement, ann)
    _states_follow_parameters(graph, slots)
    _check(graph, strategy, slots)
    if blind:
        _share(repeats, slots)
    return Constraints(slots, unmatched, blind)


def _states_follow_parameters(graph: Graph, slots: dict[str, Slot]) -> None:
    """An optimizer state annotated on some mesh axes (ZeRO's data-parallel shard) takes
    its parameter's pinned placements on the others: Megatron's distributed optimizer with
    tensor parallelism keeps each state on its parameter's tensor-parallel shard. Left free,
    an annotated value is replicated on the axes it does not name, which held every state
    whole on every tensor-parallel rank and gathered each update back to that."""
    owners = parameter_of(graph)
    for name, slot in slots.items():
        owner = owners.get(name)
        if owner is None or graph.values[name].kind != ValueKind.STATE or owner not in slots:
            continue
        for k, (placement, ann) in slots[owner].items():
            if k not in slot and ann.pin:
                slot[k] = (placement, ann)


def _blind(ann: Annotation, repeats: Repeats) -> bool:
    """True when `ann` reaches every layer of a class alike: a layer-blind glob, or an exact
    name outside the repeated layers."""
    if is_glob(ann.pattern):
        return layer_blind(ann.pattern)
    seg = repeats.value_segment.get(ann.pattern)
    if seg is None:
        return True
    cls = repeats.segments[seg].cls
    return cls < 0 or len(repeats.classes[cls]) == 1


def _on_representatives(ann: Annotation, graph: Graph, repeats: Repeats) -> list[str]:
    """The names a layer-blind annotation matches among the representatives."""
    if is_glob(ann.pattern):
        return match_values(ann.pattern, repeats.representatives)
    return [ann.pattern] if ann.pattern in graph.values else []


def _share(repeats: Repeats, slots: dict[str, Slot]) -> None:
    """Give every later layer of a class the slots of the class's first layer."""
    segments = repeats.segments
    for members in repeats.classes:
        first = segments[members[0]]
        owned = [n for n in repeats.owned.get(first.index, ()) if n in slots]
        for m in members[1:]:
            layer = segments[m].layer
            for name in owned:
                renamed = translate(name, first.family, first.layer, layer)
                if renamed is not None:
                    slots[renamed] = slots[name]


def _check(graph: Graph, strategy: Strategy, slots: dict[str, Slot]) -> None:
    """Every constrained value fits its placements (once per distinct value type)."""
    mesh = strategy.mesh
    for name, slot in slots.items():
        placements = [slot[k][0] if k in slot else Replicate() for k in range(mesh.ndim)]
        shape = graph.type_of(name).shape
        try:
            try:
                local_shape(shape, mesh, placements)
            except PlacementError:
                check_placements(shape, mesh, placements, what=name)
        except PlacementError as exc:
            sources = sorted({_asker(a) for _, a in slot.values()})
            raise PlacementError(
                f"{exc.message} (asked by annotation {', '.join(sources)})", **exc.detail
            ) from None


def _asker(ann: Annotation) -> str:
    """An annotation as an error names it: its text, and the template that made it."""
    template = ann.source.removeprefix("template:")
    return repr(ann.text()) + (f" from template {template}" if template != ann.source else "")


def constrained(spec: DistSpec, slot: Slot | None) -> DistSpec:
    if not slot:
        return spec
    placements = tuple(slot[k][0] if k in slot else p for k, p in enumerate(spec.placements))
    return DistSpec(spec.mesh, placements)


def annotation_text(slot: Slot) -> str:
    anns = {a.text(): a.source for _, a in slot.values()}
    return ", ".join(f"{t!r} ({s})" for t, s in anns.items())


def pins(
    graph: Graph,
    constraints: Mapping[str, Slot],
    ndim: int,
    use: bool,
) -> dict[str, tuple[Placement | None, ...]]:
    """Per annotated source value, the placements its annotations fix, by mesh axis: where it
    is pinned, its annotated placement; where it is not (FSDP, ZeRO-3) and `use` is asked
    (a compute op, not the optimizer), replicated: the recipe gathers it before use."""
    out: dict[str, tuple[Placement | None, ...]] = {}
    known: dict[int, tuple[Placement | None, ...] | None] = {}  # by slot: layers share them
    for name, slot in constraints.items():
        if graph.producer(name) is not None:
            continue
        if id(slot) not in known:
            fixed: list[Placement | None] = [None] * ndim
            for k, (placement, ann) in slot.items():
                fixed[k] = placement if ann.pin else (Replicate() if use else None)
            known[id(slot)] = tuple(fixed) if any(p is not None for p in fixed) else None
        pinned = known[id(slot)]
        if pinned is not None:
            out[name] = pinned
    return out
