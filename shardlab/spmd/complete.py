"""Completion: a DistSpec for every value and a RuleResult for every op of a graph.

1. Annotations (templates first, in order, then the user's; a later one overrides an earlier
   one on the same value and mesh axis) become per-axis constraints on values.
2. A forward pass in topological order applies each op's rule to the specs its inputs arrive
   in. Free source values (unannotated params, inputs, constants) take the spec their first
   consumer requires. Outputs take the rule's spec, overridden on annotated axes (the
   annotation is also given to the rule as a hint, so it can produce it directly). An output
   that overwrites state in place keeps that state's spec. A gradient `<v>.grad` is hinted
   to come out laid out like `v` (replicated where `v` is partial).
   Rules also get input hints (`RuleContext.input_hints`): an annotated source is pinned on
   its annotated mesh axes; where its annotation says `pin=False` (FSDP, ZeRO-3) compute
   ops use it replicated there (the recipe gathers parameters before use); and a backward
   op reads the tensors its forward op read (autograd's saved tensors) in the spec the
   forward op read them in, so the backward mirrors the forward. Rules also learn which
   other placements an input already exists in (`RuleContext.input_versions`): a copy an
   earlier consumer of the same phase had made, which the lowering reuses. A recomputed op
   (`shardlab.recompute`) replays its forward op in the same layout, and its outputs take
   the placements of the values they replay.
3. A backward step: a value produced by an unconstrained op (no inputs, or only free source
   inputs) takes the spec its first consumer requires, and the forward pass runs again,
   until nothing changes.

Every value records the decisions that gave its placement, for `explain`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shardlab.autodiff import forward_op_of, gradient_of
from shardlab.errors import PlacementError, ShardlabError
from shardlab.ir import SOURCE_KINDS, Graph, Op, OpRole, ValueKind
from shardlab.placement import DistSpec, Partial, Placement, Replicate, check_placements
from shardlab.recompute import kept_name
from shardlab.spmd.cost import reshard_cost
from shardlab.spmd.engine import infer
from shardlab.spmd.result import RuleResult
from shardlab.strategy import Annotation, Strategy, StrategyError, match_values
from shardlab.templates import template_annotations

MAX_ROUNDS = 4


@dataclass(frozen=True, slots=True)
class Decision:
    """One step that set a value's placement."""

    spec: str
    source: str  # annotation | producer | consumer | inplace | backward | default
    detail: str
    op: str | None = None


@dataclass
class CompletedGraph:
    """A graph with a DistSpec for every value and a RuleResult for every op."""

    graph: Graph
    strategy: Strategy
    specs: dict[str, DistSpec]
    rules: dict[str, RuleResult]
    arriving: dict[str, tuple[DistSpec, ...]]
    decisions: dict[str, list[Decision]]
    constraints: dict[str, dict[int, tuple[Placement, Annotation]]]
    unmatched: list[Annotation] = field(default_factory=list)
    rounds: int = 1

    @property
    def mesh(self) -> Any:
        return self.strategy.mesh

    def notes(self) -> list[str]:
        """What the templates that placed values said a reviewer should know."""
        return sorted({a.note for slot in self.constraints.values() for _, a in slot.values()
                       if a.note})  # fmt: skip

    def fallback_ops(self) -> list[str]:
        return [op.name for op in self.graph.ops if self.rules[op.name].fallback]

    def reshards(self) -> list[tuple[str, int, DistSpec, DistSpec]]:
        """(op, input index, arriving spec, required spec) for every input to reshard."""
        out = []
        for op in self.graph.ops:
            rule = self.rules[op.name]
            for i in rule.reshards(self.arriving[op.name]):
                out.append((op.name, i, self.arriving[op.name][i], rule.input_specs[i]))
        return out

    def summary(self) -> dict[str, Any]:
        reshards = self.reshards()
        return {
            "mesh": str(self.mesh),
            "strategy": self.strategy.describe(),
            "values": len(self.specs),
            "ops": len(self.rules),
            "fallback_ops": self.fallback_ops(),
            "reshard_ops": len({r[0] for r in reshards}),
            "reshards": len(reshards),
            "unmatched_template_patterns": sorted({a.pattern for a in self.unmatched}),
            "rounds": self.rounds,
        }


