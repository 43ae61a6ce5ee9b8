"""Real ranks: run a DistProgram with one process per rank over torch.distributed (gloo, CPU).

What it is for: the simulated mesh (`runtime.simulated`) proves a program right with numpy
collectives it computes itself; this backend runs the same per-rank program where every
collective is a real `torch.distributed` call between processes, so `shardlab verify
--backend torch` checks the program as a framework would run it.

`run_torchdist` has the contract of `run_simulated`: the same sources, split by the same
seed (`runtime.distribute`), give every value's block on every rank (`Blocks`), so
`global_view` and verification work unchanged. It spawns one process per mesh rank
(`torch.multiprocessing`, a gloo group over a FileStore in a temporary directory); each
process runs its rank's ops in program order and writes back its blocks.

Per rank:

- compute ops run their rule's numpy kernel (`runtime.kernels`) on the rank's blocks; a
  kernel's mid-op `CollectiveRequest` is a `dist.all_reduce` over the group of its axes;
- comm steps on a mesh axis run over the torch group of the rank's group along that axis
  (`Mesh.groups` order; every group of every subset of mesh axes is created on every rank,
  in the same order): all_reduce -> `all_reduce` (several inputs, a fused bucket, in one
  call; avg = sum / n, gloo has no AVG), all_gather -> `all_gather_single`, reduce_scatter
  -> `reduce_scatter_single`, all_to_all -> `all_to_all_single`; local_slice and
  local_partial need no peer;
- an async op (`hazards.is_async`: any op on a `comm:*` stream) is issued with
  `async_op=True`; its handle is waited, and its outputs made, before the first op that
  names it as a happens-before predecessor (a dep, the next op on its stream) is issued,
  and at the end; `wait`, `hold` and `free` do nothing else. `send` / `recv` (pipeline
  stage programs) are not run here: ExecutionError.

Under `torchrun` (RANK, WORLD_SIZE and MASTER_ADDR set) nothing is spawned: this process is
one rank, the default group is joined from the environment, and every rank ends with every
rank's blocks (`all_gather_object`). `python -m shardlab.runtime.torchdist PLAN.json`
verifies a saved plan (`shardlab.plan.save_plan`) on this backend that way, or, run without
torchrun, by spawning.

Timing (`time_torchdist`, used by `runtime.measure`): every rank runs its program `steps`
times on the same sources, a `dist.barrier()` before each step; the wall clock
(`time.perf_counter_ns`) is read around each op, relative to the rank's own barrier exit. A
sync op's span is its issue to its outputs stored; an async collective's is its issue to its
wait's completion; a `wait` / `hold` / `free` op's span includes completing its predecessors
(where the rank blocks). The first `warmup` steps are dropped; each rank returns its spans
(`RankTiming`).
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import os
import pickle
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from shardlab.errors import ExecutionError, ShardlabError
from shardlab.ops.base import Array
from shardlab.placement import Shard
from shardlab.program import DistOp, DistProgram
from shardlab.reshard import CommStep
from shardlab.runtime import hazards as hz
from shardlab.runtime.distribute import distribute
from shardlab.runtime.kernels import KERNELS, CollectiveRequest, LocalContext
from shardlab.runtime.reshard_exec import partial_op, shard_dim
from shardlab.runtime.sharded import axes_group

Blocks = dict[str, dict[int, Array]]
#: One rank's blocks: value name -> array.
RankBlocks = dict[str, Array]
#: What an issued collective leaves behind: its handle (None: done) and how to make its
#: outputs once it is done.
Finish = Callable[[], list[Array]]

BACKEND = "torch"
_TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR")


def _torch() -> tuple[ModuleType, ModuleType]:
    """torch and torch.distributed, or an ExecutionError naming the backend."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        raise ExecutionError(
            f"backend {BACKEND!r} needs PyTorch with torch.distributed ({exc}); "
            "install torch or use --backend simulated",
            backend=BACKEND,
        ) from None
    if not dist.is_available():
        raise ExecutionError(
            f"backend {BACKEND!r}: this PyTorch build has no torch.distributed", backend=BACKEND
        )
    return torch, dist


