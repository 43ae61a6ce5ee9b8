"""Completion: a DistSpec for every value and a RuleResult for every op of a graph.

1. Annotations (templates first, in order, then the user's; a later one overrides an earlier
   one on the same value and mesh axis) become per-axis constraints on values
   (`spmd.constraints`).
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

Every value records the decisions that gave its placement, for `explain`. Repeated layers
are completed once per distinct situation and share the results (`spmd.folding`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shardlab.autodiff import forward_op_of, gradient_of
from shardlab.errors import GraphError, ShardlabError
from shardlab.ir import SOURCE_KINDS, Graph, Op, OpRole, ValueKind
from shardlab.placement import (
    DistSpec,
    Partial,
    Placement,
    Replicate,
)
from shardlab.recompute import kept_name
from shardlab.repeats import Segment, repeats_of, translate
from shardlab.spmd.constraints import (
    Constraints,
    annotation_text,
    constrained,
    pins,
    resolve_annotations,
)
from shardlab.spmd.cost import reshard_cost
from shardlab.spmd.engine import infer
from shardlab.spmd.folding import FoldedMap, Recorder, rename_text, slot_key, uniform_segments
from shardlab.spmd.fsdp_grads import fsdp_managed, fsdp_parameter, tensor_axes, tensor_layout
from shardlab.spmd.result import RuleResult
from shardlab.strategy import Annotation, Strategy

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
    specs: Mapping[str, DistSpec]
    rules: Mapping[str, RuleResult]
    arriving: Mapping[str, tuple[DistSpec, ...]]
    decisions: Mapping[str, list[Decision]]
    constraints: dict[str, dict[int, tuple[Placement, Annotation]]]
    unmatched: list[Annotation] = field(default_factory=list)
    rounds: int = 1
    #: layer segments that took a twin's results (`spmd.folding`) in the last pass
    folded_segments: int = 0

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

    def repetition(self) -> dict[str, int]:
        """How much of the graph is repeated layers, and how much completion folded: layer
        segments (a layer's ops of one role), distinct bodies among them, and the segments
        that took a twin's results instead of being completed."""
        repeats = repeats_of(self.graph)
        layer_segments = sum(1 for s in repeats.segments if s.cls >= 0)
        return {
            "layers": repeats.layer_count(),
            "layer_segments": layer_segments,
            "distinct_bodies": len(repeats.classes),
            "folded": self.folded_segments,
        }

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


def complete(graph: Graph, strategy: Strategy, fold: bool = True) -> CompletedGraph:
    """Propagate placements over `graph` until a fixpoint; see the module docstring.
    `fold=False` completes every repeated layer for real (the folded result is equal)."""
    resolved = resolve_annotations(graph, strategy)
    constraints, unmatched = resolved.slots, resolved.unmatched
    backward: dict[str, DistSpec] = {}
    result = _forward(graph, strategy, resolved, backward, fold)
    for rounds in range(2, MAX_ROUNDS + 1):
        changed = _backward(graph, result, constraints, backward)
        if not changed:
            break
        result = _forward(graph, strategy, resolved, backward, fold)
        result.rounds = rounds
    result.unmatched = unmatched
    return result


class _Walk:
    """One forward pass of completion: its results so far, the state rules read (through
    the recorder, so that a repeated layer can be folded onto a twin: `spmd.folding`)."""

    def __init__(
        self, graph: Graph, strategy: Strategy, resolved: Constraints, backward: dict[str, DistSpec]
    ) -> None:
        constraints = resolved.slots
        self.graph, self.mesh = graph, strategy.mesh
        self.repeats = repeats = repeats_of(graph)
        self.folded: dict[int, int] = {}  # folded segment -> its twin
        values, owner_v = (lambda: graph.values.keys()), repeats.value_segment
        ops, owner_o = (lambda: (op.name for op in graph.ops)), repeats.op_segment
        self.specs: FoldedMap[DistSpec] = FoldedMap(repeats, owner_v, self.folded, values)
        self.decisions: FoldedMap[list[Decision]] = FoldedMap(
            repeats, owner_v, self.folded, values, _renamed_decisions
        )
        self.rules: FoldedMap[RuleResult] = FoldedMap(repeats, owner_o, self.folded, ops)
        self.arriving: FoldedMap[tuple[DistSpec, ...]] = FoldedMap(
            repeats, owner_o, self.folded, ops
        )
        self.copies: dict[str, set[tuple[Placement, ...]]] = {}  # copies the lowering reuses
        self.constraints, self.backward = constraints, backward
        #: the mesh axes tensor parallelism shards parameters on (`spmd.fsdp_grads`)
        self.tensor_axes = tensor_axes(graph, constraints)
        #: the tables read by name as they are: placements, backward-step requests, the
        #: placements pinned for the optimizer and gathered for compute ops
        self.tables: dict[str, Mapping[str, Any]] = {
            "specs": self.specs,
            "backward": backward,
            "pins": pins(graph, constraints, self.mesh.ndim, use=False),
            "gathers": pins(graph, constraints, self.mesh.ndim, use=True),
        }
        self.rec = Recorder(owner_v)
        if resolved.layer_blind and not backward:  # the layers of a class share their slots
            self.uniform = {s.index for s in repeats.segments}
        else:
            self.uniform = uniform_segments(repeats, constraints, backward)

    # -- reads, noted by the recorder -----------------------------------------------------

    def spec(self, v: str) -> DistSpec | None:
        spec: DistSpec | None = self.specs.get(v)
        return self.rec.read("specs", v, spec)

    def constraint(self, v: str) -> dict[int, tuple[Placement, Annotation]] | None:
        slot = self.constraints.get(v)
        seg = self.rec.current
        if seg is None:
            return slot
        return self.rec.read("constraints", v, slot, slot_key(slot, seg.family, seg.layer))

    def requested(self, v: str) -> DistSpec | None:
        return self.rec.read("backward", v, self.backward.get(v))

    def pinned(self, v: str, optimizer: bool) -> tuple[Placement | None, ...] | None:
        table = "pins" if optimizer else "gathers"
        return self.rec.read(table, v, self.tables[table].get(v))

    def copies_of(self, v: str) -> frozenset[tuple[Placement, ...]]:
        return self.rec.read("copies", v, frozenset(self.copies.get(v, ())))

    def saved(self, op: Op) -> dict[str, DistSpec]:
        if op.role != OpRole.BACKWARD:
            return {}
        found = _saved_specs(self.graph, op, self.rules, self.specs)
        self.rec.read("saved", op.name, _saved_key(op, found))
        return found

    def lookup(self, table: str, name: str, segment: Segment | None = None) -> Any:
        """What a read of `table` under `name` gives now (without noting it), as the
        recorder compares it for `segment`."""
        if table == "constraints":
            slot = self.constraints.get(name)
            return slot if segment is None else slot_key(slot, segment.family, segment.layer)
        if table in self.tables:
            return self.tables[table].get(name)
        if table == "copies":
            return frozenset(self.copies.get(name, ()))
        if table == "saved":
            try:
                op = self.graph.op(name)
            except GraphError:
                return None
            return _saved_key(op, _saved_specs(self.graph, op, self.rules, self.specs))
        raise KeyError(table)

    # -- writes ---------------------------------------------------------------------------

    def place(self, v: str, spec: DistSpec, trail: list[Decision]) -> None:
        self.specs[v] = spec
        self.decisions[v] = trail
        self.rec.wrote("specs", v)

    def add_copy(self, v: str, placements: tuple[Placement, ...]) -> None:
        self.copies.setdefault(v, set()).add(placements)
        self.rec.copied(v, placements)

    def fold(self, segment: Segment) -> bool:
        """Give `segment` the results of a twin whose outside reads hold here."""
        twin = self.rec.twin(segment, self.lookup, self.uniform.__contains__)
        if twin is None:
            return False
        self.folded[segment.index] = twin.segment.index
        t = twin.segment
        for name, placements in twin.copies:
            renamed = translate(name, t.family, t.layer, segment.layer)
            if renamed is not None:
                self.copies.setdefault(renamed, set()).add(placements)
        return True


def _saved_key(op: Op, saved: Mapping[str, DistSpec]) -> list[tuple[int, DistSpec]]:
    """What a backward op read of its forward op's layout, free of names (input index and
    spec), so that twins in different layers compare equal."""
    index = {v: i for i, v in enumerate(op.inputs)}
    return sorted((index[v], spec) for v, spec in saved.items())


def _renamed_decisions(trail: list[Decision], twin: Segment, segment: Segment) -> list[Decision]:
    """A twin layer's decisions, naming `segment`'s layer's ops and values."""
    fam, a, b = segment.family, twin.layer, segment.layer
    return [
        Decision(d.spec, d.source, rename_text(d.detail, fam, a, b),
                 rename_text(d.op, fam, a, b) if d.op is not None else None)
        for d in trail
    ]  # fmt: skip


def _forward(
    graph: Graph,
    strategy: Strategy,
    resolved: Constraints,
    backward: dict[str, DistSpec],
    fold: bool = True,
) -> CompletedGraph:
    w = _Walk(graph, strategy, resolved, backward)
    constraints = resolved.slots
    replicated = DistSpec.replicated(w.mesh)
    said: dict[int, tuple[DistSpec, Decision]] = {}  # layers sharing a slot share a decision
    for name, slot in constraints.items():
        if graph.producer(name) is None and slot:
            if len(slot) < w.mesh.ndim:  # its first consumer decides the axes it leaves free
                continue
            if id(slot) not in said:
                spec = constrained(replicated, slot)
                text = f"annotated {annotation_text(slot)}"
                said[id(slot)] = (spec, Decision(str(spec), "annotation", text))
            spec, decision = said[id(slot)]
            w.place(name, spec, [decision])
    in_forward = True
    for seg in w.repeats.segments:
        if in_forward and graph.ops[seg.start].role == OpRole.BACKWARD:
            in_forward = False
            _forget_forward_copies(graph, w.copies, w.specs)
        if seg.cls >= 0 and fold:
            if w.fold(seg):
                continue
            w.rec.start(seg)
        for op in graph.ops[seg.start : seg.stop]:
            _complete_op(w, op)
        w.rec.stop()
    folded, owner = w.folded, w.repeats.value_segment
    for name in graph.values:
        if owner.get(name) not in folded and name not in w.specs.own:
            w.place(name, replicated, [Decision(str(replicated), "default",
                                                "never read: replicated")])  # fmt: skip
    done = CompletedGraph(graph, strategy, w.specs, w.rules, w.arriving, w.decisions, constraints)
    done.folded_segments = len(folded)
    return done


def _complete_op(w: _Walk, op: Op) -> None:
    """Apply `op`'s rule to the specs its inputs arrive in; place its free inputs and its
    outputs."""
    graph, mesh = w.graph, w.mesh
    in_specs = [w.spec(v) for v in op.inputs]
    hints = [_hint(w, v) for v in op.outputs]
    inplace = _inplace(graph, op)
    saved = w.saved(op)
    optimizer = op.role == OpRole.OPTIMIZER
    in_hints = [saved[v].placements if v in saved else w.pinned(v, optimizer) for v in op.inputs]
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
            [w.copies_of(v) for v in op.inputs],
        )
    except ShardlabError as exc:
        raise type(exc)(f"op {op.name!r} ({op.kind}): {exc.message}", op=op.name) from None
    w.rules[op.name] = rule
    for v, have, need in zip(op.inputs, in_specs, rule.input_specs, strict=True):
        if have is not None and have != need:
            w.add_copy(v, need.placements)
        if have is None:
            _place_by_consumer(w, op, v, need)
    w.arriving[op.name] = tuple(w.specs[v] for v in op.inputs)
    for j, v in enumerate(op.outputs):
        _place_output(w, op, j, v, rule, inplace)


