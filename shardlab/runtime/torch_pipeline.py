"""Pipelines on the torch backend: one process per global rank, stages linked by send/recv.

What it is for: `runtime.pipeline_exec` runs a `PipelineProgram` on the simulated mesh in
one process; `run_pipeline_torch` runs the same stage programs with every rank of every
stage in its own process (gloo on CPU, NCCL on CUDA), so `shardlab verify --backend torch` checks a
pipeline as a framework would run it. It returns what `run_pipeline_blocks` returns (every
stage's blocks on its ranks), so the comparison with one device is shared.

Ranks: stage s runs on `pipeline.mesh.submesh(axis, s)`, whose ranks are global mesh
ranks; process p runs the p-th smallest global rank (`torch_rank.process_ranks`), i.e. the
stage that holds it, at its position in that stage's rank list. Each process runs its
stage's program in program order (`torch_rank.RankRun`, on the run's device;
`execution_order` restricted to a stage is its program order); collectives inside a stage
run over torch groups of that stage's ranks (every stage's groups are created on every
rank, in stage order).

Stage to stage (`StageLink`): a `send` to stage b goes to the rank at the same position
(the same coordinates on the non-pipeline axes) of stage b, as the simulated run hands
blocks over; a `recv` takes it from that rank of the sending stage. A transfer is a header
(dtype and shape, `HEADER` int64s) and the flat data, on the device, on the default group,
with tags
from the transfer's `p2p_key` (every key numbered in one sorted order on every rank), so a
stage may receive in another order than its peer sent. Sends are `dist.isend` of a copy
(the block may be overwritten at once) and are waited at the end of the step, not at the
next op of their stream or a `wait` naming them: a gloo send completes only once its peer
has posted the recv, so two stages that each wait for their send before their next recv
would deadlock. A recv is a blocking `dist.recv`: its outputs are ready when
the op returns. Feeds (micro-batches, parameters, state) are split in the calling process
exactly as the simulated run splits them (`pipeline_exec.stage_feeds`).

Timing (`time_pipeline_torch`, for `runtime.measure_pipeline`): every rank runs its stage
program `warmup + steps` times, a barrier before each step, and returns its `RankTiming`
(`torch_rank.time_steps`): a step's wall time ends once the rank's sends have completed,
and a recv's span includes waiting for its peer (the schedule's bubble).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardlab.errors import ExecutionError
from shardlab.ops.base import Array
from shardlab.passes.pipeline import PipelineProgram
from shardlab.passes.pipeline_schedule import Key, p2p_key
from shardlab.program import DistOp, DistProgram
from shardlab.runtime.torch_comm import make_groups
from shardlab.runtime.torch_device import RankDevice
from shardlab.runtime.torch_launch import BACKEND, run_job, spawn, torch_modules
from shardlab.runtime.torch_rank import (
    RankBlocks,
    RankRun,
    RankTiming,
    check_timing,
    host_blocks,
    process_ranks,
    time_steps,
)

Blocks = dict[str, dict[int, Array]]
#: The most dimensions a transferred block may have.
MAX_NDIM = 16
#: A transfer's header: dtype code, ndim, the shape padded to MAX_NDIM.
HEADER = 2 + MAX_NDIM
#: The dtypes a transfer may carry, by code.
DTYPES = (
    "float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint8", "bool",
    "bfloat16",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class StagePlan:
    """What every rank's process gets: the stage programs, the tag of every transfer (its
    number in the sorted order of every send's `p2p_key`) and the device the ranks run on."""

    stages: tuple[DistProgram, ...]
    tags: dict[Key, int]
    device: RankDevice = field(default_factory=RankDevice)

    @classmethod
    def of(cls, pipeline: PipelineProgram, device: RankDevice | None = None) -> StagePlan:
        keys = sorted(
            p2p_key(s, op)
            for s, program in enumerate(pipeline.stages)
            for op in program.ops
            if op.kind == "send"
        )
        tags = {key: k for k, key in enumerate(keys)}
        return cls(tuple(pipeline.stages), tags, device or RankDevice())

    def ranks(self) -> list[int]:
        """Every global rank, in process order."""
        return process_ranks([r for program in self.stages for r in program.mesh.ranks])

    def stage_of(self, rank: int) -> int:
        return next(s for s, p in enumerate(self.stages) if rank in p.mesh.ranks)


