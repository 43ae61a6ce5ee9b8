"""Sharding propagation: per-op SPMD rules, the replicated fallback, and completion."""

from shardlab.spmd import rules  # noqa: F401  (attaches every rule to the op catalog)
from shardlab.spmd.complete import CompletedGraph, complete
from shardlab.spmd.engine import infer, rule_for
from shardlab.spmd.result import AxisChoice, InnerComm, RuleContext, RuleResult

__all__ = [
    "AxisChoice",
    "CompletedGraph",
    "InnerComm",
    "RuleContext",
    "RuleResult",
    "complete",
    "infer",
    "rule_for",
]
