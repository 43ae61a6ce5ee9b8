"""Plan the collectives that turn one DistSpec of a value into another on the same mesh.

`plan_transition` returns a sequence of `CommStep`s, each changing the placement on one mesh
axis. It is an exact shortest-path search (Dijkstra) over per-axis placement tuples: a node is
a valid placement tuple, an edge is one per-axis move (all_gather, all_reduce, reduce_scatter,
all_to_all, local slice, local partial), and a path's cost is (bytes per rank plus a fixed
latency per collective expressed in bytes, `LATENCY_BYTES`; number of collectives; peak block
bytes), compared in that order: a small tensor is all-reduced in one step rather than sliced,
reduced and gathered to save a few bytes. With at most a handful of mesh axes and tensor dims
the graph is small (a few hundred nodes), so the search is exhaustive and the plan is never
slower (under that alpha-beta cost) than any fixed ordering, e.g. PyTorch DTensor's
gather-then-slice plan.

Legality of a move (checked on every edge, so nesting order is respected):

- a shard move on axis k of dim d (gather, slice, the source or target side of all_to_all,
  reduce_scatter) requires k to be the innermost (right-most) mesh axis sharding d, because
  the left mesh axis is the outermost split and only the innermost split is contiguous;
- reducing a Partial on axis k requires every Partial on a later mesh axis to use the same op
  (reductions over several axes apply from the last mesh axis to the first);
- S(d) -> P(sum|avg) is local: the rank zero-pads its shard (scaled by n for avg);
- uneven and empty blocks are fine (DTensor's layout, `torch.chunk`: ceil-sized blocks, the
  tail ones short or empty; `placement.split_sizes`): a shard move on the innermost axis of
  a dim only ever chunks or rejoins the block the outer axes leave, so every state's
  blocks are its canonical ones (`placement.index_ranges`), and every pair of states plans.

`transition_cost` is the same search's cost of a path without the steps: the sharding rules
price their options with it.

Bytes follow the ring formulas of `shardlab.spmd.cost`, with B the block a rank holds before
the step (the largest block, the first, where a dim does not divide: collectives pad to it,
as NCCL's all_gather_into_tensor / reduce_scatter_tensor need equal blocks): all_reduce 2(n-1)/n B,
all_gather (n-1)/n (nB), reduce_scatter (n-1)/n B, all_to_all (n-1)/n B, local steps 0.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from shardlab.errors import PlacementError
from shardlab.ir import DTYPE_BYTES
from shardlab.mesh import Mesh
from shardlab.placement import (
    DistSpec,
    Partial,
    Placement,
    Replicate,
    Shard,
    check_placements,
    format_placements,
    local_shape,
)

StepKind = Literal[
    "all_gather", "all_reduce", "reduce_scatter", "all_to_all", "local_slice", "local_partial"
]
COLLECTIVES = frozenset({"all_gather", "all_reduce", "reduce_scatter", "all_to_all"})

State = tuple[Placement, ...]
#: Fixed cost of launching one collective, in byte-equivalents (~5 us at ~13 GB/s).
LATENCY_BYTES = 65536.0


@dataclass(frozen=True, slots=True)
class CommStep:
    """One per-mesh-axis move of a reshard: what runs, on which axis, and what it costs.

    `tensor_dim` is the dim gathered, scattered or sliced (for all_to_all: the dim that ends
    up sharded; the source dim is `src.dim`); None for all_reduce and local_partial.
    """

    kind: StepKind
    axis: str
    tensor_dim: int | None
    src: Placement
    dst: Placement
    bytes_per_rank: float
    reason: str


def _innermost(state: State, k: int, dim: int) -> bool:
    """True when mesh axis k is the last mesh axis sharding `dim` in `state`."""
    return all(not (isinstance(p, Shard) and p.dim == dim) for p in state[k + 1 :])


def _reducible(state: State, k: int, op: str) -> bool:
    """True when the Partial on axis k may be reduced before those on later axes."""
    return all(not isinstance(p, Partial) or p.op == op for p in state[k + 1 :])


def _moves(
    state: State, k: int, choices: Sequence[Placement]
) -> Iterator[tuple[StepKind, int | None, Placement]]:
    """Legal single-axis moves from `state` on axis k: (kind, tensor_dim, new placement)."""
    a = state[k]
    for b in choices:
        if b == a:
            continue
        if isinstance(a, Replicate):
            if isinstance(b, Shard) and _innermost(state, k, b.dim):
                yield "local_slice", b.dim, b
            elif isinstance(b, Partial):
                yield "local_partial", None, b
        elif isinstance(a, Shard):
            if not _innermost(state, k, a.dim):
                continue
            if isinstance(b, Replicate):
                yield "all_gather", a.dim, b
            elif isinstance(b, Shard) and _innermost(state, k, b.dim):
                yield "all_to_all", b.dim, b
            elif isinstance(b, Partial) and b.op in ("sum", "avg"):
                yield "local_partial", a.dim, b  # zero-pad the shard to the unsplit block
        elif isinstance(a, Partial) and _reducible(state, k, a.op):
            if isinstance(b, Replicate):
                yield "all_reduce", None, b
            elif isinstance(b, Shard) and _innermost(state, k, b.dim):
                yield "reduce_scatter", b.dim, b


def _step_bytes(kind: StepKind, n: int, block: float) -> float:
    """Ring-algorithm bytes one rank moves; `block` is its block before the step."""
    if kind == "all_reduce":
        return 2 * (n - 1) / n * block
    if kind == "all_gather":
        return (n - 1) / n * (block * n)
    if kind in ("reduce_scatter", "all_to_all"):
        return (n - 1) / n * block
    return 0.0


def _reason(kind: StepKind, axis: str, a: Placement, b: Placement) -> str:
    why = {
        "all_gather": "gather the shards",
        "all_reduce": "sum up the partial values" if isinstance(a, Partial) else "reduce",
        "reduce_scatter": "reduce the partial values and keep one shard each",
        "all_to_all": "swap which dim is sharded without replicating",
        "local_slice": "keep this rank's slice of the replicated value",
        "local_partial": "turn the value into a partial one locally",
    }[kind]
    return f"{kind} on mesh axis {axis!r}: {a} -> {b} ({why})"


@functools.lru_cache(maxsize=65536)
def _block_numel(shape: tuple[int, ...], mesh: Mesh, state: State) -> int | None:
    """Elements of the largest block a rank holds under `state`; None when `state` does not
    fit `shape` (`check_placements`; empty blocks fit)."""
    try:
        check_placements(shape, mesh, state)
    except PlacementError:
        return None
    return math.prod(local_shape(shape, mesh, state))


def plan_transition(
    shape: Sequence[int], dtype: str, mesh: Mesh, src: DistSpec, dst: DistSpec
) -> tuple[CommStep, ...]:
    """The cheapest sequence of per-axis steps that turns `src` into `dst` (cached)."""
    if src.mesh != mesh or dst.mesh != mesh:
        raise PlacementError(
            f"cannot reshard {src} -> {dst}: both DistSpecs must be on mesh {mesh}",
        )
    if dtype not in DTYPE_BYTES:
        raise PlacementError(f"unknown dtype {dtype!r}", dtype=dtype)
    shape_t = tuple(int(s) for s in shape)
    check_placements(shape_t, mesh, src.placements, "reshard source")
    check_placements(shape_t, mesh, dst.placements, "reshard target")
    return _plan(shape_t, dtype, mesh, src.placements, dst.placements)


Cost = tuple[float, int, float]
Edges = dict[State, tuple[tuple[State, CommStep], ...]]


@functools.lru_cache(maxsize=256)
def _graph(shape: tuple[int, ...], itemsize: int, mesh: Mesh, ops: tuple[str, ...]) -> Edges:
    """Every valid placement tuple and its legal single-axis steps (with their bytes)."""
    choices: list[Placement] = [Replicate(), *(Shard(d) for d in range(len(shape)))]
    choices += [Partial(op) for op in ops]
    edges: Edges = {}
    for state in itertools.product(choices, repeat=mesh.ndim):
        numel = _block_numel(shape, mesh, state)
        if numel is None:
            continue
        out: list[tuple[State, CommStep]] = []
        for k, axis in enumerate(mesh.axis_names):
            n = mesh.shape[k]
            for kind, dim, b in _moves(state, k, choices):
                nxt = (*state[:k], b, *state[k + 1 :])
                if _block_numel(shape, mesh, nxt) is None:
                    continue
                nbytes = _step_bytes(kind, n, float(numel * itemsize)) if n > 1 else 0.0
                reason = _reason(kind, axis, state[k], b)
                out.append((nxt, CommStep(kind, axis, dim, state[k], b, nbytes, reason)))
        edges[state] = tuple(out)
    return edges


@dataclass(frozen=True, slots=True)
class _Paths:
    """Dijkstra from one source state: the cheapest last step into each reachable state, and
    the path's cost (bytes plus `LATENCY_BYTES` per collective)."""

    back: dict[State, tuple[State, CommStep]]
    cost: dict[State, float]