def under_torchrun() -> bool:
    """Whether this process is one rank that torchrun (or a similar launcher) started."""
    return all(k in os.environ for k in _TORCHRUN_ENV)


def run_torchdist(
    program: DistProgram,
    sources: Mapping[str, Array],
    seed: int = 0,
    *,
    compute_dtype: str | None = None,
    nproc: int | None = None,
    timeout_s: float = 300.0,
) -> Blocks:
    """Every program value's block on every rank, each rank run by its own process.

    `seed` splits partial sources at random (as `run_simulated` does); `compute_dtype`, when
    given, casts floating sources first; `nproc`, when given, must equal the mesh size;
    `timeout_s` bounds every collective (gloo's timeout).
    """
    _torch()
    size = program.mesh.size
    if nproc is not None and nproc != size:
        raise ExecutionError(
            f"backend {BACKEND!r}: {nproc} processes requested but the mesh "
            f"{program.mesh.shape} has {size} ranks; they must be equal",
            backend=BACKEND,
            nproc=nproc,
            mesh_size=size,
        )
    per_rank = split_sources(program, sources, seed, compute_dtype)
    if under_torchrun():
        return _run_in_launched_group(program, per_rank, timeout_s)
    return _run_spawned(program, per_rank, timeout_s)


def split_sources(
    program: DistProgram, sources: Mapping[str, Array], seed: int, compute_dtype: str | None
) -> dict[int, RankBlocks]:
    """Every rank's source blocks, split exactly as `run_simulated` splits them."""
    rng = np.random.default_rng(seed)
    out: dict[int, RankBlocks] = {r: {} for r in program.mesh.ranks}
    for name, data in sources.items():
        full = np.asarray(data)
        if compute_dtype is not None and full.dtype.kind == "f":
            full = full.astype(compute_dtype)
        for r, block in distribute(full, program.specs[name], rng).items():
            out[r][name] = block
    return out


def _process_ranks(program: DistProgram) -> list[int]:
    """Mesh rank run by each process index (process i runs the i-th smallest rank)."""
    return sorted(program.mesh.ranks)


# --- launching ------------------------------------------------------------------------


def _run_spawned(program: DistProgram, per_rank: dict[int, RankBlocks], timeout_s: float) -> Blocks:
    """Spawn one process per rank; each writes its blocks to a file of a temporary dir."""
    ranks = _process_ranks(program)
    blocks: Blocks = {}
    for r, theirs in zip(ranks, _spawn(program, per_rank, timeout_s, None), strict=True):
        for name, block in theirs.items():
            blocks.setdefault(name, {})[r] = block
    return blocks


def _spawn(
    program: DistProgram,
    per_rank: dict[int, RankBlocks],
    timeout_s: float,
    timing: tuple[int, int] | None,
) -> list[Any]:
    """Spawn one process per rank; what each wrote back (its blocks, or its `RankTiming`
    when `timing` = (steps, warmup) is given), in process order."""
    torch, _ = _torch()
    ranks = _process_ranks(program)
    with tempfile.TemporaryDirectory(prefix="shardlab-torch-") as tmp:
        work = Path(tmp)
        _dump(work / "program.pkl", program)
        if timing is not None:
            _dump(work / "timing.pkl", timing)
        for p, r in enumerate(ranks):
            _dump(work / f"in{p}.pkl", per_rank[r])
        try:
            torch.multiprocessing.start_processes(
                _spawned_rank,
                args=(len(ranks), str(work), timeout_s),
                nprocs=len(ranks),
                start_method=_start_method(),
            )
        except Exception as exc:  # a rank failed; its own error file says why
            raise _rank_failure(work, ranks, exc) from None
        return [_load(work / f"out{p}.pkl") for p in range(len(ranks))]