def run_pipeline_torch(
    pipeline: PipelineProgram,
    sources: Mapping[str, Array],
    seed: int = 0,
    *,
    nproc: int | None = None,
    timeout_s: float = 300.0,
    device: RankDevice | None = None,
) -> list[Blocks]:
    """Every stage's blocks of every value it holds after the step, one process per rank
    (the contract of `pipeline_exec.run_pipeline_blocks`); `nproc`, when given, must equal
    the mesh size; `timeout_s` bounds every transfer and collective; `device`: where the
    ranks run (default CPU, compute precision)."""
    plan, ranks, inputs = _rank_inputs(pipeline, sources, seed, nproc, device)
    blocks: list[Blocks] = [{} for _ in pipeline.stages]
    got = run_job(stage_job, plan, inputs, timeout_s, ranks, plan.device)
    for r, theirs in zip(ranks, got, strict=True):
        for name, block in theirs.items():
            blocks[plan.stage_of(r)].setdefault(name, {})[r] = block
    return blocks


def time_pipeline_torch(
    pipeline: PipelineProgram,
    sources: Mapping[str, Array],
    seed: int = 0,
    *,
    steps: int = 5,
    warmup: int = 1,
    nproc: int | None = None,
    timeout_s: float = 300.0,
    device: RankDevice | None = None,
) -> dict[int, RankTiming]:
    """Every rank's timing of its stage program over `steps` pipelined steps after `warmup`
    dropped ones (`torch_rank.time_steps`: a barrier before each step; a step ends when the
    rank's sends have completed; a recv's span includes waiting for its peer). Spawned, one
    process per rank, never under torchrun."""
    check_timing(steps, warmup)
    plan, ranks, inputs = _rank_inputs(pipeline, sources, seed, nproc, device)
    got: list[RankTiming] = spawn(time_stage_job, (plan, steps, warmup), inputs, timeout_s,
                                  ranks, plan.device)  # fmt: skip
    return {t.rank: t for t in got}


def _rank_inputs(
    pipeline: PipelineProgram,
    sources: Mapping[str, Array],
    seed: int,
    nproc: int | None,
    device: RankDevice | None,
) -> tuple[StagePlan, list[int], list[RankBlocks]]:
    """The stage plan, the global rank of every process and its fed blocks."""
    from shardlab.runtime.pipeline_exec import stage_feeds  # it imports runtime.verify

    torch_modules()
    plan = StagePlan.of(pipeline, device)
    ranks = plan.ranks()
    if nproc is not None and nproc != len(ranks):
        raise ExecutionError(
            f"backend {BACKEND!r}: {nproc} processes requested but the pipeline's mesh "
            f"{pipeline.mesh.shape} has {len(ranks)} ranks; they must be equal",
            backend=BACKEND,
            nproc=nproc,
            mesh_size=len(ranks),
        )
    feeds = stage_feeds(pipeline, sources, seed)
    inputs = []
    for r in ranks:
        fed = feeds[plan.stage_of(r)]
        inputs.append({name: held[r] for name, held in fed.items()})
    return plan, ranks, inputs


def _stage_run(proc: int, plan: StagePlan, mine: RankBlocks) -> tuple[RankRun, StageLink]:
    """Process `proc`'s run of its rank's stage program and its link to the other stages."""
    ranks = plan.ranks()
    me = ranks[proc]
    stage = plan.stage_of(me)
    groups = make_groups([p.mesh for p in plan.stages], {r: p for p, r in enumerate(ranks)}, me)
    link = StageLink(plan, stage, me)
    return RankRun(plan.stages[stage], me, mine, groups, link, plan.device), link


