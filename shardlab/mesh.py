"""Device meshes: an n-dimensional grid of ranks with named axes.

A `Mesh` lays ranks out row-major over its shape; `groups` gives the rank groups that
communicate along one mesh axis and `submesh` cuts out one slice (a pipeline stage).
Text form: `dp=2,tp=4`. A mesh has at most `MAX_MESH_AXES` axes and `MAX_MESH_DEVICES`
devices (every rank is listed), checked before any rank is enumerated; the service and the
CLI refuse the same meshes.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardlab.errors import MeshError

#: The most axes a mesh may have (real meshes have up to four or five: pp, dp, fsdp, tp, ...).
MAX_MESH_AXES = 8
#: The most devices a mesh may have (the engine lists every rank of a mesh).
MAX_MESH_DEVICES = 1 << 20
#: Device counts from here on are shown as "over 10^18" (and axis sizes of more digits
#: than that are read as it: Python's int() refuses thousands of digits).
HUGE = 10**18


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _as_tuple(value: object, what: str) -> tuple[Any, ...]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise MeshError(f"mesh {what} must be a sequence, got {value!r}", field=what)
    return tuple(value)


@dataclass(frozen=True, slots=True)
class Mesh:
    """A grid of ranks with one name per mesh axis; `ranks` is the row-major layout."""

    shape: tuple[int, ...]
    axis_names: tuple[str, ...]
    ranks: tuple[int, ...] = ()
    _position: dict[int, int] = field(init=False, repr=False, compare=False, hash=False)
    #: (rank, axis index) -> its group, as `group_of` found it (costing asks again and again)
    _groups: dict[tuple[int, int], tuple[int, ...]] = field(
        init=False, repr=False, compare=False, hash=False
    )
    #: (axis index, index) -> the submesh there, as `submesh` made it (a pipeline's
    #: costing asks for each stage's again and again)
    _submeshes: dict[tuple[int, int], Mesh] = field(
        init=False, repr=False, compare=False, hash=False
    )
    #: the hash, taken once: a mesh of 2^20 ranks keys many caches (local shapes, roles);
    #: of ints only, so a pickled mesh keeps a valid hash in another process
    _hash: int = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        shape = _as_tuple(self.shape, "shape")
        names = _as_tuple(self.axis_names, "axis_names")
        ranks = _as_tuple(self.ranks, "ranks")
        if len(names) != len(shape):
            raise MeshError(
                f"mesh shape {shape} has {len(shape)} axes but {len(names)} axis names "
                f"were given ({', '.join(map(str, names))})",
                shape=list(shape),
                axis_names=list(map(str, names)),
            )
        seen: set[str] = set()
        for name in names:
            if not isinstance(name, str) or not name.isidentifier():
                raise MeshError(
                    f"mesh axis name {name!r} is not a valid identifier "
                    "(use letters, digits and underscores, e.g. 'dp')",
                    axis=str(name),
                )
            if name in seen:
                raise MeshError(f"duplicate mesh axis name {name!r}", axis=name)
            seen.add(name)
        for name, size in zip(names, shape, strict=True):
            if not _is_int(size) or size <= 0:
                raise MeshError(
                    f"mesh axis {name!r} has size {size!r}; sizes must be positive integers",
                    axis=name,
                    size=repr(size),
                )
        size = math.prod(shape)
        if len(shape) > MAX_MESH_AXES or size > MAX_MESH_DEVICES:
            check_mesh_size(_text(shape, names), len(shape), size)
        if not ranks:
            ranks = tuple(range(size))
        position: dict[int, int] = {}
        for i, rank in enumerate(ranks):
            if not _is_int(rank) or rank < 0:
                raise MeshError(
                    f"mesh rank {rank!r} at position {i} is not a non-negative integer",
                    rank=repr(rank),
                )
            if rank in position:
                raise MeshError(f"rank {rank} appears twice in the mesh", rank=rank)
            position[rank] = i
        if len(ranks) != size:
            raise MeshError(
                f"mesh {_text(shape, names)} has {size} positions but {len(ranks)} ranks "
                "were given",
                size=size,
                ranks=len(ranks),
            )
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "axis_names", names)
        object.__setattr__(self, "ranks", ranks)
        object.__setattr__(self, "_position", position)
        object.__setattr__(self, "_groups", {})
        object.__setattr__(self, "_submeshes", {})
        object.__setattr__(self, "_hash", hash((shape, ranks)))  # no str: same in every process

    def __hash__(self) -> int:
        return self._hash

    @property
    def ndim(self) -> int:
        """Number of mesh axes."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """Number of ranks in the mesh."""
        return len(self.ranks)

    def axis_index(self, axis: str | int) -> int:
        """Index of a mesh axis given by name (or already by index)."""
        if isinstance(axis, int) and not isinstance(axis, bool):
            if not 0 <= axis < self.ndim:
                raise MeshError(
                    f"mesh axis index {axis} is out of range for mesh {self} ({self.ndim} axes)",
                    axis=axis,
                )
            return axis
        if axis not in self.axis_names:
            raise MeshError(
                f"unknown mesh axis {axis!r}; the mesh has axes ({', '.join(self.axis_names)})",
                axis=str(axis),
                axes=list(self.axis_names),
            )
        return self.axis_names.index(str(axis))

    def axis_size(self, axis: str | int) -> int:
        """Number of ranks along a mesh axis."""
        return self.shape[self.axis_index(axis)]

    def coord(self, rank: int) -> tuple[int, ...]:
        """The mesh coordinate of `rank`."""
        pos = self._position.get(rank)
        if pos is None:
            raise MeshError(f"rank {rank} is not in mesh {self}", rank=rank)
        coord: list[int] = []
        for size in reversed(self.shape):
            pos, c = divmod(pos, size)
            coord.append(c)
        return tuple(reversed(coord))

    def rank_at(self, coord: Sequence[int]) -> int:
        """The rank at a mesh coordinate."""
        if len(coord) != self.ndim:
            raise MeshError(
                f"coordinate {tuple(coord)} has length {len(coord)} but mesh {self} has "
                f"{self.ndim} axes",
                coord=list(coord),
            )
        pos = 0
        for name, size, c in zip(self.axis_names, self.shape, coord, strict=True):
            if not _is_int(c) or not 0 <= c < size:
                raise MeshError(
                    f"coordinate {c!r} is out of range for mesh axis {name!r} (size {size})",
                    axis=name,
                    coord=list(coord),
                )
            pos = pos * size + c
        return self.ranks[pos]

    def groups(self, axis: str | int) -> list[tuple[int, ...]]:
        """Rank groups along `axis`: ranks differing only in that axis' coordinate."""
        k = self.axis_index(axis)
        others = [range(s) for i, s in enumerate(self.shape) if i != k]
        return [
            tuple(self.rank_at((*rest[:k], c, *rest[k:])) for c in range(self.shape[k]))
            for rest in itertools.product(*others)
        ]

    def group_of(self, rank: int, axis: str | int) -> tuple[int, ...]:
        """The group along `axis` that contains `rank`."""
        k = self.axis_index(axis)
        known = self._groups.get((rank, k))
        if known is None:
            pos = self._position.get(rank)
            if pos is None:
                raise MeshError(f"rank {rank} is not in mesh {self}", rank=rank)
            # row-major: the group is the positions `stride` apart around `pos` on axis k
            stride = math.prod(self.shape[k + 1 :])
            start = pos - (pos // stride) % self.shape[k] * stride
            known = self.ranks[start : start + stride * self.shape[k] : stride]
            self._groups[(rank, k)] = known
        return known

    def submesh(self, axis: str | int, index: int) -> Mesh:
        """The mesh with `axis` removed, fixed at `index` (e.g. one pipeline stage)."""
        k = self.axis_index(axis)
        if not _is_int(index) or not 0 <= index < self.shape[k]:
            raise MeshError(
                f"index {index!r} is out of range for mesh axis {self.axis_names[k]!r} "
                f"(size {self.shape[k]})",
                axis=self.axis_names[k],
                index=repr(index),
            )
        known = self._submeshes.get((k, index))
        if known is None:
            others = [range(s) for i, s in enumerate(self.shape) if i != k]
            ranks = tuple(
                self.rank_at((*rest[:k], index, *rest[k:])) for rest in itertools.product(*others)
            )
            known = Mesh(
                self.shape[:k] + self.shape[k + 1 :],
                self.axis_names[:k] + self.axis_names[k + 1 :],
                ranks,
            )
            self._submeshes[(k, index)] = known
        return known

    @classmethod
    def parse(cls, text: str) -> Mesh:
        """Parse the text form `dp=2,tp=4`."""
        if not text.strip():
            raise MeshError("empty mesh text; expected e.g. 'dp=2,tp=4'", text=text)
        tokens = text.split(",")
        check_mesh_size(text, len(tokens), 1)
        shape: list[int] = []
        names: list[str] = []
        for i, token in enumerate(tokens):
            name, sep, size = (part.strip() for part in token.partition("="))
            if not sep or not name or not size:
                raise MeshError(
                    f"malformed mesh token {token.strip()!r} (entry {i}) in {text!r}; "
                    "expected name=size, e.g. 'dp=2,tp=4'",
                    text=text,
                    token=token.strip(),
                )
            if not (size.isascii() and size.isdigit()):
                raise MeshError(
                    f"mesh axis size {size!r} in token {token.strip()!r} is not a positive integer",
                    text=text,
                    token=token.strip(),
                )
            names.append(name)
            shape.append(_axis_size(size))
            check_mesh_size(text, len(tokens), math.prod(shape))
        return cls(tuple(shape), tuple(names))

    def __str__(self) -> str:
        return _text(self.shape, self.axis_names)

    def to_json(self) -> dict[str, Any]:
        """The JSON form: `{"shape": [...], "axis_names": [...], "ranks": [...]}`."""
        return {
            "shape": list(self.shape),
            "axis_names": list(self.axis_names),
            "ranks": list(self.ranks),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Mesh:
        """Inverse of `to_json`; `ranks` may be omitted for the default layout."""
        if not isinstance(data, Mapping):
            raise MeshError(f"mesh JSON must be an object, got {type(data).__name__}")
        missing = [key for key in ("shape", "axis_names") if key not in data]
        if missing:
            raise MeshError(f"mesh JSON lacks {', '.join(missing)}", missing=missing)
        unknown = sorted(set(data) - {"shape", "axis_names", "ranks"})
        if unknown:
            raise MeshError(f"mesh JSON has unknown keys {', '.join(unknown)}", unknown=unknown)
        return cls(
            _as_tuple(data["shape"], "shape"),
            _as_tuple(data["axis_names"], "axis_names"),
            _as_tuple(data.get("ranks", ()), "ranks"),
        )


def check_mesh_size(text: str, axes: int, devices: int) -> None:
    """Refuse a mesh (`text`, shown cut short) of more than `MAX_MESH_AXES` axes or
    `MAX_MESH_DEVICES` devices, naming the count and the limit."""
    shown = text if len(text) <= 80 else f"{text[:77]}..."
    if axes > MAX_MESH_AXES:
        raise MeshError(
            f"mesh {shown!r} has {axes} axes, more than the limit of {MAX_MESH_AXES}",
            mesh=shown,
            axes=axes,
            limit=MAX_MESH_AXES,
        )
    if devices > MAX_MESH_DEVICES:
        count = str(devices) if devices < HUGE else "over 10^18"
        raise MeshError(
            f"mesh {shown!r} has {count} devices, more than the limit of {MAX_MESH_DEVICES}",
            mesh=shown,
            devices=min(devices, HUGE),
            limit=MAX_MESH_DEVICES,
        )


def _axis_size(digits: str) -> int:
    """The size an axis' digits spell, or `HUGE` for more than 18 significant digits."""
    significant = digits.lstrip("0")
    return int(significant or "0") if len(significant) <= 18 else HUGE


def _text(shape: Sequence[object], names: Sequence[object]) -> str:
    return ",".join(f"{n}={s}" for n, s in zip(names, shape, strict=False))
