"""Chrome trace-event export of a `Timeline`, for Perfetto and chrome://tracing.

What it is for: look at a predicted step op by op. One process per distinct role (pid = its
representative rank, named "rank 0 (for ranks 0-63)"; ranks of one role run the same
events), or per requested rank, one
thread per stream (tid 0 = `compute`, then the comm streams in name order, the same on every
rank), one complete ("X") event per op with its scope, kind, the placements of its values and,
for comm ops, the bytes it moves and why it exists. Times are in microseconds.
`validate_trace` checks a trace against the parts of the format this module relies on.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from shardlab.cost.timeline import COMPUTE, Event, Timeline
from shardlab.program import DistOp, DistProgram

#: seconds -> trace microseconds
US = 1e6


def stream_ids(program: DistProgram, timeline: Timeline) -> dict[str, int]:
    """Stable small thread ids: `compute` is 0, then every comm stream in name order."""
    streams = {op.stream for op in program.ops}
    streams.update(e.stream for events in timeline.events.values() for e in events)
    streams.discard(COMPUTE)
    return {COMPUTE: 0, **{s: i + 1 for i, s in enumerate(sorted(streams))}}


def chrome_trace(
    timeline: Timeline, program: DistProgram, ranks: Sequence[int] | None = None
) -> dict[str, Any]:
    """The trace as a JSON-ready dict.

    By default one process per representative rank, with `otherData.represents` saying which
    ranks each one stands for; with `ranks`, one process per requested rank showing its
    representative's events.
    """
    pids = sorted(timeline.events) if ranks is None else list(dict.fromkeys(ranks))
    tids = stream_ids(program, timeline)
    ops = {op.name: op for op in program.ops}
    out: list[dict[str, Any]] = []
    for pid in pids:
        events = timeline.events_of(pid)
        out.append(_meta("process_name", pid, 0, _process_name(timeline, pid, ranks is None)))
        used = {e.stream for e in events} | {COMPUTE}
        out += [_meta("thread_name", pid, tid, s) for s, tid in tids.items() if s in used]
        out += [_complete(e, ops.get(e.name), program, pid, tids[e.stream]) for e in events]
    return {
        "traceEvents": out,
        "displayTimeUnit": "ms",
        "otherData": {
            "generator": "shardlab",
            "mesh": str(program.mesh),
            "step_time_s": timeline.step_time,
            "overlap_slowdown": timeline.overlap_slowdown,
            "represents": {str(rep): timeline.ranks_of(rep) for rep in sorted(timeline.events)},
            "streams": tids,
        },
    }


def write_chrome_trace(
    path: str | Path,
    timeline: Timeline,
    program: DistProgram,
    ranks: Sequence[int] | None = None,
) -> Path:
    """Write `chrome_trace(...)` as JSON to `path`; returns the path."""
    target = Path(path)
    target.write_text(json.dumps(chrome_trace(timeline, program, ranks)), encoding="utf-8")
    return target


def validate_trace(data: Any) -> list[str]:
    """Problems of `data` against the trace-event format (an empty list when it is fine).

    Checks: a `traceEvents` list (or a bare list); every event an object with a string
    `name` and `ph`, a finite `ts` >= 0 and integer `pid` and `tid`; "X" events with a finite
    `dur` >= 0; "M" events with a string `args.name`.
    """
    if isinstance(data, dict):
        events = data.get("traceEvents")
        if not isinstance(events, list):
            return ["the trace has no 'traceEvents' list"]
        unit = data.get("displayTimeUnit", "ms")
        problems = [] if unit in ("ms", "ns") else [f"displayTimeUnit {unit!r} is not ms or ns"]
    elif isinstance(data, list):
        events, problems = data, []
    else:
        return [f"a trace is an object or a list, not {type(data).__name__}"]
    for n, event in enumerate(events):
        problems += [f"event {n}: {p}" for p in _event_problems(event)]
    return problems


def _event_problems(event: Any) -> list[str]:
    if not isinstance(event, dict):
        return ["not an object"]
    problems = []
    for key in ("name", "ph"):
        if not isinstance(event.get(key), str):
            problems.append(f"'{key}' is missing or not a string")
    if not _number(event.get("ts")) or event["ts"] < 0:
        problems.append(f"'ts' must be a number >= 0, got {event.get('ts')!r}")
    for key in ("pid", "tid"):
        if not isinstance(event.get(key), int) or isinstance(event.get(key), bool):
            problems.append(f"'{key}' must be an integer, got {event.get(key)!r}")
    ph = event.get("ph")
    if ph == "X" and (not _number(event.get("dur")) or event["dur"] < 0):
        problems.append(f"'X' event needs 'dur' >= 0, got {event.get('dur')!r}")
    args = event.get("args")
    if ph == "M" and not (isinstance(args, dict) and isinstance(args.get("name"), str)):
        problems.append(f"'M' event {event.get('name')!r} needs a string args.name")
    return problems


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _meta(kind: str, pid: int, tid: int, name: str) -> dict[str, Any]:
    return {"name": kind, "ph": "M", "ts": 0, "pid": pid, "tid": tid, "args": {"name": name}}


def _complete(
    event: Event, op: DistOp | None, program: DistProgram, pid: int, tid: int
) -> dict[str, Any]:
    """One "X" event: the op's span with its scope, kind, placements and comm details."""
    args: dict[str, Any] = {"scope": event.scope, "kind": event.kind}
    if op is not None:
        values = dict.fromkeys((*op.outputs, *op.inputs))
        args["placements"] = {v: str(program.specs[v]) for v in values if v in program.specs}
    if event.is_comm:
        args["bytes"] = event.bytes
        args["exposed_us"] = event.exposed * US
        if op is not None:
            args["reason"] = op.reason
    return {
        "name": event.name,
        "cat": event.role,
        "ph": "X",
        "ts": event.start * US,
        "dur": max(event.end - event.start, 0.0) * US,
        "pid": pid,
        "tid": tid,
        "args": args,
    }


def _process_name(timeline: Timeline, pid: int, representative: bool) -> str:
    """`rank 0 (for ranks 0-63)` for a representative that stands for others, else `rank 3`."""
    ranks = timeline.ranks_of(pid) if representative else [pid]
    if ranks == [pid]:
        return f"rank {pid}"
    return f"rank {pid} (for ranks {_span(ranks)})"


def _span(ranks: Sequence[int]) -> str:
    """`[0, 1, 2, 3, 8]` -> `0-3, 8`."""
    parts: list[list[int]] = []
    for r in sorted(ranks):
        if parts and parts[-1][1] == r - 1:
            parts[-1][1] = r
        else:
            parts.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in parts)
