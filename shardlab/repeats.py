"""Repeated layers of a graph: which runs of ops are the same layer body, so that the work
done for one is not done again for the others.

A graph's ops fall into **segments**: maximal runs of consecutive ops of one layer
(`layers.3.…`, named by the first numbered part of the op's name) and one role (a layer has
a forward, a backward and an optimizer segment in a training graph); every other op is a
segment of its own. Two layer segments are of the same **class** when their bodies are
equal once layer indices are written relative to the segment's own layer
(`layers.3.attn.q_proj` read by layer 3 is `layers.@0.attn.q_proj`, the residual from
layer 2 is `layers.@-1.mlp_residual`): the same op kinds, attributes (a dropout's per-op
`seed` aside), value types and kinds, wiring, and the kinds of the ops that read each
output. Names a segment reads that are not under its layer family (`rope.cos`) must be the
same names.

A class says that two bodies are built alike; whether their results are alike also depends
on what arrives at them (the placements of their inputs), which is for the user of the
index to check (`spmd.complete` checks every outside value a body read).

`repeats_of(graph)` builds the index once per graph (linear in its size) and keeps it on the
graph; `translate` renames a name of one layer to the same name in another.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection
from dataclasses import dataclass, field

from shardlab.annotation import match_values
from shardlab.ir import Graph, Op

#: The layer an op belongs to: the name up to its first numbered part.
_LAYER_OF_NAME = re.compile(r"^([A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)*)\.(\d+)(?:\.|$)")
#: Attributes that do not change how an op is sharded or costed (only its values).
IGNORED_ATTRS = frozenset({"seed"})


@dataclass(frozen=True, slots=True)
class Segment:
    """A run of ops `graph.ops[start:stop]`: one layer's ops of one role, or one other op."""

    index: int
    start: int
    stop: int
    #: the layer family (`layers`) and index, or "" and -1 outside layers
    family: str
    layer: int
    #: structural class (segments of one class are the same body); -1 outside layers
    cls: int


@dataclass
class Repeats:
    """The segments of a graph, and which segment owns each op and value.

    A value belongs to the segment of the op that writes it; a source value (a parameter)
    to the segment that reads it first, when it is named under that segment's layer.
    """

    segments: list[Segment]
    op_segment: dict[str, int]
    value_segment: dict[str, int]
    #: per class, the indices of its segments in order
    classes: list[list[int]]
    #: indices of the ops that read only source values, or nothing (`rope`, a seed)
    source_fed: tuple[int, ...]
    #: the value names a glob is tried on: all but those of a class's later segments
    #: (`match`); and per class, its first segment
    representatives: tuple[str, ...] = ()
    #: per segment, the values it owns, in graph order
    owned: dict[int, list[str]] = field(default_factory=dict)

    def first_of_class(self, segment: Segment) -> Segment:
        return self.segments[self.classes[segment.cls][0]]

    def match(self, pattern: str, names: Collection[str]) -> list[str]:
        """`annotation.match_values(pattern, names)` for the graph's value names, trying a
        glob on one layer of each class when the glob cannot tell layers apart (only `*`
        and characters that are not digits): its matches there are its matches in every
        layer of the class. Other globs and exact names are matched as usual."""
        if not is_glob(pattern) or not layer_blind(pattern):
            return match_values(pattern, names)
        out = []
        owner, segments = self.value_segment, self.segments
        for name in match_values(pattern, self.representatives):
            seg = owner.get(name)
            if seg is None or segments[seg].cls < 0:
                out.append(name)
                continue
            s0 = segments[seg]
            for member in self.classes[s0.cls]:
                renamed = translate(name, s0.family, s0.layer, segments[member].layer)
                if renamed is not None:
                    out.append(renamed)
        return out

    def layer_count(self) -> int:
        """Distinct layers (family, index) the graph holds."""
        return len({(s.family, s.layer) for s in self.segments if s.family})


def layer_of(name: str) -> tuple[str, int] | None:
    """(family, index) of a name under a numbered layer (`layers.3.mlp` -> ("layers", 3))."""
    m = _LAYER_OF_NAME.match(name)
    return (m.group(1), int(m.group(2))) if m else None


def layer_indices(graph: Graph) -> dict[str, set[int]]:
    """Per numbered family of op scopes (`layers`, `model.layers`, `transformer.h`), the
    layer indices the graph's ops are under."""
    by_family: dict[str, set[int]] = {}
    for op in graph.ops:
        found = layer_of(op.scope)
        if found is not None:
            by_family.setdefault(found[0], set()).add(found[1])
    return by_family


def layer_family(graph: Graph) -> str | None:
    """The numbered family that holds a model's layers: `layers` in presets, `model.layers`
    or `transformer.h` in imported models (the family with the most distinct indices; None
    for a model without numbered layers)."""
    by_family = layer_indices(graph)
    if not by_family:
        return None
    return max(sorted(by_family), key=lambda family: len(by_family[family]))


@functools.lru_cache(maxsize=1 << 17)
def translate(name: str, family: str, src: int, dst: int) -> str | None:
    """`name` as seen from layer `dst` when it is seen from `src`: a name under `family`
    moves by dst - src layers (`layers.2.x` from 3 to 7 is `layers.6.x`); others stay.
    None when the name would leave the layers (a negative index)."""
    split = split_name(name, family) if src != dst else None
    if split is None:
        return name
    index = split[0] + dst - src
    return f"{family}.{index}{split[1]}" if index >= 0 else None