def _place_by_consumer(w: _Walk, op: Op, v: str, need: DistSpec) -> None:
    """Place a source value no annotation fixes on every axis: as its first consumer `op`
    needs it (replicated where that would be partial), on the axes its annotation names
    as annotated (the rule had them as hints; a copy in `need` where it differs)."""
    stored = DistSpec(
        w.mesh, tuple(Replicate() if isinstance(p, Partial) else p for p in need.placements)
    )
    detail = f"free; takes what its first consumer {op.name!r} ({op.kind}) needs"
    slot = w.constraint(v) if w.graph.producer(v) is None else None
    if slot:
        stored = constrained(stored, slot)
        detail = (f"annotated {annotation_text(slot)}; on its other mesh axes what its first "
                  f"consumer {op.name!r} ({op.kind}) needs")  # fmt: skip
        if stored.placements != need.placements:
            w.add_copy(v, need.placements)
    elif stored != need:  # a value is never stored as partial sums
        detail += f" ({need}), replicated where it would be partial"
    w.place(v, stored, [Decision(str(stored), "consumer", detail, op.name)])


def _forget_forward_copies(
    graph: Graph, copies: dict[str, set[tuple[Placement, ...]]], specs: Mapping[str, DistSpec]
) -> None:
    """As the lowering does when the backward starts: keep only the copies cut from a value
    locally (a slice; nothing moved), since a gathered copy is not kept for the backward."""
    for v, kept in copies.items():
        spec, ttype = specs[v], graph.type_of(v)
        copies[v] = {p for p in kept if reshard_cost(ttype, spec.mesh, spec.placements, p) == 0}


