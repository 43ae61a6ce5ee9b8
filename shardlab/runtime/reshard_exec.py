"""Run a reshard plan (`shardlab.reshard.CommStep`s) on per-rank numpy blocks.

Each step is a simulated collective over the rank groups of its mesh axis
(`Mesh.groups(axis)`, in coordinate order): blocks only ever move between ranks of one group,
never through the global view, so a passing test proves the plan itself is right.
Uneven blocks (a dim that does not divide its mesh axes) are the real blocks: a gather
concatenates them, a scatter, all_to_all or slice cuts as DTensor does (`torch.chunk`:
ceil-sized blocks, the tail ones short or empty; `chunk`, `placement.split_sizes`), so no
padding is modelled here. Zero-size blocks move like any other (numpy concatenates, stacks
and reduces them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from shardlab.errors import ExecutionError
from shardlab.mesh import Mesh
from shardlab.ops.base import Array
from shardlab.placement import (
    DistSpec,
    Partial,
    Placement,
    Shard,
    local_shape_on,
    split_sizes,
)
from shardlab.reshard import CommStep

_REDUCE = {
    "sum": lambda xs: np.sum(xs, axis=0),
    "avg": lambda xs: np.mean(xs, axis=0),
    "max": lambda xs: np.max(xs, axis=0),
    "min": lambda xs: np.min(xs, axis=0),
}


def partial_op(p: Placement, step: CommStep) -> str:
    """The reduce op of the Partial placement a step reduces (an error for another)."""
    if not isinstance(p, Partial):
        raise ExecutionError(f"{step.kind} needs a Partial placement, got {p}", step=step.kind)
    return p.op


def shard_dim(p: Placement, step: CommStep) -> int:
    """The dim of the Shard placement a step gathers or splits (an error for another)."""
    if not isinstance(p, Shard):
        raise ExecutionError(f"{step.kind} needs a Shard placement, got {p}", step=step.kind)
    return p.dim


def chunk(x: Array, n: int, axis: int) -> list[Array]:
    """`x` cut into `n` views along `axis` as DTensor cuts a shard (`torch.chunk`, padded with
    empty blocks: `placement.split_sizes`), not as `numpy.array_split` would."""
    sizes = split_sizes(x.shape[axis], n)
    cuts = [sum(sizes[: c + 1]) for c in range(n - 1)]
    return np.split(x, cuts, axis=axis)


def pad_shard(x: Array, sizes: Sequence[int], c: int, dim: int, op: str) -> Array:
    """Shard `c` of a group whose blocks have `sizes` along `dim`, zero-padded to the unsplit
    block: S(dim) -> P(sum) (avg: times n)."""
    shape = list(x.shape)
    shape[dim] = sum(sizes)
    out = np.zeros(shape, dtype=x.dtype)
    where = [slice(None)] * x.ndim
    start = sum(sizes[:c])
    where[dim] = slice(start, start + sizes[c])
    out[tuple(where)] = x * len(sizes) if op == "avg" else x
    return out


def apply_step(blocks: Mapping[int, Array], mesh: Mesh, step: CommStep) -> dict[int, Array]:
    """Every rank's block after one step, computed group by group along `step.axis`."""
    out: dict[int, Array] = {}
    k = mesh.axis_index(step.axis)
    for group in mesh.groups(k):
        xs = [blocks[r] for r in group]
        n = len(group)
        if step.kind == "all_gather":
            full = np.concatenate(xs, axis=shard_dim(step.src, step))
            ys = [full.copy() for _ in group]
        elif step.kind == "all_reduce":
            total = np.asarray(_REDUCE[partial_op(step.src, step)](np.stack(xs)))
            ys = [total.copy() for _ in group]
        elif step.kind == "reduce_scatter":
            total = np.asarray(_REDUCE[partial_op(step.src, step)](np.stack(xs)))
            ys = [c.copy() for c in chunk(total, n, shard_dim(step.dst, step))]
        elif step.kind == "all_to_all":
            d, e = shard_dim(step.src, step), shard_dim(step.dst, step)
            sent = [chunk(x, n, e) for x in xs]  # sent[i][j]: from rank i to rank j
            ys = [np.concatenate([sent[i][j] for i in range(n)], axis=d) for j in range(n)]
        elif step.kind == "local_slice":
            d = shard_dim(step.dst, step)
            ys = [chunk(x, n, d)[c].copy() for c, x in enumerate(xs)]
        elif step.kind == "local_partial" and isinstance(step.src, Shard):
            d, op = step.src.dim, partial_op(step.dst, step)
            sizes = [x.shape[d] for x in xs]
            ys = [pad_shard(x, sizes, c, d, op) for c, x in enumerate(xs)]
        elif step.kind == "local_partial":
            keep_all = partial_op(step.dst, step) != "sum"
            ys = [x.copy() if keep_all or c == 0 else np.zeros_like(x) for c, x in enumerate(xs)]
        else:  # pragma: no cover - CommStep.kind is a closed Literal
            raise ExecutionError(f"unknown step kind {step.kind!r}", step=step.kind)
        out.update(zip(group, ys, strict=True))
    return out


def apply_transition(
    blocks: Mapping[int, Array],
    shape: Sequence[int],
    mesh: Mesh,
    src: DistSpec,
    dst: DistSpec,
    steps: Sequence[CommStep],
) -> dict[int, Array]:
    """Every rank's block under `dst`, from its block under `src`, by running `steps`.

    Checks that the steps chain from `src` to `dst` and that every block ends with the
    `dst` local shape; raises ExecutionError otherwise.
    """
    state = list(src.placements)
    for r in mesh.ranks:
        expected = local_shape_on(shape, mesh, src.placements, r)
        if blocks[r].shape != expected:
            raise ExecutionError(
                f"rank {r} holds a block of shape {blocks[r].shape}, expected {expected} for {src}",
                rank=r,
            )
    current: dict[int, Array] = dict(blocks)
    for i, step in enumerate(steps):
        k = mesh.axis_index(step.axis)
        if state[k] != step.src:
            raise ExecutionError(
                f"step {i} ({step.kind}) expects {step.src} on mesh axis {step.axis!r} "
                f"but the value is {state[k]} there",
                step=i,
            )
        current = apply_step(current, mesh, step)
        state[k] = step.dst
    if tuple(state) != dst.placements:
        raise ExecutionError(
            f"the steps end at {DistSpec(mesh, tuple(state))}, not at {dst}", step=len(steps)
        )
    for r, block in current.items():
        want = local_shape_on(shape, mesh, dst.placements, r)
        if block.shape != want:  # pragma: no cover - guards a planner bug
            raise ExecutionError(f"rank {r} ends with shape {block.shape}, not {want}", rank=r)
    return current
