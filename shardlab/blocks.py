"""Which block of a value every rank holds: the numbers behind the sharding diagram.

For a value of global `shape` laid out as a `DistSpec`, `rank_blocks` gives per rank (in the
mesh's row-major position order): its mesh coordinate, the local shape, the global
`[start, stop)` per tensor dim (`placement.index_ranges`: the very cut the simulated mesh
makes with `runtime.distribute`), the mesh axes over which the block is a partial value
(`Partial` placements, with their reduce op), and two groups of ranks:

- `replica_group`: the ranks whose coordinates differ from this rank's only along
  `Replicate` axes. They hold the same index range; without a `Partial` placement they hold
  identical data. With one, each replica's partial group is a decomposition of its own
  (`distribute` splits each independently): the replicas agree once each group is reduced,
  which is what `runtime.distribute.assemble` checks.
- `partial_group`: the ranks whose coordinates differ only along `Partial` axes; reducing
  their blocks (the last partial mesh axis innermost) gives this rank's block of the value.
  Just this rank when nothing is partial.

Uneven shards are drawn as they are held: a dim that does not divide its mesh axes gives
blocks of different sizes (DTensor's layout, `torch.chunk`: ceil-sized blocks, the tail ones
short or empty; the left axis the outer cut), each rank's `local_shape` and `ranges` its
own (an empty block's range is `[stop, stop)`); `blocks_json`'s top-level `local_shape` is
the largest block and `even` says whether all are equal.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shardlab.mesh import Mesh
from shardlab.placement import DistSpec, Partial, Replicate, index_ranges, is_even, local_shape


@dataclass(frozen=True, slots=True)
class RankBlock:
    """The block one rank holds of one value."""

    rank: int
    coord: tuple[int, ...]
    local_shape: tuple[int, ...]
    #: global [start, stop) per tensor dim
    ranges: tuple[tuple[int, int], ...]
    #: (mesh axis, reduce op) of every Partial placement, in mesh-axis order
    partial: tuple[tuple[str, str], ...]
    replica_group: tuple[int, ...]
    partial_group: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "coord": list(self.coord),
            "local_shape": list(self.local_shape),
            "ranges": [list(r) for r in self.ranges],
            "partial": [{"axis": axis, "op": op} for axis, op in self.partial],
            "replica_group": list(self.replica_group),
            "partial_group": list(self.partial_group),
        }


def axes_of(spec: DistSpec, kind: type[Replicate] | type[Partial]) -> tuple[int, ...]:
    """Indices of the mesh axes whose placement is of `kind` (Replicate or Partial)."""
    return tuple(k for k, p in enumerate(spec.placements) if isinstance(p, kind))


def group_along(mesh: Mesh, coord: Sequence[int], axes: Sequence[int]) -> tuple[int, ...]:
    """The ranks at `coord` with the coordinates of mesh axes `axes` free (row-major)."""
    out = []
    for free in itertools.product(*(range(mesh.shape[k]) for k in axes)):
        c = list(coord)
        for k, i in zip(axes, free, strict=True):
            c[k] = i
        out.append(mesh.rank_at(c))
    return tuple(out)


def rank_blocks(shape: Sequence[int], spec: DistSpec) -> list[RankBlock]:
    """Every rank's block of a value of global `shape` under `spec`, in mesh position order."""
    mesh = spec.mesh
    local_shape(shape, mesh, spec.placements)  # raises for placements that do not fit
    replicate = axes_of(spec, Replicate)
    partial_axes = axes_of(spec, Partial)
    partial = tuple(
        (mesh.axis_names[k], p.op) for k, p in enumerate(spec.placements) if isinstance(p, Partial)
    )
    out = []
    for rank in mesh.ranks:
        coord = mesh.coord(rank)
        ranges = index_ranges(shape, mesh, spec.placements, rank)
        out.append(
            RankBlock(
                rank=rank,
                coord=coord,
                local_shape=tuple(b - a for a, b in ranges),
                ranges=ranges,
                partial=partial,
                replica_group=group_along(mesh, coord, replicate),
                partial_group=group_along(mesh, coord, partial_axes),
            )
        )
    return out


def mesh_json(mesh: Mesh) -> dict[str, Any]:
    """The mesh as the diagram draws it: its text, axes (name, size) and ranks by position."""
    return {
        "text": str(mesh),
        "axes": [{"name": n, "size": s} for n, s in zip(mesh.axis_names, mesh.shape, strict=True)],
        "ranks": list(mesh.ranks),
    }


def placements_json(spec: DistSpec) -> list[dict[str, Any]]:
    """One entry per mesh axis: its name and placement (`kind` shard/replicate/partial)."""
    out: list[dict[str, Any]] = []
    for axis, p in zip(spec.mesh.axis_names, spec.placements, strict=True):
        if isinstance(p, Partial):
            out.append({"axis": axis, "placement": str(p), "kind": "partial", "op": p.op})
        elif isinstance(p, Replicate):
            out.append({"axis": axis, "placement": str(p), "kind": "replicate"})
        else:
            out.append({"axis": axis, "placement": str(p), "kind": "shard", "dim": p.dim})
    return out


def blocks_json(shape: Sequence[int], spec: DistSpec) -> dict[str, Any]:
    """`rank_blocks` with the mesh, the placements and the sharded dims, JSON-ready."""
    sharded = spec.sharded_dims()
    return {
        "spec": str(spec),
        "mesh": mesh_json(spec.mesh),
        "placements": placements_json(spec),
        "dims": [{"dim": d, "size": n, "axes": sharded.get(d, [])} for d, n in enumerate(shape)],
        "local_shape": list(local_shape(shape, spec.mesh, spec.placements)),
        "even": is_even(shape, spec.mesh, spec.placements),
        "ranks": [block.to_json() for block in rank_blocks(shape, spec)],
    }