def split_name(name: str, family: str) -> tuple[int, str] | None:
    """(layer index, the rest) of a name under `family` (`layers.3.mlp` -> (3, ".mlp"))."""
    if not family or not name.startswith(family) or name[len(family) : len(family) + 1] != ".":
        return None
    rest = name[len(family) + 1 :]
    digits = len(rest) - len(rest.lstrip("0123456789"))
    return (int(rest[:digits]), rest[digits:]) if digits else None


def repeats_of(graph: Graph) -> Repeats:
    """The graph's segments and classes (built once and kept on the graph)."""
    known = graph.__dict__.get("_repeats")
    if isinstance(known, Repeats):
        return known
    built = _build(graph)
    graph.__dict__["_repeats"] = built
    return built


def _build(graph: Graph) -> Repeats:
    ops = graph.ops
    segments: list[Segment] = []
    op_segment: dict[str, int] = {}
    value_segment: dict[str, int] = {}
    signatures: dict[str, int] = {}
    classes: list[list[int]] = []
    texts: dict[tuple[str, bool], str] = {}
    i = 0
    while i < len(ops):
        where = layer_of(ops[i].name)
        j = i + 1
        if where is not None:
            while j < len(ops) and ops[j].role == ops[i].role and layer_of(ops[j].name) == where:
                j += 1
        index = len(segments)
        cls = -1
        if where is not None:
            text = _signature(graph, ops[i:j], where[0], where[1], texts)
            cls = signatures.setdefault(text, len(signatures))
            if cls == len(classes):
                classes.append([])
            classes[cls].append(index)
        family, layer = where if where is not None else ("", -1)
        segments.append(Segment(index, i, j, family, layer, cls))
        for op in ops[i:j]:
            op_segment[op.name] = index
            for v in op.outputs:
                value_segment[v] = index
            if where is not None:
                prefix = f"{family}.{layer}."
                for v in op.inputs:
                    if (
                        v not in value_segment
                        and graph.producer(v) is None
                        and v.startswith(prefix)
                    ):
                        value_segment[v] = index
        i = j
    source_fed = tuple(
        k for k, op in enumerate(ops) if all(graph.producer(v) is None for v in op.inputs)
    )
    firsts = {members[0] for members in classes}
    representatives = tuple(
        name
        for name in graph.values
        if (seg := value_segment.get(name)) is None or segments[seg].cls < 0 or seg in firsts
    )
    owned: dict[int, list[str]] = {}
    for name in graph.values:
        seg = value_segment.get(name)
        if seg is not None:
            owned.setdefault(seg, []).append(name)
    return Repeats(segments, op_segment, value_segment, classes, source_fed, representatives, owned)


def is_glob(pattern: str) -> bool:
    """A pattern with wildcards (else an exact name)."""
    return any(ch in pattern for ch in "*?[")


def layer_blind(pattern: str) -> bool:
    """A glob whose matches cannot depend on a layer index: only `*` and non-digits."""
    return not any(ch.isdigit() or ch in "?[" for ch in pattern)


def _signature(
    graph: Graph, ops: tuple[Op, ...], family: str, layer: int, texts: dict[tuple[str, bool], str]
) -> str:
    """The body of a segment with names relative to its layer (see the module docstring)."""

    own, family_dot, here = f"{family}.{layer}.", f"{family}.", f"{family}.@0."

    def rel(name: str) -> str:
        if name.startswith(own):
            return here + name[len(own) :]
        if not name.startswith(family_dot):
            return name
        split = split_name(name, family)
        return name if split is None else f"{family}.@{split[0] - layer}{split[1]}"

    parts = []
    for op in ops:
        attrs = op.attrs
        if any(k in attrs for k in IGNORED_ATTRS):
            attrs = {k: v for k, v in attrs.items() if k not in IGNORED_ATTRS}
        shown = repr(attrs) if attrs else ""
        if family in shown:
            shown = _pattern(family).sub(lambda m: f"{family}.@{int(m.group(1)) - layer}", shown)
        ins = ",".join(f"{rel(v)}:{_value_text(graph, v, True, texts)}" for v in op.inputs)
        outs = []
        for v in op.outputs:
            consumers = graph.consumers(v)
            first = rel(consumers[0].name) if consumers else ""
            outs.append(f"{rel(v)}:{_value_text(graph, v, False, texts)}:{first}")
        parts.append(f"{rel(op.name)}|{op.kind}|{op.role}|{rel(op.scope)}|{shown}|{ins}|{outs}")
    return "\n".join(parts)


@functools.lru_cache(maxsize=64)
def _pattern(family: str) -> re.Pattern[str]:
    return re.compile(rf"\b{re.escape(family)}\.(\d+)\b")


def _value_text(graph: Graph, name: str, reader: bool, texts: dict[tuple[str, bool], str]) -> str:
    """What a body's signature says of a value besides its name: type, kind, whether an op
    makes it, and (as an output) the kinds of the ops that read it."""
    known = texts.get((name, reader))
    if known is not None:
        return known
    value = graph.values[name]
    made = "p" if graph.producer(name) is not None else "s"
    text = f"{value.type.dtype}{value.type.shape}:{value.kind.value}:{made}"
    if not reader:
        text += ":" + ",".join(sorted(op.kind for op in graph.consumers(name)))
    texts[(name, reader)] = text
    return text