def _place_output(
    w: _Walk, op: Op, j: int, name: str, rule: RuleResult, inplace: list[int | None]
) -> None:
    produced = rule.output_specs[j]
    trail = [Decision(str(produced), "producer", rule.reason, op.name)]
    spec = produced
    source = inplace[j]
    if source is not None:
        state = w.spec(op.inputs[source])
        assert state is not None  # state is placed before it is updated
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
    slot = w.constraint(name) or w.constraint(kept_name(name))  # a replay: as forward
    if slot:
        annotated = constrained(spec, slot)
        wanted = _with_tensor_layout(w, name, annotated, slot)
        if wanted != spec:
            fsdp = (
                "; on the tensor axes as its parameter (FSDP2 reduces them first)"
                if wanted != annotated
                else ""
            )
            trail.append(
                Decision(
                    str(wanted),
                    "annotation",
                    f"annotated {annotation_text(slot)}{fsdp}; "
                    f"{op.name!r} produces {spec}, resharded after the op",
                    op.name,
                )
            )
        else:
            trail.append(Decision(str(spec), "annotation", f"as annotated {annotation_text(slot)}"))
        spec = wanted
    w.place(name, spec, trail)


def _hint(w: _Walk, name: str) -> tuple[Placement | None, ...] | None:
    """The placements an output should come out in: a backward-step request, its
    annotation, or - for a gradient `<v>.grad` - the layout of `v`."""
    requested = w.requested(name)
    if requested is not None:
        return requested.placements
    slot = w.constraint(name) or w.constraint(kept_name(name))
    if slot:  # a recomputed value is laid out like the value it replays
        layout = _fsdp_gradient_layout(w, name)
        return tuple(slot[k][0] if k in slot else layout.get(k) for k in range(w.mesh.ndim))
    base = gradient_of(name)
    if base is not None and w.graph.value(name).kind == ValueKind.GRAD:
        spec = w.spec(base)
        if spec is not None:
            return tuple(None if isinstance(p, Partial) else p for p in spec.placements)
    return None


