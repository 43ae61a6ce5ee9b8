"""The torch backend's collectives: a program's comm steps as torch.distributed calls.

What it is for: a rank of the torch backend (`runtime.torch_rank`) runs comm steps and a
kernel's mid-op reductions over real process groups; this module makes those groups and
maps every step onto one torch.distributed collective (gloo on CPU, NCCL on CUDA:
`runtime.torch_device`), with the layout conversions between a rank's block (a tensor on
its device) and the flat tensor torch sends. Nothing leaves the device.

- `make_groups` creates a torch group for every group of every non-empty subset of mesh
  axes, of every mesh given (a flat program's mesh, or every pipeline stage's sub-mesh), on
  every rank and in the same order (torch.distributed requires it); a rank keeps its own
  group per axes subset (`Group`). A group of one rank has no torch group.
- steps: all_reduce -> `all_reduce` (several blocks, a fused bucket, in one call; avg =
  sum / n, gloo has no AVG), all_gather -> `all_gather_single`, reduce_scatter ->
  `reduce_scatter_single`, all_to_all -> `all_to_all_single`; local_slice and local_partial
  need no peer. Each is issued with `async_op=True` and returns its handle (None: nothing
  to wait for) and a `Finish` that makes its outputs once the handle is done. A numpy
  kernel's mid-op request is reduced by `reduce_array`.
- uneven shards (a dim that does not divide its mesh axes): a rank cannot see its peers'
  block sizes, so the caller passes them (`sizes`: per group position, along the dim the
  step gathers or moves; `placement.group_sizes`). all_gather and reduce_scatter pad every
  block to the largest and trim after (NCCL's *_into_tensor / *_tensor need equal blocks,
  and the cost model charges the padded message); all_to_all sends the real pieces with
  split sizes; reduce_scatter, all_to_all and local_slice cut as DTensor does (`chunk`:
  `torch.chunk`'s ceil-sized blocks, padded with empty ones, `placement.split_sizes`);
  S -> P pads by the real offsets. Empty blocks (6 rows over 4 ranks: 2, 2, 2, 0) travel
  as zero-size pieces: padded to the largest for all_gather / reduce_scatter, a zero split
  size for all_to_all.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from shardlab.errors import ExecutionError
from shardlab.mesh import Mesh
from shardlab.ops.base import Array
from shardlab.placement import Shard, split_sizes
from shardlab.reshard import CommStep
from shardlab.runtime.reshard_exec import partial_op, shard_dim
from shardlab.runtime.sharded import axes_group
from shardlab.runtime.torch_launch import BACKEND, torch_modules

if TYPE_CHECKING:
    from torch import Tensor

#: What an issued collective leaves behind: how to make its outputs once it is done.
Finish = Callable[[], "list[Tensor]"]


@dataclass(frozen=True, slots=True)
class Group:
    """This rank's group over some mesh axes: its ranks in mesh order, this rank's position
    in it, the torch group (None for a group of one) and, per torch group rank, the mesh
    position it holds (torch orders a group's ranks by process index)."""

    ranks: tuple[int, ...]
    pos: int
    pg: Any
    mesh_pos: tuple[int, ...]

    @property
    def n(self) -> int:
        return len(self.ranks)


def make_groups(
    meshes: Sequence[Mesh], proc: Mapping[int, int], me: int
) -> dict[tuple[str, ...], Group]:
    """Rank `me`'s group for every non-empty subset of its mesh's axes; every rank creates
    every group of every mesh, in the same order. `proc`: mesh rank -> process index."""
    _, dist = torch_modules()
    mine: dict[tuple[str, ...], Group] = {}
    for mesh in meshes:
        names = mesh.axis_names
        for k in range(1, len(names) + 1):
            for axes in itertools.combinations(names, k):
                seen: set[tuple[int, ...]] = set()
                for r in mesh.ranks:
                    group = axes_group(mesh, r, axes)
                    if group in seen:
                        continue
                    seen.add(group)
                    pg = dist.new_group([proc[g] for g in group]) if len(group) > 1 else None
                    if me in group:
                        mine[axes] = Group(group, group.index(me), pg, _torch_order(group, proc))
    return mine


def _torch_order(group: tuple[int, ...], proc: Mapping[int, int]) -> tuple[int, ...]:
    """Per torch group rank, the mesh position it holds (torch sorts by process index)."""
    return tuple(sorted(range(len(group)), key=lambda i: proc[group[i]]))


class Handles:
    """Several async handles waited as one."""

    def __init__(self, handles: list[Any]) -> None:
        self.handles = handles

    def wait(self) -> None:
        for h in self.handles:
            h.wait()


#: Per group position, the block sizes along the dim a step gathers or moves (None: even).
Sizes = tuple[int, ...] | None


def start_step(
    xs: Sequence[Tensor], step: CommStep, g: Group, sizes: Sequence[Sizes] | None = None
) -> tuple[Any, Finish]:
    """Issue comm step `step` on every block of `xs` over group `g`; `sizes[i]`: the group's
    block sizes along the source shard dim of block i (uneven shards; None: all equal)."""
    if step.kind == "all_reduce":
        return all_reduce(xs, partial_op(step.src, step), g)
    per = list(sizes) if sizes is not None else [None] * len(xs)
    started = [_start_one(x, step, g, s) for x, s in zip(xs, per, strict=True)]
    handles = [h for h, _ in started if h is not None]
    return Handles(handles) if handles else None, lambda: [f()[0] for _, f in started]


def _even(x: Tensor, dim: int, g: Group, sizes: Sizes) -> tuple[int, ...]:
    """`sizes`, or this rank's block size along `dim` at every position (equal blocks)."""
    return tuple(sizes) if sizes is not None else (x.shape[dim],) * g.n


def chunk(x: Tensor, n: int, dim: int) -> list[Tensor]:
    """`x` cut into `n` views along `dim` as DTensor cuts a shard (`torch.chunk`, padded with
    empty blocks; `placement.split_sizes`), not as `torch.tensor_split` would."""
    torch, _ = torch_modules()
    return list(torch.split(x, list(split_sizes(x.shape[dim], n)), dim=dim))


def _start_one(x: Tensor, step: CommStep, g: Group, sizes: Sizes) -> tuple[Any, Finish]:
    """Issue one step (other than all_reduce) on one block."""
    if step.kind == "all_gather":
        d = shard_dim(step.src, step)
        return _all_gather(x, d, g, _even(x, d, g, sizes))
    if step.kind == "reduce_scatter":
        return _reduce_scatter(x, partial_op(step.src, step), shard_dim(step.dst, step), g)
    if step.kind == "all_to_all":
        d = shard_dim(step.src, step)
        return _all_to_all(x, d, shard_dim(step.dst, step), g, _even(x, d, g, sizes))
    if step.kind == "local_slice":
        piece = chunk(x, g.n, shard_dim(step.dst, step))[g.pos].clone()
        return None, lambda: [piece]
    if step.kind == "local_partial":
        made = _local_partial(x, step, g, sizes)
        return None, lambda: [made]
    raise ExecutionError(f"unknown step kind {step.kind!r}", step=step.kind)


def _local_partial(x: Tensor, step: CommStep, g: Group, sizes: Sizes) -> Tensor:
    """R or S(d) -> P(op) on this rank, as `reshard_exec.apply_step` (`pad_shard`) does it."""
    op = partial_op(step.dst, step)
    if not isinstance(step.src, Shard):
        return x.clone() if op != "sum" or g.pos == 0 else x.new_zeros(x.shape)
    d = step.src.dim
    widths = _even(x, d, g, sizes)
    shape = list(x.shape)
    shape[d] = sum(widths)
    out = x.new_zeros(shape)
    out.narrow(d, sum(widths[: g.pos]), widths[g.pos]).copy_(x * g.n if op == "avg" else x)
    return out


def _padded(x: Tensor, dim: int, size: int) -> Tensor:
    """`x` zero-padded along `dim` to `size` (a contiguous copy)."""
    torch, _ = torch_modules()
    if x.shape[dim] == size:
        return x.contiguous().clone()
    shape = list(x.shape)
    shape[dim] = size - x.shape[dim]
    padded: Tensor = torch.cat([x, x.new_zeros(shape)], dim=dim)
    return padded


def _flat(parts: Sequence[Tensor]) -> Tensor:
    """The parts flattened and concatenated into one new tensor (it stays untouched while a
    collective reads it)."""
    torch, _ = torch_modules()
    flat: Tensor = torch.cat([p.reshape(-1) for p in parts])
    return flat


def _torch_op(op: str) -> Any:
    _, dist = torch_modules()
    ops = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM}
    ops.update(max=dist.ReduceOp.MAX, min=dist.ReduceOp.MIN)
    if op not in ops:
        raise ExecutionError(f"backend {BACKEND!r}: no reduction {op!r}", backend=BACKEND)
    return ops[op]


