"""Completion done once per distinct layer: results of a repeated layer are its twin's.

Completion walks the graph segment by segment (`shardlab.repeats`). A layer segment is
completed for real the first time its class meets a new situation; while it runs, a
`Recorder` notes every piece of outside state it read (the placement of an input made
before it, a copy an earlier layer made, an annotation, a backward-step request, the rule
of its forward op) and every copy it left on an outside value. A later segment of the same
class whose outside state, renamed to its layer, equals what a twin read is **folded**: it
gets the twin's results without running a rule, and the twin's copies are left on its
outside values. Its per-op results are built on demand by renaming the twin's
(`FoldedMap`): the placements of `layers.17.mlp.up_proj` are those of `layers.2.mlp.up_proj`
when layer 17 folded onto layer 2.

Folded and unfolded completion give equal results for every value and op (tests compare
them); the work of a forward pass grows with the number of distinct situations, not with
the number of layers.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from shardlab.annotation import Annotation
from shardlab.placement import DistSpec, Placement
from shardlab.repeats import Repeats, Segment, split_name, translate

T = TypeVar("T")
_MISSING = object()


class FoldedMap(Mapping[str, T], Generic[T]):
    """Names -> results, where the names of a folded segment resolve to its twin's.

    `owner` says which segment a name belongs to; `folded` (shared by the maps of one
    completion) maps a folded segment to its twin; `rename(result, twin, segment)` adapts
    a twin's result (a decision's text naming the twin's ops) and `names()` lists the names
    in order, for iteration.
    """

    def __init__(
        self,
        repeats: Repeats,
        owner: Mapping[str, int],
        folded: Mapping[int, int],
        names: Callable[[], Iterable[str]],
        rename: Callable[[T, Segment, Segment], T] | None = None,
    ) -> None:
        self.own: dict[str, T] = {}
        self._segments = repeats.segments
        self._owner = owner
        self._folded = folded
        self._names = names
        self._rename = rename

    def __setitem__(self, name: str, value: T) -> None:
        self.own[name] = value

    def get(self, name: str, default: Any = None) -> Any:
        found = self.own.get(name, _MISSING)
        if found is not _MISSING:
            return found
        seg = self._owner.get(name)
        twin = self._folded.get(seg) if seg is not None else None
        if twin is None:
            return default
        s, t = self._segments[seg], self._segments[twin]  # type: ignore[index]
        renamed = translate(name, s.family, s.layer, t.layer)
        found = self.own.get(renamed, _MISSING) if renamed is not None else _MISSING
        if found is _MISSING:
            return default
        return self._rename(found, t, s) if self._rename is not None else found  # type: ignore[arg-type]

    def __getitem__(self, name: str) -> T:
        found = self.get(name, _MISSING)
        if found is _MISSING:
            raise KeyError(name)
        return found  # type: ignore[no-any-return]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name, _MISSING) is not _MISSING

    def __iter__(self) -> Iterator[str]:
        return (name for name in self._names() if name in self)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def rename_text(text: str, family: str, twin: int, layer: int) -> str:
    """`text` that names the twin layer's ops and values, naming `layer`'s instead."""
    if twin == layer or family not in text:
        return text
    pattern = re.compile(rf"\b{re.escape(family)}\.(\d+)\b")
    return pattern.sub(lambda m: f"{family}.{int(m.group(1)) + layer - twin}", text)


#: Tables that do not change while a forward pass runs (annotations and what derives from
#: them, backward-step requests): a layer whose own entries in them equal its twin's
#: (`uniform`) need not have them compared read by read.
CONSTANT_TABLES = frozenset({"constraints", "backward", "pins", "gathers"})


@dataclass
class Recorded:
    """What a segment completed for real read from outside, and the copies it left.

    A read is kept as (table, layer offset or None, rest of the name, what was read): the
    name relative to the segment's layer (`layers.@-1.mlp_residual` is (-1, ".mlp_residual"))
    so that checking it for another layer is one string away."""

    segment: Segment
    reads: list[tuple[str, int | None, str, Any]]
    own_constants: list[tuple[str, int | None, str, Any]]
    copies: list[tuple[str, Any]]


@dataclass
class Recorder:
    """Notes the outside reads and copies of the segment being completed (`start`..`stop`);
    `twin` finds an earlier segment of the same class whose reads hold for another one."""

    owner: Mapping[str, int]
    current: Segment | None = None
    reads: dict[tuple[str, str], Any] = field(default_factory=dict)
    written: set[tuple[str, str]] = field(default_factory=set)
    copies: list[tuple[str, Any]] = field(default_factory=list)
    by_class: dict[int, list[Recorded]] = field(default_factory=dict)

    def start(self, segment: Segment) -> None:
        self.current = segment
        self.reads, self.written, self.copies = {}, set(), []

    def stop(self) -> None:
        seg = self.current
        if seg is None:
            return
        reads: list[tuple[str, int | None, str, Any]] = []
        constants: list[tuple[str, int | None, str, Any]] = []
        for (table, name), value in self.reads.items():
            split = split_name(name, seg.family)
            entry = (table, None if split is None else split[0] - seg.layer,
                     name if split is None else split[1], value)  # fmt: skip
            own = table in CONSTANT_TABLES and self.owner.get(name) == seg.index
            (constants if own else reads).append(entry)
        self.by_class.setdefault(seg.cls, []).append(Recorded(seg, reads, constants, self.copies))
        self.current = None

    def read(self, table: str, name: str, value: T, key: Any = _MISSING) -> T:
        """`value`, just read from `table` under `name`; noted (as `key`, when what is
        compared differs from what is used) when it came from outside the segment."""
        if self.current is not None and (table, name) not in self.written:
            if table == "copies" and ("specs", name) in self.written:
                return value  # made here: no earlier copy of it can exist
            self.reads.setdefault((table, name), value if key is _MISSING else key)
        return value

    def wrote(self, table: str, name: str) -> None:
        if self.current is not None:
            self.written.add((table, name))

    def copied(self, name: str, placements: Any) -> None:
        """The segment made a copy of `name` in `placements` (a folded twin makes it too)."""
        if self.current is not None:
            self.written.add(("copies", name))
            self.copies.append((name, placements))

    def twin(
        self,
        segment: Segment,
        lookup: Callable[[str, str, Segment], Any],
        uniform: Callable[[int], bool],
    ) -> Recorded | None:
        """An earlier segment of `segment`'s class whose every outside read, renamed to
        `segment`'s layer, reads the same now (`lookup(table, name, segment)`), most recent
        first. Reads of its own constant entries are skipped where both are `uniform`."""
        fam, layer = segment.family, segment.layer
        for rec in reversed(self.by_class.get(segment.cls, ())):
            checks = rec.reads
            if not (uniform(segment.index) and uniform(rec.segment.index)):
                checks = [*checks, *rec.own_constants]
            for table, offset, rest, value in checks:
                if offset is None:
                    name = rest
                elif layer + offset < 0:
                    break
                else:
                    name = f"{fam}.{layer + offset}{rest}"
                if lookup(table, name, segment) != value:
                    break
            else:
                return rec
        return None


def slot_key(slot: dict[int, tuple[Placement, Annotation]] | None, family: str, layer: int) -> Any:
    """An annotation slot as a layer compares it with its twin's: placements and the
    annotations asking, their patterns relative to the layer."""
    if slot is None:
        return None
    return tuple(
        (k, p, a.source, a.pin, a.note, _relative_pattern(a.pattern, family, layer))
        for k, (p, a) in sorted(slot.items())
    )


@functools.lru_cache(maxsize=1 << 14)
def _relative_pattern(pattern: str, family: str, layer: int) -> str:
    return rename_text(pattern, family, layer, 0) if family else pattern


def uniform_segments(
    repeats: Repeats,
    constraints: Mapping[str, dict[int, tuple[Placement, Annotation]]],
    backward: Mapping[str, DistSpec],
) -> set[int]:
    """Layer segments whose own annotations and backward-step requests equal those of the
    first segment of their class, renamed (`folding.CONSTANT_TABLES`)."""
    owner, segments = repeats.value_segment, repeats.segments
    own: dict[int, dict[tuple[str, str], Any]] = {}
    for table, entries in (("c", constraints), ("b", backward)):
        for name, entry in entries.items():
            seg = owner.get(name)
            if seg is None or segments[seg].cls < 0:
                continue
            s = segments[seg]
            split = split_name(name, s.family)
            rel = name if split is None else f"{split[0] - s.layer}{split[1]}"
            key = slot_key(entry, s.family, s.layer) if table == "c" else entry  # type: ignore[arg-type]
            own.setdefault(seg, {})[(table, rel)] = key
    uniform: set[int] = set()
    for members in repeats.classes:
        first = own.get(members[0], {})
        uniform.update(m for m in members if own.get(m, {}) == first)
    return uniform