def _start_method() -> str:
    """The start method: "forkserver" where the platform has it, else "spawn".

    A forkserver imports torch and shardlab once and forks every rank of every run (a fresh
    interpreter per rank costs seconds). Either way each rank imports the caller's
    `__main__` module, as multiprocessing does: a calling script needs an
    `if __name__ == "__main__"` guard.
    """
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return "spawn"
    # not this module itself: under `python -m` a child runs it again as `__mp_main__`
    preload = ["torch", "torch.distributed", "shardlab.program", "shardlab.runtime.sharded"]
    multiprocessing.get_context("forkserver").set_forkserver_preload(preload)
    return "forkserver"


def _spawned_rank(proc: int, nproc: int, work: str, timeout_s: float) -> None:
    """Body of one rank's process: join the group, run the rank, write its blocks, and
    leave at once (`os._exit`: an interpreter holding torch takes seconds to tear down, and
    nothing is left to clean up)."""
    _, dist = _torch()
    where = Path(work)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{where / 'store'}",
        rank=proc,
        world_size=nproc,
        timeout=timedelta(seconds=timeout_s),
    )
    try:
        program: DistProgram = _load(where / "program.pkl")
        me, sources = _process_ranks(program)[proc], _load(where / f"in{proc}.pkl")
        timing = where / "timing.pkl"
        if timing.exists():
            steps, warmup = _load(timing)
            _dump(where / f"out{proc}.pkl", time_rank(program, me, sources, steps, warmup))
        else:
            _dump(where / f"out{proc}.pkl", run_rank(program, me, sources))
    except ShardlabError as exc:
        (where / f"error{proc}.txt").write_text(exc.message)
        raise
    finally:
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _rank_failure(work: Path, ranks: Sequence[int], exc: Exception) -> ExecutionError:
    """An ExecutionError naming the backend and the first rank that reported an error."""
    for p, r in enumerate(ranks):
        note = work / f"error{p}.txt"
        if note.exists():
            return ExecutionError(
                f"backend {BACKEND!r}, rank {r}: {note.read_text()}", backend=BACKEND, rank=r
            )
    last = str(exc).strip().splitlines()[-1:] or [type(exc).__name__]
    return ExecutionError(
        f"backend {BACKEND!r}: a rank process failed: {last[0]} (each rank imports the "
        'calling script: does it run under an `if __name__ == "__main__"` guard?)',
        backend=BACKEND,
    )


def _run_in_launched_group(
    program: DistProgram, per_rank: dict[int, RankBlocks], timeout_s: float
) -> Blocks:
    """This process is one rank of a launched job: run it, then share every rank's blocks."""
    _, dist = _torch()
    if not dist.is_initialized():
        dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
    ranks = _process_ranks(program)
    world = dist.get_world_size()
    if world != len(ranks):
        raise ExecutionError(
            f"backend {BACKEND!r}: the launcher started {world} processes but the mesh "
            f"{program.mesh.shape} has {len(ranks)} ranks; they must be equal",
            backend=BACKEND,
            nproc=world,
            mesh_size=len(ranks),
        )
    me = ranks[dist.get_rank()]
    mine = run_rank(program, me, per_rank[me])
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, mine)
    blocks: Blocks = {}
    for r, theirs in zip(ranks, gathered, strict=True):
        for name, block in theirs.items():
            blocks.setdefault(name, {})[r] = block
    return blocks


def _dump(path: Path, obj: object) -> None:
    with path.open("wb") as f:
        pickle.dump(obj, f, protocol=pickle.HIGHEST_PROTOCOL)


def _load(path: Path) -> Any:
    with path.open("rb") as f:
        return pickle.load(f)


# --- one rank -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Group:
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


def _make_groups(program: DistProgram, me: int) -> dict[tuple[str, ...], _Group]:
    """This rank's group for every non-empty subset of mesh axes; every rank creates every
    torch group, in the same order (torch.distributed requires it)."""
    _, dist = _torch()
    mesh = program.mesh
    proc = {r: p for p, r in enumerate(_process_ranks(program))}
    names = mesh.axis_names
    mine: dict[tuple[str, ...], _Group] = {}
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
                    mine[axes] = _Group(group, group.index(me), pg, _torch_order(group, proc))
    return mine