@functools.lru_cache(maxsize=4096)
def _tree(
    shape: tuple[int, ...], itemsize: int, mesh: Mesh, src: State, ops: tuple[str, ...]
) -> _Paths:
    """Dijkstra from `src` to every state."""
    edges = _graph(shape, itemsize, mesh, ops)
    numel = {state: _block_numel(shape, mesh, state) or 0 for state in edges}
    start: Cost = (0.0, 0, float(numel[src]))
    best: dict[State, Cost] = {src: start}
    back: dict[State, tuple[State, CommStep]] = {}
    heap: list[tuple[Cost, int, State]] = [(start, 0, src)]
    tick = 0
    while heap:
        cost, _, state = heapq.heappop(heap)
        if cost > best[state]:
            continue
        for nxt, step in edges[state]:
            launches = step.kind in COLLECTIVES and step.bytes_per_rank > 0
            new: Cost = (
                cost[0] + step.bytes_per_rank + LATENCY_BYTES * launches,
                cost[1] + launches,
                max(cost[2], float(numel[nxt])),
            )
            if nxt not in best or new < best[nxt]:
                best[nxt] = new
                back[nxt] = (state, step)
                tick += 1
                heapq.heappush(heap, (new, tick, nxt))
    return _Paths(back, {state: c[0] for state, c in best.items()})