def stage_job(proc: int, plan: StagePlan, mine: RankBlocks) -> RankBlocks:
    """A launched process's job (`torch_launch.Job`): run its rank's stage program, with
    transfers to and from the other stages; every value's block on the rank."""
    run, link = _stage_run(proc, plan, mine)
    blocks = run.run()
    link.finish()
    return host_blocks(blocks)


def time_stage_job(proc: int, common: tuple[StagePlan, int, int], mine: RankBlocks) -> RankTiming:
    """A spawned process's job: its rank's stage program timed over (steps, warmup) steps."""
    plan, steps, warmup = common
    run, link = _stage_run(proc, plan, mine)
    return time_steps(run, steps, warmup, end_step=link.finish)


class StageLink:
    """One rank's transfers to and from the other stages (`torch_rank.PointToPoint`)."""

    def __init__(self, plan: StagePlan, stage: int, me: int) -> None:
        self.plan = plan
        self.stage = stage
        self.pos = plan.stages[stage].mesh.ranks.index(me)
        self.proc = {r: p for p, r in enumerate(plan.ranks())}
        #: sends in flight: their handles and the tensors they read
        self.in_flight: list[tuple[Any, Any]] = []
        self.where = plan.device.current()

    def peer(self, op: DistOp) -> int:
        """The process of this rank's counterpart on the op's peer stage."""
        peer = int(op.attrs["peer_stage"])
        return self.proc[self.plan.stages[peer].mesh.ranks[self.pos]]

    def tag(self, op: DistOp) -> int:
        key = p2p_key(self.stage, op)
        if key not in self.plan.tags:
            raise ExecutionError(
                f"{op.kind} {op.name!r} on stage {self.stage} has no matching send (key {key})",
                op=op.name,
                backend=BACKEND,
            )
        return 2 * self.plan.tags[key]

    def send(self, op: DistOp, block: Any) -> None:
        """Start sending tensor `block`: its header, then a flat copy of its data."""
        torch, dist = torch_modules()
        dst, tag = self.peer(op), self.tag(op)
        header = torch.from_numpy(_header(op, block)).to(self.where)
        self.in_flight.append((dist.isend(header, dst, tag=tag), header))
        if block.numel():
            flat = block.reshape(-1).clone()
            self.in_flight.append((dist.isend(flat, dst, tag=tag + 1), flat))

    def recv(self, op: DistOp) -> Any:
        """The tensor a peer sent: its header first, then its data (blocking)."""
        torch, dist = torch_modules()
        src, tag = self.peer(op), self.tag(op)
        header = torch.zeros(HEADER, dtype=torch.int64, device=self.where)
        dist.recv(header, src, tag=tag)
        got = [int(h) for h in header.cpu()]
        dtype, ndim = getattr(torch, DTYPES[got[0]]), got[1]
        shape = tuple(got[2 : 2 + ndim])
        data = torch.empty(math.prod(shape), dtype=dtype, device=self.where)
        if data.numel():
            dist.recv(data, src, tag=tag + 1)
        return data.reshape(shape)

    def finish(self) -> None:
        """Wait for every send still in flight."""
        for handle, _ in self.in_flight:
            handle.wait()
        self.in_flight.clear()


def _header(op: DistOp, data: Any) -> Array:
    """The header of a transfer of tensor `data` (module doc)."""
    name = str(data.dtype).removeprefix("torch.")
    if name not in DTYPES or data.dim() > MAX_NDIM:
        raise ExecutionError(
            f"send {op.name!r}: backend {BACKEND!r} transfers blocks of up to {MAX_NDIM} "
            f"dims of {', '.join(DTYPES)}; got {name} with {data.dim()} dims",
            op=op.name,
            backend=BACKEND,
        )
    header = np.zeros(HEADER, dtype=np.int64)
    header[0], header[1] = DTYPES.index(name), data.dim()
    header[2 : 2 + data.dim()] = tuple(data.shape)
    return header
