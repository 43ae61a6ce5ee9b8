"""Collectives that a local kernel runs inside its op, and what they cost.

What it is for: most sharded ops compute on their blocks alone, and the program's comm ops
carry every byte that moves. A few local kernels must combine statistics with the other
ranks halfway through (`runtime.kernels.CollectiveRequest`): the vocab-parallel cross
entropy (torch's loss_parallel(), Megatron-LM's) all-reduces every token's max logit and sum
of exponentials (float32) and its target logit (the logits' dtype) over the ranks that hold
a block of the vocabulary, in forward only: the backward reads the log-sum-exp the forward
kept. Those all-reduces are small (one value per token) but latency-bound and blocking: the
op cannot finish before every rank of the group has reached them. `midop_seconds` prices
them on the cluster's links, and `compute.program_op_times` adds them to the op's time.

`MIDOP_REDUCTIONS` is the table, per kernel name: the all-reduces it issues, in order, each
as (reduction, dtype), over the mesh axes that shard input 0's last dim (no axes, no
collective).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from shardlab.cost.clusters import Cluster
from shardlab.cost.comm import collective_time
from shardlab.ir import DTYPE_BYTES
from shardlab.placement import DistSpec, Shard, local_shape
from shardlab.program import DistOp, DistProgram

#: The dtype entry of `MIDOP_REDUCTIONS` that means "input 0's (the logits') dtype".
LOGITS_DTYPE = "logits"

#: The forward's all-reduces: max and sum of exp in float32, the target logit as the logits.
_VOCAB_PARALLEL = (("max", "float32"), ("sum", "float32"), ("sum", LOGITS_DTYPE))

#: kernel name -> the all-reduces it issues over the axes that shard its logits' vocab dim
#: (input 0's last dim), in order: (reduction, dtype), each of one element per token
#: (input 0's leading dims).
MIDOP_REDUCTIONS: Mapping[str, tuple[tuple[str, str], ...]] = {
    "cross_entropy_vocab_parallel": _VOCAB_PARALLEL,
    "cross_entropy_vocab_parallel+global_mean": _VOCAB_PARALLEL,
    "cross_entropy_grad_sharded": (),  # reads the forward's log-sum-exp: nothing to reduce
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


def midop_bytes(program: DistProgram, op: DistOp) -> list[tuple[tuple[str, ...], float]]:
    """Each all-reduce the op's kernel issues: (mesh axes, bytes of its input per rank);
    none for a kernel outside the table or whose logits are not sharded on the vocab."""
    reductions = MIDOP_REDUCTIONS.get(op.kernel, ())
    if not reductions:
        return []
    t, spec = program.types[op.inputs[0]], program.specs[op.inputs[0]]
    axes = midop_axes(spec, len(t.shape))
    if not axes:
        return []
    tokens = math.prod(local_shape(t.shape, spec.mesh, spec.placements)[:-1])
    return [
        (axes, tokens * DTYPE_BYTES[t.dtype if dtype == LOGITS_DTYPE else dtype])
        for _, dtype in reductions
    ]


def midop_seconds(program: DistProgram, op: DistOp, cluster: Cluster) -> float:
    """Seconds the op's kernel spends in its own all-reduces on the first rank's group
    (0 for a kernel that issues none, or whose input is not sharded on the vocab)."""
    first = program.mesh.ranks[0]
    return sum(
        collective_time("all_reduce", size, midop_group(program, axes, first), cluster)
        for axes, size in midop_bytes(program, op)
    )
