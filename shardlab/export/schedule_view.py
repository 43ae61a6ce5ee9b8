"""The schedule view of a pipelined plan: slots by stage, and the ops of one unit.

A pipelined plan's timeline is its schedule: every stage runs the forward and backward
units of its model chunks for every micro-batch, each a slot laid out by
`cost.pipeline_slots`. The view holds the slots columnar per stage (phase, model chunk,
micro-batch, start, end: 2 x micro-batches x chunks per stage, whatever the model's size)
and, once per distinct unit, the ops it runs with their simulated times (a representative
rank), which the UI shows when a slot is opened. Times are seconds, bytes per rank.
A tied weight's gradient all-reduce between stages (Megatron-LM's embedding group) is a
comm of every stage that holds the weight (`comms`: name, kind, stream, start, end, bytes
and the reason it runs), after that stage's last unit and before its tail.
"""

from __future__ import annotations

from typing import Any

from shardlab.cost.pipeline_slots import PipelineSlotCost

SCHEDULE_FORMAT = "shardlab.schedule/1"


def schedule_json(cost: PipelineSlotCost) -> dict[str, Any]:
    """The view of one pipelined step (module docstring)."""
    stages = []
    for stage, slots in zip(cost.stages, cost.slots(), strict=True):
        stages.append({
            "stage": stage.stage,
            "ranks": list(stage.ranks),
            "layers": list(stage.layers),
            "chunks": list(stage.chunks),
            "busy_s": stage.busy_s,
            "end_s": stage.end_s,
            "tail_s": stage.tail_s,
            "tail_start_s": stage.tail_start_s,
            "peak_memory_bytes": stage.memory.peak_bytes,
            "slots": slots.to_json(),
            "comms": [t.to_json() for t in cost.tied if stage.stage in t.stages],
        })  # fmt: skip
    units = []
    for (chunk, phase), seconds in sorted(cost.unit_s.items()):
        events = cost.unit_events.get((chunk, phase), ())
        units.append({
            "chunk": chunk,
            "phase": phase,
            "seconds": seconds,
            "ops": len(events),
        })  # fmt: skip
    return {
        "format": SCHEDULE_FORMAT,
        "schedule": cost.schedule,
        "pp": cost.pp,
        "microbatches": cost.microbatches,
        "virtual_stages": cost.virtual_stages,
        "step_time_s": cost.step_time,
        "bubble_fraction": cost.bubble_fraction,
        "bubble_formula": cost.bubble_formula,
        "hops_s": cost.p2p_s,
        "tied_all_reduces": [t.to_json() for t in cost.tied],
        "stages": stages,
        "units": units,
    }


def unit_json(cost: PipelineSlotCost, chunk: int, phase: str) -> dict[str, Any] | None:
    """The ops of one unit (a model chunk's forward or backward over one micro-batch) with
    their times inside the unit, columnar; None when the plan has no such unit."""
    if (chunk, phase) not in cost.unit_s:
        return None
    events = cost.unit_events.get((chunk, phase), ())
    return {
        "chunk": chunk,
        "phase": phase,
        "seconds": cost.unit_s[(chunk, phase)],
        "ops": {
            "name": [e.name for e in events],
            "kind": [e.kind for e in events],
            "stream": [e.stream for e in events],
            "role": [e.role for e in events],
            "scope": [e.scope for e in events],
            "start": [e.start for e in events],
            "end": [e.end for e in events],
            "bytes": [e.bytes for e in events],
            "exposed": [e.exposed for e in events],
        },
    }


def units_json(cost: PipelineSlotCost) -> dict[str, Any]:
    """Every distinct unit's ops (`unit_json`), keyed `"<chunk>:<phase>"`."""
    out = {}
    for chunk, phase in sorted(cost.unit_s):
        view = unit_json(cost, chunk, phase)
        if view is not None:
            out[f"{chunk}:{phase}"] = view
    return out