def _torch_order(group: tuple[int, ...], proc: Mapping[int, int]) -> tuple[int, ...]:
    """Per torch group rank, the mesh position it holds (torch sorts by process index)."""
    return tuple(sorted(range(len(group)), key=lambda i: proc[group[i]]))


def run_rank(program: DistProgram, me: int, sources: RankBlocks) -> RankBlocks:
    """Run mesh rank `me`'s program in this process (the process group is joined): every
    value's block on this rank."""
    return _RankRun(program, me, dict(sources)).run()


@dataclass(frozen=True, slots=True)
class RankTiming:
    """One rank's timed steps (nanoseconds, relative to the rank's barrier exit).

    `spans`: op name -> (start, end) in the kept step whose wall time is the median (one
    consistent schedule, for a trace); `durations`: op name -> median duration over the kept
    steps (at least 1 ns); `step_ns`: the wall time of every kept step.
    """

    rank: int
    spans: dict[str, tuple[int, int]]
    durations: dict[str, int]
    step_ns: list[int] = field(default_factory=list)

    @property
    def step_median_ns(self) -> float:
        return float(statistics.median(self.step_ns))


def time_rank(
    program: DistProgram, me: int, sources: RankBlocks, steps: int, warmup: int
) -> RankTiming:
    """Run rank `me`'s program `warmup + steps` times (a barrier before each) and time its
    ops; the warm-up steps are dropped."""
    _, dist = _torch()
    run = _RankRun(program, me, dict(sources))
    kept: list[tuple[int, dict[int, tuple[int, int]]]] = []
    for n in range(warmup + steps):
        run.blocks, run.pending, run.spans = dict(sources), {}, {}
        dist.barrier()
        run.t0 = time.perf_counter_ns()
        run.run()
        wall = time.perf_counter_ns() - run.t0
        if n >= warmup:
            kept.append((wall, run.spans))
    return _timing(program, me, kept)


