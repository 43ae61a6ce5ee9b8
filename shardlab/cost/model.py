"""The cost of a lowered plan on a cluster: op times, a timeline, memory, MFU and tokens/s.

    compute ops -> `compute.program_op_times` (roofline or calibrated table)
    comm ops    -> `comm.step_time` on the links the group's ranks sit on
    timeline    -> `timeline.simulate` over ranks x streams (one rank per distinct role)
    memory      -> `memory.memory_profile` (liveness per rank)

Ranks are devices in mesh order: rank r sits on node `r // devices_per_node`. Two ranks have
the same role when, on every mesh axis, their groups spread over nodes the same way: then
every op takes the same time on both, so one of them stands for the other in the timeline.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from shardlab.cost.clusters import Cluster, check_mesh_fits
from shardlab.cost.comm import step_time
from shardlab.cost.compute import (
    CalibrationTable,
    OpTimeMemo,
    hardware_flops,
    model_flops,
    peak_for,
    program_op_times,
)
from shardlab.cost.memory import MemoryProfile, memory_profile
from shardlab.cost.timeline import Timeline, mfu, simulate, tokens_per_second
from shardlab.ir import Graph, ValueKind
from shardlab.mesh import Mesh
from shardlab.program import DistOp, DistProgram
from shardlab.reshard import CommStep


class StepFigures:
    """MFU, HFU and tokens/s of a predicted step: what the costs of a flat step (`PlanCost`)
    and of a pipelined one share."""

    cluster: Cluster
    model_flops: int  # 3 x the forward's FLOPs, all ranks together
    hardware_flops: int  # FLOPs executed (recomputation included), all ranks together
    tokens: int
    dtype: str  # the dtype whose peak the utilisations are measured against
    devices: int

    @property
    def step_time(self) -> float:
        raise NotImplementedError

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation: model FLOPs per second over the devices' peak."""
        peak = peak_for(self.cluster, self.dtype)
        return mfu(self.model_flops, self.step_time, self.devices, peak)

    @property
    def hfu(self) -> float:
        """Hardware FLOPs utilisation: executed FLOPs (recomputation included) over peak."""
        peak = peak_for(self.cluster, self.dtype)
        return mfu(self.hardware_flops, self.step_time, self.devices, peak)

    @property
    def tokens_per_second(self) -> float:
        return tokens_per_second(self.tokens, self.step_time)


@dataclass
class PlanCost(StepFigures):
    """What one training step of a program costs on a cluster.

    The memory profile is taken on first use (`memory`): the cost guard compares step times
    of the trials it declines, and only the kept program's memory is ever read."""

    cluster: Cluster
    op_times: dict[str, float]  # seconds per program op on rank 0's role
    timeline: Timeline
    profile: Callable[[], MemoryProfile]  # the program's memory profile, when asked
    model_flops: int  # model FLOPs of one training step, all ranks together (3 x forward)
    tokens: int  # tokens per step (global batch x sequence)
    dtype: str  # the dtype whose peak MFU is measured against
    devices: int  # ranks of the mesh
    hardware_flops: int = 0  # FLOPs executed (recomputation included), all ranks together
    _memory: MemoryProfile | None = field(default=None, repr=False, compare=False)

    @property
    def memory(self) -> MemoryProfile:
        """Liveness of the program's buffers on its first rank (`cost.memory`)."""
        if self._memory is None:
            self._memory = self.profile()
        return self._memory

    @property
    def step_time(self) -> float:
        return self.timeline.step_time

    @property
    def peak_memory_bytes(self) -> int:
        """The largest memory one rank holds during the step."""
        return self.memory.peak_bytes

    def summary(self) -> dict[str, Any]:
        """Headline figures, JSON-ready."""
        rank = 0
        capacity = self.cluster.hbm_bytes
        return {
            "cluster": self.cluster.name,
            "step_time_s": self.step_time,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "tokens_per_s": self.tokens_per_second,
            "model_flops": self.model_flops,
            "hardware_flops": self.hardware_flops,
            "compute_s": self.timeline.compute_time(rank),
            "comm_s": self.timeline.comm_time(rank),
            "exposed_comm_s": self.timeline.exposed_comm(rank),
            "overlap_fraction": self.timeline.overlap_fraction(rank),
            "peak_memory_bytes": self.memory.peak_bytes,
            "memory_capacity_bytes": capacity,
            "fits": self.memory.peak_bytes <= capacity,
            "memory_breakdown_at_peak": dict(self.memory.breakdown_at_peak),
            "model_state_bytes": dict(self.memory.model_state),
        }


def tokens_per_step(graph: Graph) -> int:
    """Tokens one step processes: the elements of the integer input (token ids), else the
    leading dims of the first input (batch x sequence)."""
    inputs = graph.values_of_kind(ValueKind.INPUT)
    ids = [v for v in inputs if not v.type.is_float]
    source = ids[0] if ids else (inputs[0] if inputs else None)
    if source is None:
        return 0
    shape = source.type.shape
    return math.prod(shape if ids else shape[:-1] or shape)


def role_of_ranks(program: DistProgram, cluster: Cluster) -> dict[int, Hashable]:
    """Each rank's role: how its group on every mesh axis spreads over nodes."""
    cluster.node_of(max(program.mesh.ranks))  # a rank outside the cluster is named
    return dict(_roles(program.mesh, cluster.devices_per_node))


