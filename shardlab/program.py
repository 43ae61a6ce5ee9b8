"""The distributed program every rank runs: `DistProgram` of `DistOp`s.

A compute op runs its rule's local kernel on local blocks; a comm op is one `CommStep` of a
reshard on one mesh axis. Values carry global types and the DistSpec their blocks follow;
resharded versions of a value are new values named `<value>@<spec>`. Every comm op keeps the
reason it exists: the producer's placement, the consumer and the rule that asked for another
one, and its cost.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shardlab.ir import OpRole, TensorType
from shardlab.mesh import Mesh
from shardlab.placement import DistSpec
from shardlab.reshard import COLLECTIVES, CommStep


@dataclass(frozen=True, slots=True)
class DistOp:
    """One op of the distributed program (compute or communication)."""

    name: str
    kind: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    stream: str  # "compute" or "comm:<mesh axis>"
    role: OpRole
    scope: str = ""
    attrs: dict[str, Any] = field(default_factory=dict)
    kernel: str = "default"
    comm: CommStep | None = None
    reason: str = ""
    deps: tuple[str, ...] = ()

    @property
    def is_comm(self) -> bool:
        return self.comm is not None

    @property
    def is_collective(self) -> bool:
        return self.comm is not None and self.comm.kind in COLLECTIVES


@dataclass
class DistProgram:
    """Ops in program order, with every value's global type and DistSpec."""

    mesh: Mesh
    ops: list[DistOp]
    types: dict[str, TensorType]
    specs: dict[str, DistSpec]
    #: serial value name -> the program value holding it in its completed spec
    values: dict[str, str]

    def collectives(self) -> list[DistOp]:
        return [op for op in self.ops if op.is_collective]

    def comm_bytes_per_rank(self) -> float:
        return sum(op.comm.bytes_per_rank for op in self.ops if op.comm is not None)

    def summary(self) -> dict[str, Any]:
        by_kind: dict[str, int] = {}
        for op in self.collectives():
            assert op.comm is not None
            by_kind[op.comm.kind] = by_kind.get(op.comm.kind, 0) + 1
        return {
            "ops": len(self.ops),
            "compute_ops": sum(1 for op in self.ops if not op.is_comm),
            "comm_ops": sum(1 for op in self.ops if op.is_comm),
            "collectives": dict(sorted(by_kind.items())),
            "comm_bytes_per_rank": self.comm_bytes_per_rank(),
        }
