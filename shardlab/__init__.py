"""Shardlab: plan, cost and verify how a model is split across a device mesh."""

from shardlab.errors import ShardlabError
from shardlab.ir import Graph, Op, OpRole, TensorType, Value, ValueKind
from shardlab.mesh import Mesh
from shardlab.placement import DistSpec, Partial, Replicate, Shard

__version__ = "0.1.0"

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
