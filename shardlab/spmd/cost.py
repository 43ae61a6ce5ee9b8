"""Cost of a placement choice, used to choose between placements.

Communication is counted in bytes; compute is converted to bytes at `FLOPS_PER_BYTE`, so a
candidate that replicates an op's work pays for the redundant FLOPs.

`reshard_cost` is what the reshard planner (`shardlab.reshard`) would move: the exact
cheapest plan over all mesh axes together, with its per-collective latency. Where the
planner's state space is too large to search per candidate (`EXACT_STATES`), and for a
single axis, `axis_cost` estimates with ring-algorithm byte counts per rank (all_gather and
reduce_scatter (n-1)/n, all_reduce 2(n-1)/n, all_to_all (n-1)/n of the full data along the
axis) plus the fixed latency; local slicing (R -> S) and R -> P (keep the value on one rank,
zeros elsewhere) move nothing.
"""

from __future__ import annotations

import functools
import math

from shardlab.ir import DTYPE_BYTES, TensorType
from shardlab.mesh import Mesh
from shardlab.placement import DistSpec, Partial, Placement, Replicate, Shard, local_shape
from shardlab.reshard import LATENCY_BYTES, fits, transition_cost

__all__ = [
    "FLOPS_PER_BYTE",
    "LATENCY_BYTES",
    "axis_cost",
    "local_bytes",
    "reshard_cost",
    "spec_cost",
]

#: Compute expressed in bytes moved in the same time: ~1 PFLOP/s of dense bf16 against
#: ~450 GB/s of NVLink on an H100 node. Replicating an op costs its FLOPs / this.
FLOPS_PER_BYTE = 2000.0
#: Largest planner state space (placements per axis ** mesh axes) priced exactly per
#: candidate; a 3-axis mesh and a 4-D tensor have 7**3 = 343 states.
EXACT_STATES = 400


def local_bytes(ttype: TensorType, spec: DistSpec | None) -> float:
    """Bytes of the block one rank holds (the whole tensor when the spec is unknown)."""
    if spec is None:
        return float(ttype.nbytes)
    numel = math.prod(local_shape(ttype.shape, spec.mesh, spec.placements))
    return float(numel * DTYPE_BYTES[ttype.dtype])


def axis_cost(nbytes: float, n: int, src: Placement | None, dst: Placement) -> float:
    """Bytes one rank moves to turn `src` into `dst` along an axis of `n` ranks.

    `nbytes` is the size of the rank's block before the change.
    """
    if src is None or src == dst or n == 1:
        return 0.0
    full = nbytes * n if isinstance(src, Shard) else nbytes
    if isinstance(src, Replicate):
        return 0.0  # R -> S is a local slice, R -> P keeps the value on one rank
    if isinstance(src, Shard):
        if isinstance(dst, Shard):
            return nbytes * (n - 1) / n + LATENCY_BYTES  # all_to_all of the block
        return full * (n - 1) / n + LATENCY_BYTES  # all_gather (then a free R -> P)
    assert isinstance(src, Partial)
    if isinstance(dst, Shard):
        return full * (n - 1) / n + LATENCY_BYTES  # reduce_scatter
    return 2 * full * (n - 1) / n + LATENCY_BYTES  # all_reduce (then a free R -> P)


def spec_cost(ttype: TensorType, src: DistSpec | None, dst: DistSpec) -> float:
    """Estimated bytes moved per rank to reshard a value from `src` to `dst`."""
    if src is None or src == dst:
        return 0.0
    nbytes = local_bytes(ttype, src)
    total = 0.0
    for k, (a, b) in enumerate(zip(src.placements, dst.placements, strict=True)):
        total += axis_cost(nbytes, src.mesh.shape[k], a, b)
    return total


@functools.lru_cache(maxsize=65536)
def reshard_cost(
    ttype: TensorType, mesh: Mesh, src: tuple[Placement, ...], dst: tuple[Placement, ...]
) -> float:
    """Bytes per rank plus latency to reshard a value from `src` to `dst`: the planner's
    own cost where its search is small enough, else the per-axis estimate."""
    if src == dst:
        return 0.0
    states = (ttype.rank + 3) ** mesh.ndim
    if states <= EXACT_STATES and fits(ttype.shape, mesh, src) and fits(ttype.shape, mesh, dst):
        return transition_cost(ttype.shape, ttype.dtype, mesh, src, dst)
    return spec_cost(ttype, DistSpec(mesh, src), DistSpec(mesh, dst))
