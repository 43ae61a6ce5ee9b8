"""Shardlab: plan, cost and verify how a model is split across a device mesh."""

from typing import Any

from shardlab.errors import ShardlabError
from shardlab.ir import Graph, Op, OpRole, TensorType, Value, ValueKind
from shardlab.mesh import Mesh
from shardlab.placement import DistSpec, Partial, Replicate, Shard

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """`shardlab.plan`, `shardlab.compare` and `shardlab.verify` are imported on first use
    (they pull in the whole pipeline). `shardlab.plan` is the module `shardlab/plan.py`,
    callable as `build_plan`."""
    if name == "verify":
        from shardlab.runtime.verify import verify

        return verify
    if name == "plan":
        import shardlab.plan

        return shardlab.plan
    if name == "compare":
        from shardlab.comparison import compare

        return compare
    raise AttributeError(f"module 'shardlab' has no attribute {name!r}")


__all__ = [
    "DistSpec",
    "Graph",
    "Mesh",
    "Op",
    "OpRole",
    "Partial",
    "Replicate",
    "Shard",
    "ShardlabError",
    "TensorType",
    "Value",
    "ValueKind",
    "__version__",
]