def _fsdp_gradient_layout(w: _Walk, name: str) -> dict[int, Placement]:
    """For the gradient of a parameter FSDP gathers before use: the parameter's placements
    on the tensor axes, where FSDP2 has it before its reduce-scatter (`spmd.fsdp_grads`);
    else nothing."""
    param = fsdp_parameter(w.graph, name)
    if param is None or not w.tensor_axes or not fsdp_managed(w.constraint(param)):
        return {}
    spec = w.spec(param)
    return tensor_layout(spec, w.tensor_axes) if spec is not None else {}


def _with_tensor_layout(w: _Walk, name: str, spec: DistSpec, slot: Mapping[int, Any]) -> DistSpec:
    """`spec` with an FSDP gradient's tensor axes that its annotation leaves free laid out
    as its parameter (`_fsdp_gradient_layout`)."""
    layout = {k: p for k, p in _fsdp_gradient_layout(w, name).items() if k not in slot}
    if not layout:
        return spec
    placements = tuple(layout.get(k, p) for k, p in enumerate(spec.placements))
    return DistSpec(spec.mesh, placements)


#: Sums: their rules take partial inputs together and count one reduction of the result.
PASS_PARTIAL = frozenset({"add", "sub"})


def _deferrable(graph: Graph, name: str) -> bool:
    """True when every consumer of `name` is a sum, which reduces partial inputs together
    (gradient contributions summed into one gradient, a residual add), or when `name` is a
    parameter's gradient: data parallelism reduces it once per step, bucketed and overlapped
    with the backward (`passes.data_parallel`), not where it is made."""
    consumers = graph.consumers(name)
    if bool(consumers) and all(op.kind in PASS_PARTIAL for op in consumers):
        return True
    base = gradient_of(name)
    return (
        base is not None
        and base in graph.values
        and graph.values[name].kind == ValueKind.GRAD
        and graph.values[base].kind == ValueKind.PARAM
    )


def _saved_specs(
    graph: Graph, op: Op, rules: Mapping[str, RuleResult], specs: Mapping[str, DistSpec]
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
    for index in reversed(repeats_of(graph).source_fed):
        op = graph.ops[index]
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
