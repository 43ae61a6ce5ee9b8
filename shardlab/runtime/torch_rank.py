"""One rank of the torch backend: run (or time) a rank's program in this process.

What it is for: every process of the torch backend (`runtime.torchdist`,
`runtime.torch_pipeline`) runs one mesh rank's ops in program order; this module is that
run, with the process group already joined (`runtime.torch_launch`).

- blocks are torch tensors on the rank's device (`runtime.torch_device.RankDevice`: CPU or
  CUDA, in the verification's compute dtype or the graph's own mixed precision), from the
  sources the rank is given (numpy, loaded once) to the blocks it hands back (numpy again,
  `host_blocks`). Under precision "graph" every float output is stored in its declared
  dtype (a bfloat16 activation, a float32 master weight), as a mixed-precision framework
  keeps them;
- compute ops whose rule asks for the `default` kernel (the op's own implementation on the
  local blocks), `reshape_local` or `shape_attr_local` (the same with a local `shape`) run
  as torch ops when their kind has one (`runtime.torch_ops.TORCH_IMPLS`, on the device);
  so do the rank-aware kernels that have a torch version (`runtime.torch_kernels`: the
  vocab-parallel embedding and loss, the offset attentions, dropout by global index,
  `global_mean`, `replicated` without Partial outputs). The others (`opaque`, a
  `replicated` kind with a Partial output) run their rule's numpy kernel
  (`runtime.kernels`) on host copies of the blocks. A kernel's mid-op `CollectiveRequest`
  is a blocking `all_reduce` over the group of its axes: on the device for a torch
  kernel's tensor, through the host for a numpy kernel's array. Each run counts its compute
  ops by where they ran (`OpCounts`);
- comm steps on a mesh axis run over the rank's torch group along that axis
  (`runtime.torch_comm`);
- an async op (`hazards.is_async`: any op on a `comm:*` stream) is issued with
  `async_op=True`; its handle is waited, and its outputs made, before the first op that
  names it as a happens-before predecessor (a dep, the next op on its stream) is issued,
  and at the end; `wait`, `hold` and `free` do nothing else;
- `send` / `recv` (pipeline stage programs) go to the run's `PointToPoint`
  (`runtime.torch_pipeline`); a program run without one refuses them (ExecutionError).

Timing (`time_rank` for `runtime.measure`; `time_steps` for any prepared run, e.g. a
pipeline stage's, whose sends are waited inside its step): the program runs
`warmup + steps` times on the same sources, a `dist.barrier()` before each; the wall clock
(`time.perf_counter_ns`) is read around each op, relative to the rank's own barrier exit
(on CUDA after the device's current stream has finished the op: kernels run
asynchronously).
A sync op's span is its issue to its outputs stored (a `recv`'s includes waiting for its
peer's send: a pipeline's bubble); an async collective's is its issue to its wait's
completion; a `wait` / `hold` / `free` op's span includes completing its predecessors
(where the rank blocks). The warm-up steps are dropped (`RankTiming`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import numpy as np

from shardlab.errors import ExecutionError
from shardlab.ops.base import Array
from shardlab.placement import Shard, group_sizes
from shardlab.program import DistOp, DistProgram
from shardlab.reshard import CommStep
from shardlab.runtime import hazards as hz
from shardlab.runtime.kernels import KERNELS, CollectiveRequest, LocalContext
from shardlab.runtime.torch_comm import (
    Finish,
    Group,
    Sizes,
    all_reduce,
    make_groups,
    reduce_array,
    start_step,
)
from shardlab.runtime.torch_device import RankDevice, to_device, to_host
from shardlab.runtime.torch_kernels import drive, local_attrs, torch_kernel, widen
from shardlab.runtime.torch_launch import BACKEND, torch_modules

#: One rank's blocks as they travel between processes: value name -> array.
RankBlocks = dict[str, Array]
#: One rank's blocks while it runs: value name -> tensor on the rank's device.
Tensors = dict[str, Any]


class PointToPoint(Protocol):
    """Where a rank's `send` and `recv` ops go (a pipeline's stage-to-stage transfers)."""

    def send(self, op: DistOp, block: Any) -> None:
        """Start sending tensor `block`, the input of send op `op` (it may complete later)."""

    def recv(self, op: DistOp) -> Any:
        """The tensor recv op `op` receives (blocks until it has arrived)."""


#: A kind's torch implementation on tensors (`runtime.torch_ops.run_tensors`).
TorchRunner = Callable[[Sequence[Any], Mapping[str, Any]], list[Any]]


def _torch_impls() -> dict[str, TorchRunner]:
    """Every kind that runs as a torch op, as a function of tensors (imports torch)."""
    from shardlab.runtime import torch_ops

    return {kind: partial(torch_ops.run_tensors, kind) for kind in torch_ops.TORCH_IMPLS}


def host_blocks(blocks: Tensors) -> RankBlocks:
    """A rank's tensors as numpy blocks for the calling process (`torch_device.to_host`)."""
    return {name: to_host(t) for name, t in blocks.items()}