def _partial_ops(src: State, dst: State) -> tuple[str, ...]:
    return tuple(sorted({p.op for p in (*src, *dst) if isinstance(p, Partial)}))


def fits(shape: tuple[int, ...], mesh: Mesh, state: State) -> bool:
    """True when `state` is valid for `shape` (`check_placements`; empty blocks fit)."""
    return _block_numel(shape, mesh, state) is not None


@functools.lru_cache(maxsize=65536)
def transition_cost(
    shape: tuple[int, ...], dtype: str, mesh: Mesh, src: State, dst: State
) -> float:
    """What `plan_transition(src -> dst)` costs: bytes per rank plus `LATENCY_BYTES` per
    collective. The sharding rules price their candidates with it. Unlike
    `plan_transition` it does not validate its arguments (both states must fit `shape`)."""
    if src == dst:
        return 0.0
    paths = _tree(shape, DTYPE_BYTES[dtype], mesh, src, _partial_ops(src, dst))
    return paths.cost[dst]


@functools.lru_cache(maxsize=4096)
def _plan(
    shape: tuple[int, ...], dtype: str, mesh: Mesh, src: State, dst: State
) -> tuple[CommStep, ...]:
    """Walk the shortest-path tree from `src` back from `dst`; see the module docstring."""
    if src == dst:
        return ()
    back = _tree(shape, DTYPE_BYTES[dtype], mesh, src, _partial_ops(src, dst)).back
    if dst not in back:  # pragma: no cover - every pair is reachable through R...R
        raise PlacementError(
            f"no reshard path from {format_placements(src)} to {format_placements(dst)}"
        )
    steps: list[CommStep] = []
    state = dst
    while state != src:
        state, step = back[state]
        steps.append(step)
    return tuple(reversed(steps))


def total_bytes(steps: Sequence[CommStep]) -> float:
    """Bytes per rank moved by a plan."""
    return sum(s.bytes_per_rank for s in steps)