def _timing(
    program: DistProgram, me: int, kept: list[tuple[int, dict[int, tuple[int, int]]]]
) -> RankTiming:
    """The median step's spans and every op's median duration over the kept steps."""
    walls = [w for w, _ in kept]
    median_step = sorted(range(len(kept)), key=lambda k: walls[k])[len(kept) // 2]
    names = [op.name for op in program.ops]
    spans = {names[i]: se for i, se in sorted(kept[median_step][1].items())}
    durations = {
        names[i]: max(1, int(statistics.median(s[i][1] - s[i][0] for _, s in kept)))
        for i in kept[0][1]
    }
    return RankTiming(me, spans, durations, walls)


def time_torchdist(
    program: DistProgram,
    sources: Mapping[str, Array],
    seed: int = 0,
    *,
    steps: int = 5,
    warmup: int = 1,
    compute_dtype: str | None = None,
    nproc: int | None = None,
    timeout_s: float = 300.0,
) -> dict[int, RankTiming]:
    """Every rank's timing of `steps` steps after `warmup` dropped ones, one process per rank
    (spawned; not under torchrun)."""
    _torch()
    if steps < 1 or warmup < 0:
        raise ExecutionError(
            f"timing needs steps >= 1 and warmup >= 0, got steps={steps} warmup={warmup}",
            steps=steps,
            warmup=warmup,
        )
    if nproc is not None and nproc != program.mesh.size:
        raise ExecutionError(
            f"backend {BACKEND!r}: {nproc} processes requested but the mesh "
            f"{program.mesh.shape} has {program.mesh.size} ranks; they must be equal",
            backend=BACKEND,
            nproc=nproc,
            mesh_size=program.mesh.size,
        )
    per_rank = split_sources(program, sources, seed, compute_dtype)
    got: list[RankTiming] = _spawn(program, per_rank, timeout_s, (steps, warmup))
    return {t.rank: t for t in got}


class _RankRun:
    """One rank's execution: its blocks, its groups, the collectives still in flight and,
    per op index, its (start, end) wall clock in ns since `t0`."""

    def __init__(self, program: DistProgram, me: int, blocks: RankBlocks) -> None:
        self.program = program
        self.me = me
        self.blocks = blocks
        self.groups = _make_groups(program, me)
        self.pending: dict[int, tuple[Any, Finish]] = {}
        self.t0 = time.perf_counter_ns()
        self.spans: dict[int, tuple[int, int]] = {}
        self.issued: dict[int, int] = {}

    def run(self) -> RankBlocks:
        ops = self.program.ops
        preds = hz.predecessors(ops)
        for i, op in enumerate(ops):
            begin = time.perf_counter_ns()
            for p in preds[i]:
                self.complete(p)
            start = begin if op.kind in hz.SYNC_KINDS else time.perf_counter_ns()
            self.issue(i, op)
            if i in self.pending:
                self.issued[i] = start
            else:
                self.spans[i] = (start - self.t0, time.perf_counter_ns() - self.t0)
        for i in list(self.pending):
            self.complete(i)
        return self.blocks

    def complete(self, i: int) -> None:
        """Wait for async op i (if still in flight) and make its outputs."""
        got = self.pending.pop(i, None)
        if got is None:
            return
        handle, finish = got
        if handle is not None:
            handle.wait()
        self._store(self.program.ops[i], finish())
        self.spans[i] = (self.issued.pop(i) - self.t0, time.perf_counter_ns() - self.t0)

    def issue(self, i: int, op: DistOp) -> None:
        if op.kind in hz.P2P_KINDS:
            raise ExecutionError(
                f"op {op.name!r}: {op.kind} does not run on backend {BACKEND!r} yet "
                "(pipeline stage programs)",
                op=op.name,
                backend=BACKEND,
            )
        if op.kind in hz.SYNC_KINDS:
            return
        if op.comm is None:
            self._store(op, self.compute(op))
            return
        handle, finish = self.communicate(op)
        if hz.is_async(op):
            self.pending[i] = (handle, finish)
            return
        if handle is not None:
            handle.wait()
        self._store(op, finish())

    def _store(self, op: DistOp, outs: Sequence[Array]) -> None:
        if len(outs) != len(op.outputs):
            raise ExecutionError(
                f"op {op.name!r} made {len(outs)} outputs, expected {len(op.outputs)}",
                op=op.name,
            )
        for v, x in zip(op.outputs, outs, strict=True):
            self.blocks[v] = np.asarray(x)

    def read(self, op: DistOp, v: str) -> Array:
        block = self.blocks.get(v)
        if block is None:
            raise ExecutionError(
                f"op {op.name!r} reads {v!r} on rank {self.me}, which no source or completed "
                "op has made",
                op=op.name,
                value=v,
                rank=self.me,
            )
        return block

    # compute ----------------------------------------------------------------------------

    def compute(self, op: DistOp) -> list[Array]:
        """The op's rule kernel on this rank's blocks; mid-op collectives go to torch."""
        p = self.program
        ctx = LocalContext(
            p.mesh,
            self.me,
            tuple(p.types[v] for v in op.inputs),
            tuple(p.types[v] for v in op.outputs),
            tuple(p.specs[v] for v in op.inputs),
            tuple(p.specs[v] for v in op.outputs),
        )
        xs = [self.read(op, v) for v in op.inputs]
        out = KERNELS[op.kernel](op.kind, xs, dict(op.attrs), ctx)
        if isinstance(out, list):
            return out
        reply: Array | None = None
        while True:
            try:
                request = next(out) if reply is None else out.send(reply)
            except StopIteration as stop:
                return list(stop.value)
            reply = self.reduce_request(request)

    def reduce_request(self, req: CollectiveRequest) -> Array:
        """A kernel's request reduced over its axes (a blocking all_reduce)."""
        axes = tuple(a for a in self.program.mesh.axis_names if a in req.axes)
        if not axes:
            return np.array(req.data, copy=True)
        handle, finish = _all_reduce([req.data], req.op, self.groups[axes])
        if handle is not None:
            handle.wait()
        return finish()[0]

    # communication ----------------------------------------------------------------------

    def communicate(self, op: DistOp) -> tuple[Any, Finish]:
        """Issue op's comm step on every input (async); its outputs come from the Finish."""
        step = op.comm
        assert step is not None
        if len(op.inputs) != len(op.outputs):
            raise ExecutionError(f"comm op {op.name!r} needs one output per input", op=op.name)
        xs = [self.read(op, v) for v in op.inputs]
        group = self.groups[(step.axis,)]
        if step.kind == "all_reduce":
            return _all_reduce(xs, partial_op(step.src, step), group)
        started = [_start_step(x, step, group) for x in xs]
        handles = [h for h, _ in started if h is not None]
        return _Handles(handles) if handles else None, lambda: [f()[0] for _, f in started]


class _Handles:
    """Several async handles waited as one."""

    def __init__(self, handles: list[Any]) -> None:
        self.handles = handles

    def wait(self) -> None:
        for h in self.handles:
            h.wait()


def _tensor(x: Array) -> Any:
    """A flat torch copy of a block (the copy stays untouched while a collective runs)."""
    torch, _ = _torch()
    return torch.from_numpy(np.array(x, copy=True).reshape(-1))


def _empty(n: int, like: Array) -> Any:
    torch, _ = _torch()
    return torch.from_numpy(np.empty(n, dtype=like.dtype))


def _start_step(x: Array, step: CommStep, g: _Group) -> tuple[Any, Finish]:
    """Issue one step on one block."""
    if step.kind == "all_gather":
        return _all_gather(x, shard_dim(step.src, step), g)
    if step.kind == "reduce_scatter":
        return _reduce_scatter(x, partial_op(step.src, step), shard_dim(step.dst, step), g)
    if step.kind == "all_to_all":
        return _all_to_all(x, shard_dim(step.src, step), shard_dim(step.dst, step), g)
    if step.kind == "local_slice":
        piece = np.split(x, g.n, axis=shard_dim(step.dst, step))[g.pos].copy()
        return None, lambda: [piece]
    if step.kind == "local_partial":
        made = _local_partial(x, step, g)
        return None, lambda: [made]
    raise ExecutionError(f"unknown step kind {step.kind!r}", step=step.kind)


def _local_partial(x: Array, step: CommStep, g: _Group) -> Array:
    """R or S(d) -> P(op) on this rank, as `reshard_exec.apply_step` does it."""
    op = partial_op(step.dst, step)
    if isinstance(step.src, Shard):
        d = step.src.dim
        shape = list(x.shape)
        shape[d] *= g.n
        out = np.zeros(shape, dtype=x.dtype)
        where = [slice(None)] * x.ndim
        where[d] = slice(g.pos * x.shape[d], (g.pos + 1) * x.shape[d])
        out[tuple(where)] = x * g.n if op == "avg" else x
        return out
    return x.copy() if op != "sum" or g.pos == 0 else np.zeros_like(x)


def _torch_op(op: str) -> Any:
    _, dist = _torch()
    ops = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM}
    ops.update(max=dist.ReduceOp.MAX, min=dist.ReduceOp.MIN)
    if op not in ops:
        raise ExecutionError(f"backend {BACKEND!r}: no reduction {op!r}", backend=BACKEND)
    return ops[op]


