"""Explain a value's placement: the chain of decisions back to an annotation or a source.

`explain(completed, "layers.0.mlp.down_proj")` answers "why is this P(sum) on tp?": the
rule of the op that produced it (per mesh axis: which letter it sharded and which input
suggested it), then the same for the input that drove the decision, back to the annotation
or template that started it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from shardlab.errors import GraphError
from shardlab.spmd.complete import CompletedGraph, Decision

MAX_DEPTH = 12


@dataclass(frozen=True, slots=True)
class Step:
    """One link of an explanation: a value, its spec, and the decisions that set it."""

    value: str
    spec: str
    decisions: tuple[Decision, ...]
    next_value: str | None


def explain(completed: CompletedGraph, value: str) -> list[Step]:
    """The decision chain of `value`, most recent first."""
    graph = completed.graph
    if value not in graph.values:
        raise GraphError(f"graph {graph.name!r} has no value {value!r}", value=value)
    steps: list[Step] = []
    seen: set[str] = set()
    current: str | None = value
    while current is not None and current not in seen and len(steps) < MAX_DEPTH:
        seen.add(current)
        decisions = tuple(completed.decisions.get(current, ()))
        nxt = driving_input(completed, current)
        steps.append(Step(current, str(completed.specs[current]), decisions, nxt))
        current = nxt
    return steps


def driving_input(completed: CompletedGraph, value: str) -> str | None:
    """The input of `value`'s producer that drove most of its mesh-axis choices."""
    graph = completed.graph
    op = graph.producer(value)
    if op is None or not op.inputs:
        return None
    rule = completed.rules[op.name]
    votes = Counter(c.driver for c in rule.choices if c.driver is not None)
    if votes:
        index = votes.most_common(1)[0][0]
        return op.inputs[index]
    sharded = [i for i, spec in enumerate(completed.arriving[op.name]) if not spec.is_replicated()]
    return op.inputs[sharded[0] if sharded else 0]


def format_explanation(completed: CompletedGraph, value: str) -> str:
    """The chain as indented text, for the CLI."""
    lines = []
    for depth, step in enumerate(explain(completed, value)):
        pad = "  " * depth
        lines.append(f"{pad}{step.value}: {step.spec}")
        for d in step.decisions:
            where = f" [op {d.op}]" if d.op and d.source != "consumer" else ""
            lines.append(f"{pad}  - {d.source}{where}: {d.detail}")
        if step.next_value:
            lines.append(f"{pad}  because of input {step.next_value!r}:")
    reshards = [r for r in completed.reshards() if completed.graph.op(r[0]).inputs[r[1]] == value]
    for op_name, _, have, need in reshards:
        lines.append(f"note: op {op_name!r} needs {value!r} as {need}, it arrives as {have}")
    return "\n".join(lines)
