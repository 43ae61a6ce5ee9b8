"""Collectives that a local kernel runs inside its op, and what they cost.

What it is for: most sharded ops compute on their blocks alone, and the program's comm ops
carry every byte that moves. A few local kernels must combine statistics with the other
ranks halfway through (`runtime.kernels.CollectiveRequest`): Megatron's vocab-parallel cross
entropy all-reduces the max and the sum of exponentials of every token's logits over the
ranks that hold a block of the vocabulary, forward and backward. Those all-reduces are small
(one float per token) but latency-bound and blocking: the op cannot finish before every rank
of the group has reached them. `midop_seconds` prices them on the cluster's links, and
`compute.program_op_times` adds them to the op's time.

`MIDOP_REDUCTIONS` is the table, per kernel name: how many all-reduces it issues and which
input's last dim decides the group (the mesh axes sharding it; no axes, no collective).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from shardlab.cost.clusters import Cluster
from shardlab.cost.comm import collective_time
from shardlab.ir import DTYPE_BYTES
from shardlab.placement import DistSpec, Shard, local_shape
from shardlab.program import DistOp, DistProgram

#: kernel name -> all-reduces it issues over the axes that shard its logits' vocab dim
#: (input 0's last dim), each of one element per token (input 0's leading dims).
MIDOP_REDUCTIONS: Mapping[str, int] = {
    "cross_entropy_vocab_parallel": 2,  # max, sum of exp
    "cross_entropy_vocab_parallel+global_mean": 2,
    "cross_entropy_grad_sharded": 2,  # max, sum of exp (only when the vocab is sharded)
}


def midop_axes(spec: DistSpec, ndim: int) -> tuple[str, ...]:
    """The mesh axes a kernel of `MIDOP_REDUCTIONS` reduces over: those sharding the last
    dim of its first input (`spec`, of `ndim` dims)."""
    return tuple(
        spec.mesh.axis_names[k]
        for k, p in enumerate(spec.placements)
        if isinstance(p, Shard) and p.dim == ndim - 1
    )


def midop_group(program: DistProgram, axes: tuple[str, ...], rank: int) -> tuple[int, ...]:
    """The ranks that share `rank`'s coordinates on every mesh axis but `axes`."""
    group = [rank]
    for axis in axes:  # each axis widens the group by its own (O(group), not O(mesh))
        group = [r for member in group for r in program.mesh.group_of(member, axis)]
    return tuple(sorted(set(group)))


def midop_seconds(program: DistProgram, op: DistOp, cluster: Cluster) -> float:
    """Seconds the op's kernel spends in its own all-reduces on the first rank's group
    (0 for a kernel that issues none, or whose input is not sharded on the vocab)."""
    count = MIDOP_REDUCTIONS.get(op.kernel, 0)
    if count == 0:
        return 0.0
    t, spec = program.types[op.inputs[0]], program.specs[op.inputs[0]]
    axes = midop_axes(spec, len(t.shape))
    if not axes:
        return 0.0
    local = local_shape(t.shape, spec.mesh, spec.placements)
    size = math.prod(local[:-1]) * DTYPE_BYTES[t.dtype]
    group = midop_group(program, axes, program.mesh.ranks[0])
    return count * collective_time("all_reduce", size, group, cluster)