def process_ranks(ranks: Sequence[int]) -> list[int]:
    """Mesh rank run by each process index (process i runs the i-th smallest rank)."""
    return sorted(ranks)


@dataclass(slots=True)
class OpCounts:
    """A rank's compute ops by where they ran: `torch` ops, and per op label (the kind, or
    `kind/kernel` for a rule's own kernel) the ops that ran the numpy kernel."""

    torch: int = 0
    numpy: dict[str, int] = field(default_factory=dict)

    def add_numpy(self, op: DistOp) -> None:
        label = op.kind if op.kernel == "default" else f"{op.kind}/{op.kernel}"
        self.numpy[label] = self.numpy.get(label, 0) + 1


def run_rank(
    program: DistProgram, me: int, sources: RankBlocks, device: RankDevice | None = None
) -> RankBlocks:
    """Run mesh rank `me`'s program in this process (the process group is joined) on
    `device` (default: CPU, compute precision): every value's block on this rank."""
    return run_rank_counted(program, me, sources, device)[0]


def run_rank_counted(
    program: DistProgram, me: int, sources: RankBlocks, device: RankDevice | None = None
) -> tuple[RankBlocks, OpCounts]:
    """`run_rank`, and where its compute ops ran."""
    run = RankRun(program, me, sources, _flat_groups(program, me), device=device)
    return host_blocks(run.run()), run.counts


def _flat_groups(program: DistProgram, me: int) -> dict[tuple[str, ...], Group]:
    """Rank `me`'s groups when one process runs each rank of `program`'s mesh."""
    proc = {r: p for p, r in enumerate(process_ranks(program.mesh.ranks))}
    return make_groups([program.mesh], proc, me)


def flat_job(
    proc: int,
    common: tuple[DistProgram, tuple[int, int] | None, RankDevice],
    mine: RankBlocks,
) -> Any:
    """A launched process's job (`torch_launch.Job`) for one rank of a flat program on a
    device: its blocks and `OpCounts`, or its `RankTiming` when `common` holds (steps,
    warmup)."""
    program, timing, device = common
    me = process_ranks(program.mesh.ranks)[proc]
    if timing is None:
        return run_rank_counted(program, me, mine, device)
    return time_rank(program, me, mine, *timing, device=device)


@dataclass(frozen=True, slots=True)
class RankTiming:
    """One rank's timed steps (nanoseconds, relative to the rank's barrier exit).

    `spans`: op name -> (start, end) in one kept step, the same on every rank: the one
    whose slowest rank's wall time is the median (one consistent schedule, for a trace);
    `t0_ns`: that step's start on this rank's `time.perf_counter_ns` clock (the ranks of one
    host share it, so their spans line up); `durations`: op name -> median duration over
    the kept steps (at least 1 ns); `step_ns`: the wall time of every kept step;
    `compute_ns`: the summed spans of its compute ops (not comm, transfer or sync) in every
    kept step.
    """

    rank: int
    spans: dict[str, tuple[int, int]]
    durations: dict[str, int]
    step_ns: list[int] = field(default_factory=list)
    t0_ns: int = 0
    compute_ns: list[int] = field(default_factory=list)

    @property
    def step_median_ns(self) -> float:
        return float(statistics.median(self.step_ns))


def time_rank(
    program: DistProgram,
    me: int,
    sources: RankBlocks,
    steps: int,
    warmup: int,
    device: RankDevice | None = None,
) -> RankTiming:
    """Run rank `me`'s program `warmup + steps` times (a barrier before each) and time its
    ops; the warm-up steps are dropped."""
    run = RankRun(program, me, sources, _flat_groups(program, me), device=device)
    return time_steps(run, steps, warmup)


