"""Move between a value's global view and the blocks each rank holds under a DistSpec.

`to_local` cuts the block a rank holds (deterministically: a `Partial(sum)` value is kept
whole on the first rank of each partial group and zero elsewhere); `distribute` does it for
every rank and can split partial values at random, which is how tests prove that a rule or a
program works for *any* partial decomposition; `assemble` reduces partial values and puts
the blocks back together.

Partial reductions over several mesh axes apply from the last mesh axis to the first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from shardlab.errors import ExecutionError
from shardlab.ops.base import Array
from shardlab.placement import DistSpec, Partial, Replicate, local_slices

_REDUCE = {
    "sum": lambda xs: np.sum(xs, axis=0),
    "avg": lambda xs: np.mean(xs, axis=0),
    "max": lambda xs: np.max(xs, axis=0),
    "min": lambda xs: np.min(xs, axis=0),
}


def _partial_axes(spec: DistSpec) -> list[tuple[int, str]]:
    return [(k, p.op) for k, p in enumerate(spec.placements) if isinstance(p, Partial)]


def to_local(full: Array, spec: DistSpec, rank: int) -> Array:
    """The block `rank` holds of the global value `full` (partial sums on the first rank)."""
    block = full[local_slices(full.shape, spec.mesh, spec.placements, rank)]
    coord = spec.mesh.coord(rank)
    for k, op in _partial_axes(spec):
        if op == "sum" and coord[k] != 0:
            return np.zeros_like(block)
    return np.array(block, copy=True)


def distribute(
    full: Array, spec: DistSpec, rng: np.random.Generator | None = None
) -> dict[int, Array]:
    """Every rank's block of `full`; with `rng`, partial values are split at random.

    Replicas stay identical: ranks that differ only along replicated mesh axes receive the
    same pieces, as every SPMD program keeps them (a rule may rely on it: a product of a
    value partial on one axis and another partial on a second axis sums to the product).
    """
    mesh = spec.mesh
    blocks = {r: to_local(full, spec, r) for r in mesh.ranks}
    partial = _partial_axes(spec)
    commuting = len(partial) == 1 or all(op in ("sum", "avg") for _, op in partial)
    if rng is None or full.dtype.kind != "f" or not commuting:
        return blocks
    split = [a for a, p in enumerate(spec.placements) if not isinstance(p, Replicate)]
    for k, op in partial:
        pieces: dict[tuple[int, ...], list[Array]] = {}
        for group in mesh.groups(k):
            coord = mesh.coord(group[0])
            key = tuple(coord[a] for a in split if a != k)
            if key not in pieces:
                pieces[key] = _split([blocks[r] for r in group], op, rng)
            for r, piece in zip(group, pieces[key], strict=True):
                blocks[r] = piece
    return blocks


def _split(values: Sequence[Array], op: str, rng: np.random.Generator) -> list[Array]:
    """Random pieces whose `op`-reduction equals the reduction of `values` (one group)."""
    n = len(values)
    total = _REDUCE[op](np.stack(values))
    noise = [rng.standard_normal(total.shape) for _ in range(n)]
    if op in ("sum", "avg"):
        mean_noise = sum(noise) / n
        scale = 1.0 / n if op == "sum" else 1.0
        return [np.asarray(total * scale + e - mean_noise) for e in noise]
    holder = int(rng.integers(n))
    sign = -1.0 if op == "max" else 1.0
    return [total if i == holder else total + sign * np.abs(noise[i]) for i in range(n)]


def assemble(
    blocks: Mapping[int, Array], spec: DistSpec, shape: Sequence[int], check_replicas: bool = True
) -> Array:
    """The global value from every rank's block: reduce partials, place shards.

    With `check_replicas`, ranks that must hold the same block (replicas) are compared and a
    mismatch raises ExecutionError naming the two ranks.
    """
    mesh = spec.mesh
    partial = _partial_axes(spec)
    first = blocks[mesh.ranks[0]]
    out = np.zeros(tuple(shape), dtype=first.dtype)
    done: dict[tuple[tuple[int, int], ...], int] = {}
    for rank in mesh.ranks:
        where = local_slices(shape, mesh, spec.placements, rank)
        key = tuple((s.start, s.stop) for s in where)
        coord = mesh.coord(rank)
        if any(coord[k] != 0 for k, _ in partial):
            continue  # reduced below, from the group's first rank
        value = _reduced(blocks, spec, coord, partial)
        if key in done:
            other = done[key]
            if check_replicas and not np.allclose(out[where], value, rtol=1e-9, atol=1e-12):
                raise ExecutionError(
                    f"ranks {other} and {rank} should hold the same block of a {spec} value "
                    "but differ",
                    ranks=[other, rank],
                )
            continue
        done[key] = rank
        out[where] = value
    return out


def _reduced(
    blocks: Mapping[int, Array],
    spec: DistSpec,
    coord: tuple[int, ...],
    partial: list[tuple[int, str]],
) -> Array:
    """The block at `coord` reduced over the `partial` axes, the last mesh axis innermost."""
    mesh = spec.mesh
    if not partial:
        return blocks[mesh.rank_at(coord)]
    k, op = partial[0]
    values = []
    for i in range(mesh.shape[k]):
        c = list(coord)
        c[k] = i
        values.append(_reduced(blocks, spec, tuple(c), partial[1:]))
    return np.asarray(_REDUCE[op](np.stack(values)))