def _all_reduce(xs: Sequence[Array], op: str, g: _Group) -> tuple[Any, Finish]:
    """One all_reduce of the flattened, concatenated blocks (a fused bucket in one call)."""
    _, dist = _torch()
    sizes = [x.size for x in xs]
    if g.pg is None:
        return None, lambda: [np.array(x, copy=True) for x in xs]
    buf = _tensor(np.concatenate([np.ravel(x) for x in xs]))
    handle = dist.all_reduce(buf, op=_torch_op(op), group=g.pg, async_op=True)

    def finish() -> list[Array]:
        flat = buf.numpy() / g.n if op == "avg" else buf.numpy()
        parts = np.split(flat, np.cumsum(sizes)[:-1])
        return [p.reshape(x.shape).astype(x.dtype) for p, x in zip(parts, xs, strict=True)]

    return handle, finish


def _gather_fn(dist: ModuleType, name: str, old: str) -> Any:
    """torch's newer name of a collective, or its older one."""
    return getattr(dist, name, None) or getattr(dist, old)


def _all_gather(x: Array, dim: int, g: _Group) -> tuple[Any, Finish]:
    _, dist = _torch()
    if g.pg is None:
        return None, lambda: [x.copy()]
    out = _empty(g.n * x.size, x)
    gather = _gather_fn(dist, "all_gather_single", "all_gather_into_tensor")
    handle = gather(out, _tensor(x), group=g.pg, async_op=True)

    def finish() -> list[Array]:
        got = out.numpy().reshape(g.n, *x.shape)
        by_pos = [got[g.mesh_pos.index(c)] for c in range(g.n)]
        return [np.concatenate(by_pos, axis=dim)]

    return handle, finish