def resolve_annotations(
    graph: Graph, strategy: Strategy
) -> tuple[dict[str, dict[int, tuple[Placement, Annotation]]], list[Annotation]]:
    """Per value, per mesh axis index, the placement asked for and the annotation asking."""
    mesh = strategy.mesh
    names = graph.values.keys()
    constraints: dict[str, dict[int, tuple[Placement, Annotation]]] = {}
    unmatched: list[Annotation] = []
    annotations = [*template_annotations(graph, mesh, strategy.templates), *strategy.annotations]
    for ann in annotations:
        matched = match_values(ann.pattern, names)
        if not matched:
            if ann.source == "user":
                raise StrategyError(
                    f"annotation {ann.text()!r} matches no value of graph {graph.name!r}",
                    annotation=ann.text(),
                )
            unmatched.append(ann)
        for name in matched:
            slot = constraints.setdefault(name, {})
            for axis, placement in ann.placements:
                slot[mesh.axis_index(axis)] = (placement, ann)
    for name, slot in constraints.items():
        placements = [slot[k][0] if k in slot else Replicate() for k in range(mesh.ndim)]
        try:
            check_placements(graph.type_of(name).shape, mesh, placements, what=name)
        except PlacementError as exc:
            sources = sorted({_asker(a) for _, a in slot.values()})
            raise PlacementError(
                f"{exc.message} (asked by annotation {', '.join(sources)})", **exc.detail
            ) from None
    return constraints, unmatched


def _asker(ann: Annotation) -> str:
    """An annotation as an error names it: its text, and the template that made it."""
    template = ann.source.removeprefix("template:")
    return repr(ann.text()) + (f" from template {template}" if template != ann.source else "")


def complete(graph: Graph, strategy: Strategy) -> CompletedGraph:
    """Propagate placements over `graph` until a fixpoint; see the module docstring."""
    constraints, unmatched = resolve_annotations(graph, strategy)
    backward: dict[str, DistSpec] = {}
    result = _forward(graph, strategy, constraints, backward)
    for rounds in range(2, MAX_ROUNDS + 1):
        changed = _backward(graph, result, constraints, backward)
        if not changed:
            break
        result = _forward(graph, strategy, constraints, backward)
        result.rounds = rounds
    result.unmatched = unmatched
    return result


def _constrained(spec: DistSpec, slot: dict[int, tuple[Placement, Annotation]] | None) -> DistSpec:
    if not slot:
        return spec
    placements = tuple(slot[k][0] if k in slot else p for k, p in enumerate(spec.placements))
    return DistSpec(spec.mesh, placements)


def _annotation_text(slot: dict[int, tuple[Placement, Annotation]]) -> str:
    anns = {a.text(): a.source for _, a in slot.values()}
    return ", ".join(f"{t!r} ({s})" for t, s in anns.items())