def time_steps(
    run: RankRun,
    steps: int,
    warmup: int,
    end_step: Callable[[], None] | None = None,
) -> RankTiming:
    """Time `run` (a rank's program, its groups joined) for `warmup + steps` steps, each from
    its sources, after a barrier; `end_step`, when given, ends every step inside its wall
    time (a pipeline rank waits for its sends). The warm-up steps are dropped."""
    torch, dist = torch_modules()
    kept: list[tuple[int, dict[int, tuple[int, int]]]] = []
    starts: list[int] = []
    compute = [i for i, op in enumerate(run.program.ops) if hz.is_compute(op)]
    computed: list[int] = []
    for n in range(warmup + steps):
        run.blocks, run.pending, run.spans, run.issued = dict(run.sources), {}, {}, {}
        run.device.synchronize()
        dist.barrier()
        run.t0 = time.perf_counter_ns()
        run.run()
        if end_step is not None:
            end_step()
        run.device.synchronize()
        wall = time.perf_counter_ns() - run.t0
        if n >= warmup:
            kept.append((wall, run.spans))
            starts.append(run.t0)
            computed.append(sum(run.spans[i][1] - run.spans[i][0] for i in compute
                                if i in run.spans))  # fmt: skip
    # every rank keeps the spans of the same step: the slowest rank's walls, agreed on
    slowest = torch.tensor([w for w, _ in kept], dtype=torch.int64, device=run.device.current())
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    walls = slowest.tolist()
    common = sorted(range(len(kept)), key=lambda k: walls[k])[len(kept) // 2]
    return _timing(run.program, run.me, kept, common, starts[common], computed)


def check_timing(steps: int, warmup: int) -> None:
    """Timing needs at least one kept step and no negative warm-up (ExecutionError)."""
    if steps < 1 or warmup < 0:
        raise ExecutionError(
            f"timing needs steps >= 1 and warmup >= 0, got steps={steps} warmup={warmup}",
            steps=steps,
            warmup=warmup,
        )


def _timing(
    program: DistProgram,
    me: int,
    kept: list[tuple[int, dict[int, tuple[int, int]]]],
    common: int,
    t0_ns: int,
    compute_ns: list[int],
) -> RankTiming:
    """Step `common`'s spans (started at `t0_ns`), every op's median duration over the
    kept steps and each kept step's summed compute spans."""
    walls = [w for w, _ in kept]
    names = [op.name for op in program.ops]
    spans = {names[i]: se for i, se in sorted(kept[common][1].items())}
    durations = {
        names[i]: max(1, int(statistics.median(s[i][1] - s[i][0] for _, s in kept)))
        for i in kept[0][1]
    }
    return RankTiming(me, spans, durations, walls, t0_ns, compute_ns)


class RankRun:
    """One rank's execution on its device: its sources and blocks (tensors), its groups, the
    collectives still in flight and, per op index, its (start, end) wall clock in ns since
    `t0`."""

    def __init__(
        self,
        program: DistProgram,
        me: int,
        sources: RankBlocks,
        groups: Mapping[tuple[str, ...], Group],
        p2p: PointToPoint | None = None,
        device: RankDevice | None = None,
    ) -> None:
        self.program = program
        self.me = me
        self.device = device or RankDevice()
        self.torch, _ = torch_modules()  # once, not per op
        self.where = self.device.current()  # the launcher bound this process's device
        #: the sources on the device, in the precision they run in (every step starts here)
        self.sources: Tensors = {
            name: to_device(block, self.where, self._run_dtype(name))
            for name, block in sources.items()
        }
        self.blocks: Tensors = dict(self.sources)
        self.groups = groups
        self.p2p = p2p
        self.pending: dict[int, tuple[Any, Finish]] = {}
        self.t0 = time.perf_counter_ns()
        self.spans: dict[int, tuple[int, int]] = {}
        self.issued: dict[int, int] = {}
        self.counts = OpCounts()
        self.torch_impls = _torch_impls()

    def _run_dtype(self, value: str) -> str | None:
        """The torch dtype a float value runs in on this rank (None: as it arrives)."""
        ttype = self.program.types.get(value)
        return None if ttype is None else self.device.run_dtype(ttype.dtype)

    def run(self) -> Tensors:
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
                self.device.synchronize()
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
        self.device.synchronize()
        self.spans[i] = (self.issued.pop(i) - self.t0, time.perf_counter_ns() - self.t0)

    def issue(self, i: int, op: DistOp) -> None:
        if op.kind in hz.P2P_KINDS:
            self._p2p(op)
            return
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

    def _p2p(self, op: DistOp) -> None:
        """A send starts (the `PointToPoint` completes it); a recv completes here."""
        if self.p2p is None:
            raise ExecutionError(
                f"op {op.name!r}: {op.kind} needs a pipeline's stage-to-stage transfers on "
                f"backend {BACKEND!r} (runtime.torch_pipeline); this is a flat program run",
                op=op.name,
                backend=BACKEND,
            )
        if op.kind == hz.SEND:
            self.p2p.send(op, self.read(op, op.inputs[0]))
        else:
            self._store(op, [self.p2p.recv(op)])

    def _store(self, op: DistOp, outs: Sequence[Any]) -> None:
        """Keep op's outputs (tensors, or a numpy kernel's arrays) as tensors on the device,
        each float in the dtype it runs in."""
        if len(outs) != len(op.outputs):
            raise ExecutionError(
                f"op {op.name!r} made {len(outs)} outputs, expected {len(op.outputs)}",
                op=op.name,
            )
        for v, x in zip(op.outputs, outs, strict=True):
            dtype = self._run_dtype(v)
            if not isinstance(x, self.torch.Tensor):
                self.blocks[v] = to_device(x, self.where, dtype)
            elif dtype is not None and x.is_floating_point():
                self.blocks[v] = x.to(getattr(self.torch, dtype))
            else:
                self.blocks[v] = x

    def read(self, op: DistOp, v: str) -> Any:
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

    def compute(self, op: DistOp) -> list[Any]:
        """The op as a torch op where it can run as one (`torch_form`), or its rule's torch
        kernel (`torch_kernels.torch_kernel`), else its rule's numpy kernel on host copies of
        this rank's blocks; mid-op collectives go to torch (`reduce_request`)."""
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
        form = self.torch_form(op, ctx)
        kernel = None if form is not None else torch_kernel(op.kind, op.kernel, ctx)
        if form is not None or kernel is not None:
            self.counts.torch += 1
            if form is not None:
                outs = self.torch_impls[form[0]](xs, form[1])
            else:
                assert kernel is not None
                outs = drive(kernel(op.kind, widen(xs), dict(op.attrs), ctx), self.reduce_request)
            # an op without inputs (fill, rope_cache) made its tensors on the CPU
            return outs if op.inputs else [y.to(self.where) for y in outs]
        self.counts.add_numpy(op)
        out = KERNELS[op.kernel](op.kind, [to_host(x) for x in xs], dict(op.attrs), ctx)
        return drive(out, self.reduce_request)

    def torch_form(self, op: DistOp, ctx: LocalContext) -> tuple[str, Mapping[str, Any]] | None:
        """(torch kind, attrs) that compute `op` on this rank's blocks, or None: the kind's
        own torch op for the `default` kernel; a reshape to the local shape for
        `reshape_local`, the kind's with its `shape` attr made local for `shape_attr_local`
        (`runtime.kernels`; `unpack`'s `block_shapes` made local, `torch_kernels.local_attrs`).
        Other kernels know where the rank's blocks sit (`torch_kernels`)."""
        if op.kernel == "reshape_local":
            return "reshape", {"shape": list(ctx.output_shape(0))}
        if op.kind not in self.torch_impls:
            return None
        if op.kernel == "default":
            return op.kind, local_attrs(op.kind, op.attrs, ctx)
        if op.kernel == "shape_attr_local":
            return op.kind, {**op.attrs, "shape": list(ctx.output_shape(0))}
        return None

    def reduce_request(self, req: CollectiveRequest) -> Any:
        """A kernel's request reduced over its axes (a blocking all_reduce): a torch
        kernel's tensor on the device, a numpy kernel's array through the host."""
        axes = tuple(a for a in self.program.mesh.axis_names if a in req.axes)
        data: Any = req.data
        if not isinstance(data, self.torch.Tensor):
            if not axes:
                return np.array(data, copy=True)
            return reduce_array(data, req.op, self.groups[axes], self.where)
        if not axes:
            return data.clone()
        handle, finish = all_reduce([data], req.op, self.groups[axes])
        if handle is not None:
            handle.wait()
        return finish()[0]

    def communicate(self, op: DistOp) -> tuple[Any, Finish]:
        """Issue op's comm step on every input (async); its outputs come from the Finish."""
        step = op.comm
        assert step is not None
        if len(op.inputs) != len(op.outputs):
            raise ExecutionError(f"comm op {op.name!r} needs one output per input", op=op.name)
        xs = [self.read(op, v) for v in op.inputs]
        return start_step(xs, step, self.groups[(step.axis,)], self.step_sizes(op, step))

    def step_sizes(self, op: DistOp, step: CommStep) -> list[Sizes]:
        """Per input, the group's block sizes along the dim `step` gathers or moves (uneven
        shards: a rank cannot see its peers' blocks); None where the step cuts no shard."""
        p = self.program
        k = p.mesh.axis_index(step.axis)
        if not isinstance(step.src, Shard):
            return [None] * len(op.inputs)
        return [
            group_sizes(p.types[v].shape, p.mesh, p.specs[v].placements, k, self.me)
            for v in op.inputs
        ]