def _reduce_scatter(x: Array, op: str, dim: int, g: _Group) -> tuple[Any, Finish]:
    _, dist = _torch()
    chunks = np.split(x, g.n, axis=dim)
    if g.pg is None:
        return None, lambda: [chunks[0].copy()]
    send = _tensor(np.concatenate([np.ravel(chunks[c]) for c in g.mesh_pos]))
    out = _empty(chunks[0].size, x)
    scatter = _gather_fn(dist, "reduce_scatter_single", "reduce_scatter_tensor")
    handle = scatter(out, send, op=_torch_op(op), group=g.pg, async_op=True)

    def finish() -> list[Array]:
        got = out.numpy().reshape(chunks[0].shape)
        return [got / g.n if op == "avg" else got]

    return handle, finish


def _all_to_all(x: Array, src_dim: int, dst_dim: int, g: _Group) -> tuple[Any, Finish]:
    """S(src_dim) -> S(dst_dim): chunk j of this block (along dst_dim) goes to position j;
    the chunks received are concatenated along src_dim in mesh order."""
    _, dist = _torch()
    chunks = np.split(x, g.n, axis=dst_dim)
    if g.pg is None:
        return None, lambda: [chunks[0].copy()]
    send = _tensor(np.concatenate([np.ravel(chunks[c]) for c in g.mesh_pos]))
    out = _empty(send.numel(), x)
    handle = dist.all_to_all_single(out, send, group=g.pg, async_op=True)

    def finish() -> list[Array]:
        got = out.numpy().reshape(g.n, *chunks[0].shape)
        by_pos = [got[g.mesh_pos.index(c)] for c in range(g.n)]
        return [np.concatenate(by_pos, axis=src_dim)]

    return handle, finish


# --- entry point ----------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m shardlab.runtime.torchdist PLAN.json`: verify a saved plan on real ranks
    (spawned, or this process's rank under torchrun); rank 0 prints the outcome."""
    parser = argparse.ArgumentParser(
        prog="python -m shardlab.runtime.torchdist",
        description="Verify a saved plan (shardlab plan ... --save) on torch.distributed ranks.",
    )
    parser.add_argument("plan", help="a plan file written by shardlab.plan.save_plan")
    parser.add_argument("--dtype", default="float64", help="compute dtype: float64 or float32")
    parser.add_argument("--seed", type=int, default=0, help="seed of the inputs and parameters")
    args = parser.parse_args(argv)
    from shardlab.plan import load_plan
    from shardlab.runtime.verify import verify

    launched = under_torchrun()
    try:
        report = verify(load_plan(args.plan), compute_dtype=args.dtype, seed=args.seed,
                        backend=BACKEND)  # fmt: skip
    except ShardlabError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    finally:
        if launched:
            _, dist = _torch()
            if dist.is_initialized():
                dist.destroy_process_group()
    if not launched or os.environ.get("RANK") == "0":
        status = "PASS" if report.ok else "FAIL"
        print(f"{status}: {report.summary.get('compared')} tensors compared in {args.dtype}")
        if report.first_divergence:
            print(f"first diverging op: {report.first_divergence}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