def _forward(
    graph: Graph,
    strategy: Strategy,
    constraints: dict[str, dict[int, tuple[Placement, Annotation]]],
    backward: dict[str, DistSpec],
) -> CompletedGraph:
    mesh = strategy.mesh
    replicated = DistSpec.replicated(mesh)
    specs: dict[str, DistSpec] = {}
    decisions: dict[str, list[Decision]] = {}
    for value in graph.values.values():
        slot = constraints.get(value.name)
        if graph.producer(value.name) is None and slot:
            specs[value.name] = _constrained(replicated, slot)
            decisions[value.name] = [
                Decision(
                    str(specs[value.name]), "annotation", f"annotated {_annotation_text(slot)}"
                )
            ]
    rules: dict[str, RuleResult] = {}
    arriving: dict[str, tuple[DistSpec, ...]] = {}
    pins = _pins(graph, constraints, mesh.ndim, use=False)
    gathers = _pins(graph, constraints, mesh.ndim, use=True)
    copies: dict[str, set[tuple[Placement, ...]]] = {}  # resharded copies the lowering reuses
    in_forward = True
    for op in graph.ops:
        if in_forward and op.role == OpRole.BACKWARD:
            in_forward = False
            _forget_forward_copies(graph, copies, specs)
        in_specs = [specs.get(v) for v in op.inputs]
        hints = [_hint(graph, constraints, backward, specs, v, mesh.ndim) for v in op.outputs]
        inplace = _inplace(graph, op)
        saved = _saved_specs(graph, op, rules, specs)
        sources = pins if op.role == OpRole.OPTIMIZER else gathers
        in_hints = [saved[v].placements if v in saved else sources.get(v) for v in op.inputs]
        try:
            rule = infer(
                op.kind,
                [graph.type_of(v) for v in op.inputs],
                in_specs,
                op.attrs,
                mesh,
                hints,
                inplace,
                in_hints,
                [_deferrable(graph, v) for v in op.outputs],
                [frozenset(copies.get(v, ())) for v in op.inputs],
            )
        except ShardlabError as exc:
            raise type(exc)(f"op {op.name!r} ({op.kind}): {exc.message}", op=op.name) from None
        rules[op.name] = rule
        for v, have, need in zip(op.inputs, in_specs, rule.input_specs, strict=True):
            if have is not None and have != need:
                copies.setdefault(v, set()).add(need.placements)
            if have is None:
                stored = DistSpec(
                    mesh,
                    tuple(Replicate() if isinstance(p, Partial) else p for p in need.placements),
                )
                detail = f"free; takes what its first consumer {op.name!r} ({op.kind}) needs"
                if stored != need:  # a value is never stored as partial sums
                    detail += f" ({need}), replicated where it would be partial"
                specs[v] = stored
                decisions[v] = [Decision(str(stored), "consumer", detail, op.name)]
        arriving[op.name] = tuple(specs[v] for v in op.inputs)
        for j, v in enumerate(op.outputs):
            _place_output(graph, op, j, v, rule, inplace, specs, decisions, constraints)
    for value in graph.values.values():
        if value.name not in specs:
            specs[value.name] = replicated
            decisions[value.name] = [Decision(str(replicated), "default", "never read: replicated")]
    return CompletedGraph(graph, strategy, specs, rules, arriving, decisions, constraints)


def _forget_forward_copies(
    graph: Graph, copies: dict[str, set[tuple[Placement, ...]]], specs: dict[str, DistSpec]
) -> None:
    """As the lowering does when the backward starts: keep only the copies cut from a value
    locally (a slice; nothing moved), since a gathered copy is not kept for the backward."""
    for v, kept in copies.items():
        spec, ttype = specs[v], graph.type_of(v)
        copies[v] = {p for p in kept if reshard_cost(ttype, spec.mesh, spec.placements, p) == 0}


def _place_output(
    graph: Graph,
    op: Op,
    j: int,
    name: str,
    rule: RuleResult,
    inplace: list[int | None],
    specs: dict[str, DistSpec],
    decisions: dict[str, list[Decision]],
    constraints: dict[str, dict[int, tuple[Placement, Annotation]]],
) -> None:
    produced = rule.output_specs[j]
    trail = [Decision(str(produced), "producer", rule.reason, op.name)]
    spec = produced
    source = inplace[j]
    if source is not None:
        state = specs[op.inputs[source]]
        if state != spec:
            trail.append(
                Decision(
                    str(state),
                    "inplace",
                    f"updates {op.inputs[source]!r} in place and keeps its spec {state}",
                    op.name,
                )
            )
        spec = state
    slot = constraints.get(name) or constraints.get(kept_name(name))  # a replay: as forward
    if slot:
        wanted = _constrained(spec, slot)
        if wanted != spec:
            trail.append(
                Decision(
                    str(wanted),
                    "annotation",
                    f"annotated {_annotation_text(slot)}; "
                    f"{op.name!r} produces {spec}, resharded after the op",
                    op.name,
                )
            )
        else:
            trail.append(
                Decision(str(spec), "annotation", f"as annotated {_annotation_text(slot)}")
            )
        spec = wanted
    specs[name] = spec
    decisions[name] = trail