def all_reduce(xs: Sequence[Tensor], op: str, g: Group) -> tuple[Any, Finish]:
    """One all_reduce of the flattened, concatenated blocks (a fused bucket in one call; a
    bucket of mixed float dtypes travels in the widest and each block gets its own back)."""
    torch, dist = torch_modules()
    if g.pg is None:
        return None, lambda: [x.clone() for x in xs]
    wide = xs[0].dtype
    for x in xs[1:]:
        wide = torch.promote_types(wide, x.dtype)
    sizes = [x.numel() for x in xs]
    buf = _flat([x.to(wide) for x in xs])
    handle = dist.all_reduce(buf, op=_torch_op(op), group=g.pg, async_op=True)

    def finish() -> list[Tensor]:
        flat = buf / g.n if op == "avg" else buf
        parts = torch.split(flat, sizes)
        return [p.reshape(x.shape).to(x.dtype) for p, x in zip(parts, xs, strict=True)]

    return handle, finish


def reduce_array(data: Array, op: str, g: Group, where: Any) -> Array:
    """A numpy kernel's mid-op request (`runtime.kernels.CollectiveRequest`) reduced over
    group `g`, blocking; the tensor travels on torch device `where`."""
    torch, _ = torch_modules()
    arr = np.array(data, copy=True)
    if g.pg is None:
        return arr
    handle, finish = all_reduce([torch.from_numpy(arr).to(where)], op, g)
    if handle is not None:
        handle.wait()
    return np.asarray(finish()[0].cpu().numpy())