@functools.lru_cache(maxsize=256)
def _roles(mesh: Mesh, devices_per_node: int) -> tuple[tuple[int, Hashable], ...]:
    """`role_of_ranks` of a mesh (rank r on node r // devices_per_node), kept: the stages and
    passes of a plan, and the plans of a search, ask for the same meshes again and again.

    Each axis' groups are visited once (a group is a strided slice of the row-major layout)
    and their shape is given to all their members: O(devices x axes), not O(devices x group
    size), which made a dp=2^16 mesh take minutes."""
    per_axis = [_axis_roles(mesh, k, devices_per_node) for k in range(mesh.ndim)]
    if not per_axis:  # a mesh of no axes (one pipeline stage of a pp-only mesh): one role
        return tuple((rank, ()) for rank in mesh.ranks)
    return tuple(zip(mesh.ranks, zip(*per_axis, strict=True), strict=True))


def distinct_roles(mesh: Mesh, devices_per_node: int) -> int:
    """How many roles the ranks of `mesh` have on nodes of `devices_per_node` devices."""
    return len(roles_of(mesh, devices_per_node))


@functools.lru_cache(maxsize=256)
def roles_of(mesh: Mesh, devices_per_node: int) -> frozenset[Hashable]:
    """The roles the ranks of `mesh` have on nodes of `devices_per_node` devices."""
    return frozenset(role for _, role in _roles(mesh, devices_per_node))


#: How one group spreads over nodes: sorted (ranks on a node, nodes holding that many).
Spread = tuple[tuple[int, int], ...]


def _axis_roles(mesh: Mesh, axis: int, devices_per_node: int) -> list[Spread]:
    """Per mesh position: how the group along `axis` holding it spreads over nodes, as
    sorted (ranks on a node, nodes holding that many) pairs: `((8, 8192),)` for a group of
    8192 full nodes of 8 (short, so hashing a role stays cheap however large the group)."""
    nodes = [rank // devices_per_node for rank in mesh.ranks]
    size = mesh.shape[axis]
    stride = math.prod(mesh.shape[axis + 1 :])
    block = stride * size
    shapes: list[Spread] = [()] * len(nodes)
    for base in range(0, len(nodes), block):
        for start in range(base, base + stride):
            members = slice(start, start + block, stride)
            shape = tuple(sorted(Counter(Counter(nodes[members]).values()).items()))
            shapes[members] = [shape] * size
    return shapes


def cost_program(
    program: DistProgram,
    training: Graph,
    cluster: Cluster,
    table: CalibrationTable | None = None,
    memo: OpTimeMemo | None = None,
) -> PlanCost:
    """Time, memory and throughput of one step of `program` (lowered from `training`);
    `memo` carries op times between programs that share ops (`compute.program_op_times`)."""
    check_mesh_fits(program.mesh, cluster)
    compute = program_op_times(program, cluster, table, memo)
    roles = role_of_ranks(program, cluster)
    mesh = program.mesh

    groups: dict[tuple[int, str], tuple[int, ...]] = {}
    #: keyed by the step and its group's first rank (a group of 2^20 ranks is slow to hash)
    comm_times: dict[tuple[CommStep, int], float] = {}

    def durations(op: DistOp, rank: int) -> float:
        if op.comm is None:
            return compute[op.name]
        where = (rank, op.comm.axis)
        group = groups.get(where)
        if group is None:
            group = groups[where] = mesh.group_of(rank, op.comm.axis)
        key = (op.comm, group[0])
        seconds = comm_times.get(key)
        if seconds is None:  # each layer repeats the same collectives: priced once
            seconds = comm_times[key] = step_time(op.comm, group, cluster)
        return seconds

    timeline = simulate(
        program, durations, overlap_slowdown=cluster.overlap_slowdown, role_of=roles.__getitem__
    )
    op_times = {e.name: e.duration for e in timeline.events_of(mesh.ranks[0])}
    facts = training_facts(training)
    return PlanCost(
        cluster=cluster,
        op_times=op_times,
        timeline=timeline,
        profile=functools.partial(memory_profile, program, training),
        model_flops=facts.model_flops,
        tokens=facts.tokens,
        dtype=facts.dtype,
        devices=mesh.size,
        hardware_flops=facts.hardware_flops,
    )


@dataclass(frozen=True)
class TrainingFacts:
    """What every costing of one training graph shares: FLOPs, tokens and main dtype."""

    model_flops: int
    hardware_flops: int
    tokens: int
    dtype: str


def training_facts(training: Graph) -> TrainingFacts:
    """The graph's `TrainingFacts`, counted once and kept on the graph (a plan's stages
    are costed several times over the same training graph)."""
    known = training.__dict__.get("_training_facts")
    if isinstance(known, TrainingFacts):
        return known
    dtypes = Counter(training.type_of(v).dtype for op in training.ops for v in op.outputs)
    floats = [d for d, _ in dtypes.most_common() if d.startswith(("float", "bfloat"))]
    facts = TrainingFacts(
        model_flops(training),
        hardware_flops(training),
        tokens_per_step(training),
        floats[0] if floats else "float32",
    )
    training.__dict__["_training_facts"] = facts
    return facts