def _hint(
    graph: Graph,
    constraints: dict[str, dict[int, tuple[Placement, Annotation]]],
    backward: dict[str, DistSpec],
    specs: dict[str, DistSpec],
    name: str,
    ndim: int,
) -> tuple[Placement | None, ...] | None:
    """The placements an output should come out in: a backward-step request, its
    annotation, or - for a gradient `<v>.grad` - the layout of `v`."""
    if name in backward:
        return backward[name].placements
    slot = constraints.get(name) or constraints.get(kept_name(name))
    if slot:  # a recomputed value is laid out like the value it replays
        return tuple(slot[k][0] if k in slot else None for k in range(ndim))
    base = gradient_of(name)
    if base is not None and base in specs and graph.value(name).kind == ValueKind.GRAD:
        return tuple(None if isinstance(p, Partial) else p for p in specs[base].placements)
    return None


#: Sums: their rules take partial inputs together and count one reduction of the result.
PASS_PARTIAL = frozenset({"add", "sub"})


def _deferrable(graph: Graph, name: str) -> bool:
    """True when every consumer of `name` is a sum, which reduces partial inputs together
    (gradient contributions summed into one gradient, a residual add)."""
    consumers = graph.consumers(name)
    return bool(consumers) and all(op.kind in PASS_PARTIAL for op in consumers)


def _pins(
    graph: Graph,
    constraints: dict[str, dict[int, tuple[Placement, Annotation]]],
    ndim: int,
    use: bool,
) -> dict[str, tuple[Placement | None, ...]]:
    """Per annotated source value, the placements its annotations fix, by mesh axis: where it
    is pinned, its annotated placement; where it is not (FSDP, ZeRO-3) and `use` is asked
    (a compute op, not the optimizer), replicated: the recipe gathers it before use."""
    out: dict[str, tuple[Placement | None, ...]] = {}
    for name, slot in constraints.items():
        if graph.producer(name) is not None:
            continue
        fixed: list[Placement | None] = [None] * ndim
        for k, (placement, ann) in slot.items():
            fixed[k] = placement if ann.pin else (Replicate() if use else None)
        if any(p is not None for p in fixed):
            out[name] = tuple(fixed)
    return out


def _saved_specs(
    graph: Graph, op: Op, rules: dict[str, RuleResult], specs: dict[str, DistSpec]
) -> dict[str, DistSpec]:
    """For a backward op, the specs in which its forward op read its inputs, and the specs
    of the forward op's outputs: the layout of the tensors autograd saves for it."""
    if op.role != OpRole.BACKWARD:
        return {}
    forward = forward_op_of(op.name)
    rule = rules.get(forward) if forward is not None else None
    if forward is None or rule is None:
        return {}
    fwd = graph.op(forward)
    saved = dict(zip(fwd.inputs, rule.input_specs, strict=True))
    for v in fwd.outputs:
        saved.setdefault(v, specs[v])
    return {v: saved[kept_name(v)] for v in op.inputs if kept_name(v) in saved}


def _inplace(graph: Graph, op: Op) -> list[int | None]:
    """For each output, the input it overwrites: attr `inplace`, else a state input alike."""
    declared = op.attrs.get("inplace")
    if isinstance(declared, list) and len(declared) == len(op.outputs):
        return [i if isinstance(i, int) else None for i in declared]
    out: list[int | None] = []
    for name in op.outputs:
        value = graph.value(name)
        match = None
        if value.kind in (ValueKind.PARAM, ValueKind.STATE):
            for i, inp in enumerate(op.inputs):
                src = graph.value(inp)
                if src.kind == value.kind and src.type == value.type:
                    match = i
                    break
        out.append(match)
    return out


def _free_producer(graph: Graph, op: Op, constraints: dict[str, Any]) -> bool:
    """An op whose inputs are all unannotated sources (or that has none)."""
    for v in op.inputs:
        value = graph.value(v)
        if graph.producer(v) is not None or value.kind not in SOURCE_KINDS or v in constraints:
            return False
    return True


def _backward(
    graph: Graph,
    done: CompletedGraph,
    constraints: dict[str, dict[int, tuple[Placement, Annotation]]],
    backward: dict[str, DistSpec],
) -> bool:
    changed = False
    for op in reversed(graph.ops):
        if not _free_producer(graph, op, constraints):
            continue
        for v in op.outputs:
            consumers = graph.consumers(v)
            if not consumers or v in constraints:
                continue
            first = consumers[0]
            need = done.rules[first.name].input_specs[first.inputs.index(v)]
            if need != done.specs[v] and backward.get(v) != need:
                backward[v] = need
                changed = True
    return changed
