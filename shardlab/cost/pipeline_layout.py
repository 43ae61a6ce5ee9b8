"""The schedule's slots over unit costs: when each stage runs each of its forward and
backward units, given one unit's seconds per (chunk, phase) and one hop's per link.

What it is for: `cost.pipeline_slots` prices a pipelined step from unit costs; this module
lays the units out in the schedule's order (`passes.pipeline_schedule.schedule_units`:
GPipe, 1F1B, interleaved). A forward waits for the previous chunk's forward of the same
micro-batch and its send, a backward for the next chunk's backward; each stage runs one
unit at a time. The work grows with stages x micro-batches x chunks, never with the
program's ops.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shardlab.passes.pipeline_schedule import PipelineError, schedule_units


def schedule_step(
    schedule: str,
    pp: int,
    microbatches: int,
    v: int,
    times: dict[tuple[int, str], float],
    p2p: dict[tuple[int, int, str], float],
    starts: list[list[float]] | None = None,
) -> tuple[list[list[Any]], list[float], list[float]]:
    """The schedule's slots over unit costs (module doc, 4): each stage's unit order, when
    each stage finishes its units and how long they keep it busy (with `starts`, one empty
    list per stage, each unit's start too). `times[(chunk, phase)]` is one unit's seconds,
    `p2p[(from chunk, to chunk, phase)]` one hop's; the work grows with stages x
    micro-batches x chunks, never with the program's ops."""
    orders = [schedule_units(schedule, pp, s, microbatches, v) for s in range(pp)]
    ends, busy = run_schedule(orders, pp, v, times, p2p, starts)
    return orders, ends, busy


@dataclass(frozen=True)
class StageSlots:
    """One stage's schedule slots, columnar (in the order the stage runs them)."""

    stage: int
    phase: list[str]
    chunk: list[int]  # the global model chunk
    microbatch: list[int]
    start: list[float]
    end: list[float]

    def to_json(self) -> dict[str, Any]:
        return {"stage": self.stage, "phase": self.phase, "chunk": self.chunk,
                "microbatch": self.microbatch, "start": self.start, "end": self.end}  # fmt: skip


def run_schedule(
    orders: Sequence[Sequence[Any]],
    pp: int,
    v: int,
    times: dict[tuple[int, str], float],
    p2p: dict[tuple[int, int, str], float],
    starts: list[list[float]] | None = None,
) -> tuple[list[float], list[float]]:
    """When each stage finishes its units, and how long they keep it busy (module doc, 4);
    with `starts` (one empty list per stage), each unit's start in `orders` order."""
    last = pp * v - 1
    done: dict[tuple[str, int, int], float] = {}  # (phase, chunk, micro-batch) -> end
    free = [0.0] * pp
    busy = [0.0] * pp
    pcs = [0] * pp
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(pp):
            while pcs[s] < len(orders[s]):
                unit = orders[s][pcs[s]]
                g = unit.chunk * pp + s
                if unit.phase == "F":
                    before = ("F", g - 1, unit.microbatch)
                    hop = p2p.get((g - 1, g, "F"), 0.0)
                else:
                    before = (
                        ("F", g, unit.microbatch) if g == last else ("B", g + 1, unit.microbatch)
                    )
                    hop = 0.0 if g == last else p2p.get((g + 1, g, "B"), 0.0)
                if unit.phase == "F" and g == 0:
                    ready = 0.0
                elif before in done:
                    ready = done[before] + hop
                else:
                    break
                seconds = times.get((g, unit.phase), 0.0)
                start = max(free[s], ready)
                if starts is not None:
                    starts[s].append(start)
                free[s] = done[(unit.phase, g, unit.microbatch)] = start + seconds
                busy[s] += seconds
                pcs[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # pragma: no cover - every schedule of pipeline_schedule runs
            raise PipelineError(f"the schedule cannot run: stages stop at units {pcs}")
    return free, busy
