"""How long building a plan will take, estimated before it starts: the service refuses at once
a plan that could not be built within its job's deadline, rather than let it hold a worker.

The engine's work grows with the ops of the training graph (completion, lowering, every pass
and the cost of every stage), with the devices of the mesh (the cost model gives every rank
a role, and the plan's artifacts list every rank) and, when the ranks do not all have the
same role, with ops x devices: ranks of several roles that meet in collectives are then
simulated one by one (`cost.timeline`), and each collective waits for all of its group.

    seconds = BASE_S + SECONDS_PER_OP x ops + SECONDS_PER_DEVICE x devices
              [+ SECONDS_PER_OP_RANK x ops x devices^MIXED_EXPONENT  when roles are mixed]

Calibrated on one core of a 2-core machine (CPython 3.11), whole worker jobs: llama3-70b
(6819 training ops) on dp=8,tp=8 takes about 5 s; llama3-70b with dp=2^20 (one role) about
45 s, plus storing its 150 MB of artifacts; 4 layers of llama3-70b (359 ops) on dp=N,tp=2
with 3 devices a node (mixed roles) 4 s at N=64, 38 s at N=256, 263 s at N=1024. The
estimate is meant to tell minutes from days, not to predict seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shardlab.cost.model import distinct_roles
from shardlab.mesh import Mesh

BASE_S = 1.0
SECONDS_PER_OP = 1e-3
SECONDS_PER_DEVICE = 6e-5
SECONDS_PER_OP_RANK = 4.5e-5
MIXED_EXPONENT = 1.4
#: meshes up to this many devices get their roles counted exactly when the layout does not
#: show at once that every rank has the same role; larger ones are taken as mixed
EXACT_ROLES_UP_TO = 1 << 16


@dataclass(frozen=True, slots=True)
class Effort:
    """An estimate of a plan's build, and what it rests on."""

    seconds: float
    ops: int
    devices: int
    #: whether the ranks have several roles (then each rank is simulated)
    mixed_roles: bool

    def describe(self) -> str:
        """`about 1.2e+04 s (359 training ops on 4096 devices whose ranks ...)`."""
        why = f"{self.ops} training ops on {self.devices} devices"
        if self.mixed_roles:
            why += (
                " whose groups spread unevenly over the cluster's nodes, so every rank is simulated"
            )
        return f"about {self.seconds:.3g} s ({why})"


def plan_effort(ops: int, mesh: Mesh, devices_per_node: int | None) -> Effort:
    """The estimated build of a plan of `ops` training ops on `mesh`, costed on a cluster of
    `devices_per_node` devices a node (None: not costed, nothing is simulated)."""
    devices = mesh.size
    mixed = devices_per_node is not None and not same_role_everywhere(mesh, devices_per_node)
    seconds = BASE_S + SECONDS_PER_OP * ops + SECONDS_PER_DEVICE * devices
    if mixed:
        seconds += SECONDS_PER_OP_RANK * ops * devices**MIXED_EXPONENT
    return Effort(seconds, ops, devices, mixed)


def same_role_everywhere(mesh: Mesh, devices_per_node: int) -> bool:
    """Whether every rank of `mesh` (its default, row-major layout) has the same role in the
    cost model: on every axis, each group spreads over nodes alike. Shown from the layout
    when it can be; else counted (`cost.model.role_of_ranks`) up to `EXACT_ROLES_UP_TO`
    devices, and taken as False beyond."""
    if mesh.ranks == tuple(range(mesh.size)) and all(
        _axis_alike(mesh, k, devices_per_node) for k in range(mesh.ndim)
    ):
        return True
    if mesh.size > EXACT_ROLES_UP_TO:
        return False
    return distinct_roles(mesh, devices_per_node) == 1


def _axis_alike(mesh: Mesh, axis: int, per_node: int) -> bool:
    """Whether the groups along `axis` all spread over nodes alike, shown from the layout:
    single ranks; one group; or each group's span (stride x size) dividing a node; or its ranks a
    multiple of a node apart (one per node); or a node holding whole runs of it."""
    size = mesh.shape[axis]
    stride = math.prod(mesh.shape[axis + 1 :])
    span = stride * size
    return (
        size in (1, mesh.size)
        or per_node % span == 0
        or stride % per_node == 0
        or (per_node % stride == 0 and span % per_node == 0)
    )