def _newer(dist: ModuleType, name: str, old: str) -> Any:
    """torch's newer name of a collective, or its older one."""
    return getattr(dist, name, None) or getattr(dist, old)


def _all_gather(x: Tensor, dim: int, g: Group, sizes: tuple[int, ...]) -> tuple[Any, Finish]:
    """Every position's block, padded to the largest along `dim` for the call, trimmed after."""
    torch, dist = torch_modules()
    if g.pg is None:
        return None, lambda: [x.clone()]
    padded = _padded(x, dim, max(sizes))
    out = padded.new_empty(g.n * padded.numel())
    gather = _newer(dist, "all_gather_single", "all_gather_into_tensor")
    handle = gather(out, padded.reshape(-1), group=g.pg, async_op=True)

    def finish() -> list[Tensor]:
        got = out.reshape(g.n, *padded.shape)
        by_pos = [got[g.mesh_pos.index(c)].narrow(dim, 0, sizes[c]) for c in range(g.n)]
        return [torch.cat(by_pos, dim=dim)]

    return handle, finish


def _reduce_scatter(x: Tensor, op: str, dim: int, g: Group) -> tuple[Any, Finish]:
    """This rank's DTensor chunk of the reduced block (`chunk`); every chunk is padded to
    the largest (the first) for the call and this rank's is trimmed after."""
    _, dist = torch_modules()
    chunks = chunk(x, g.n, dim)
    if g.pg is None:
        return None, lambda: [chunks[0].clone()]
    big = chunks[0].shape[dim]
    padded = [_padded(c, dim, big) for c in chunks]
    send = _flat([padded[c] for c in g.mesh_pos])
    out = padded[0].new_empty(padded[0].numel())
    scatter = _newer(dist, "reduce_scatter_single", "reduce_scatter_tensor")
    handle = scatter(out, send, op=_torch_op(op), group=g.pg, async_op=True)
    mine = chunks[g.pos].shape[dim]

    def finish() -> list[Tensor]:
        got = out.reshape(padded[0].shape).narrow(dim, 0, mine)
        return [got / g.n if op == "avg" else got]

    return handle, finish


def _all_to_all(
    x: Tensor, src_dim: int, dst_dim: int, g: Group, sizes: tuple[int, ...]
) -> tuple[Any, Finish]:
    """S(src_dim) -> S(dst_dim): chunk j of this block (along dst_dim, as DTensor cuts it:
    `chunk`) goes to position j; the chunks received (position c's is `sizes[c]` long along
    src_dim) are concatenated along src_dim in mesh order. Split sizes (zero for an empty
    piece), no padding."""
    torch, dist = torch_modules()
    chunks = chunk(x, g.n, dst_dim)
    if g.pg is None:
        return None, lambda: [chunks[0].clone()]
    send = _flat([chunks[c] for c in g.mesh_pos])
    mine = list(chunks[g.pos].shape)

    def shape_from(c: int) -> tuple[int, ...]:
        shape = list(mine)
        shape[src_dim] = sizes[c]
        return tuple(shape)

    recv = [math.prod(shape_from(c)) for c in g.mesh_pos]
    out = x.new_empty(sum(recv))
    handle = dist.all_to_all_single(
        out,
        send,
        output_split_sizes=recv,
        input_split_sizes=[chunks[c].numel() for c in g.mesh_pos],
        group=g.pg,
        async_op=True,
    )

    def finish() -> list[Tensor]:
        got = dict(zip(g.mesh_pos, torch.split(out, recv), strict=True))
        by_pos = [got[c].reshape(shape_from(c)) for c in range(g.n)]
        return [torch.cat(by_pos, dim=src_dim)]

    return handle, finish
