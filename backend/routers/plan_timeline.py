"""The simulated step per pass stage (timeline view), per-rank memory (memory view), and one
stage against another (passes view).

Reads the `timelines` and `memory` artifacts the worker stores for costed plans (see
`worker.engine.timelines_json` / `memory_json`). Every endpoint answers 409 `not_ready` before
the plan is built and 404 for a plan planned without a cluster (it has no cost). Times are
in seconds, bytes per rank.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import APIRouter, Query
from sqlalchemy.orm import Session

from backend.deps import PrincipalDep, SessionDep
from backend.errors import ApiError
from backend.orm import Plan
from backend.routers.plans import artifact, costed_plan
from backend.schemas.common import PathId, errors
from shardlab.cost.memory import layer_scope

router = APIRouter(prefix="/api/plans", tags=["plans"])

#: Events a timeline answer holds at most before same-role neighbours are merged into bars.
MAX_EVENTS = 4000
#: The memory view's five categories and the cost model's categories each one sums.
MEMORY_LABELS: dict[str, tuple[str, ...]] = {
    "parameters": ("parameters",),
    "gradients": ("gradients",),
    "optimizer state": ("optimizer_state",),
    "activations": ("activations", "temporaries", "inputs"),
    "buffers": ("comm_buffers",),
}
LABEL_OF = {c: label for label, cats in MEMORY_LABELS.items() for c in cats}

StageQuery = Annotated[
    str | None,
    Query(max_length=100, description="A pass stage (`lowered`, a pass name); default the last."),
]
RankQuery = Annotated[
    int | None,
    Query(ge=0, le=2**31 - 1, description="A mesh rank; answered by its representative."),
]


def _costed(session: Session, team_id: int, plan_id: int, kind: str) -> tuple[Plan, Any]:
    """The built plan and its `kind` artifact; 404 for a plan planned without a cluster."""
    plan = costed_plan(session, team_id, plan_id, kind)
    return plan, artifact(session, plan, kind)


def _stage(data: dict[str, Any], plan_id: int, name: str | None) -> dict[str, Any]:
    """The stage `name` (default the last); 404 naming it and listing the plan's stages."""
    stages: list[dict[str, Any]] = data["stages"]
    if name is None:
        return stages[-1]
    for stage in stages:
        if stage["name"] == name:
            return stage
    names = [s["name"] for s in stages]
    raise ApiError(
        404,
        "not_found",
        f"plan {plan_id} has no stage {name!r}; its stages: {', '.join(names)}",
        resource="stage",
        stage=name,
        stages=names,
    )


def _representative(stage: dict[str, Any], plan_id: int, rank: int | None) -> int | None:
    """The representative rank of `rank` in a timeline stage (None: every representative)."""
    if rank is None:
        return None
    rep = stage["rank_of_role"].get(str(rank))
    if rep is None:
        raise ApiError(
            404,
            "not_found",
            f"plan {plan_id} has no rank {rank}: its mesh has ranks "
            f"0..{len(stage['rank_of_role']) - 1}",
            resource="rank",
            rank=rank,
        )
    return int(rep)


def _natural(scope: str) -> list[Any]:
    """Sort key: `layers.2` before `layers.10`; the unscoped part ("") first."""
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"[.]", scope) if p]


def _cost_figures(stage: dict[str, Any]) -> dict[str, Any]:
    cost = stage["cost"]
    keys = ("step_time_s", "mfu", "tokens_per_s", "compute_s", "comm_s", "exposed_comm_s")
    return {
        **{k: cost.get(k) for k in keys},
        "overlap_fraction": cost.get("overlap_fraction"),
        "peak_memory_bytes": cost.get("peak_memory_bytes"),
        "memory_capacity_bytes": cost.get("memory_capacity_bytes"),
        "fits": cost.get("fits"),
    }


@router.get("/{plan_id}/stages", responses=errors(401, 404, 409, 422))
def list_stages(
    plan_id: PathId, session: SessionDep, principal: PrincipalDep
) -> list[dict[str, Any]]:
    """The program after lowering and after each pass, in order: what the pass did (or, for
    a pass the cost guard declined, why not: `declined`, `declined_reason`), its ops, and the
    simulated step's time, exposed communication, MFU and peak memory."""
    _, data = _costed(session, principal.team_id, plan_id, "timelines")
    return [
        {
            "name": s["name"],
            "message": s["message"],
            "declined": bool(s.get("declined", False)),
            "declined_reason": s.get("declined_reason"),
            "ops": s["ops"],
            **_cost_figures(s),
            "collectives": s["collectives"],
        }
        for s in data["stages"]
    ]


def _events(
    stage: dict[str, Any], rep: int, t0: float, t1: float, deps: bool
) -> list[dict[str, Any]]:
    """The events of representative `rep` that overlap [t0, t1], in start order."""
    table, cols = stage["op_table"], stage["ranks"][str(rep)]["events"]
    out = []
    names = table["name"]
    for i, start, end, exposed in zip(
        cols["op"], cols["start"], cols["end"], cols["exposed"], strict=True
    ):
        if end < t0 or start > t1:
            continue
        event = {
            "rank": rep,
            "stream": table["stream"][i],
            "name": names[i],
            "kind": table["kind"][i],
            "role": table["role"][i],
            "scope": table["scope"][i],
            "start": start,
            "end": end,
            "busy": end - start,
            "count": 1,
            "bytes": table["bytes"][i],
            "exposed": exposed,
        }
        if deps:
            event["deps"] = [names[d] for d in table["deps"][i]]
        out.append(event)
    return out


def _common_scope(a: str, b: str) -> str:
    parts = []
    for x, y in zip(a.split("."), b.split("."), strict=False):
        if x != y:
            break
        parts.append(x)
    return ".".join(parts)


def _merge(lanes: list[list[dict[str, Any]]], width: float) -> list[dict[str, Any]]:
    """Consecutive events of one lane (rank + stream) with the same role become one bar when
    the bar stays at most `width` seconds long; bars keep their busy seconds, bytes, exposed
    seconds and op count."""
    out: list[dict[str, Any]] = []
    for lane in lanes:
        bar: dict[str, Any] | None = None
        for e in lane:
            if bar is not None and bar["role"] == e["role"] and e["end"] - bar["start"] <= width:
                bar["end"] = max(bar["end"], e["end"])
                bar["busy"] += e["busy"]
                bar["bytes"] += e["bytes"]
                bar["exposed"] += e["exposed"]
                bar["count"] += 1
                bar["last"] = e["name"]
                bar["scope"] = _common_scope(bar["scope"], e["scope"])
                if bar["kind"] != e["kind"]:
                    bar["kind"] = "mixed"
                continue
            bar = {**e, "last": e["name"]}
            out.append(bar)
    for bar in out:
        last = bar.pop("last")
        if bar["count"] > 1:
            bar["name"] = f"{bar['count']} ops: {bar['name']} … {last}"
            bar["deps"] = []
    return out


def aggregate(events: list[dict[str, Any]], max_events: int, span: float) -> list[dict[str, Any]]:
    """At most `max_events` bars where merging same-role neighbours can get there: bars at
    most `span / (max_events / lanes)` seconds long, twice that, ... up to the whole span."""
    lanes_of: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for e in events:
        lanes_of.setdefault((e["rank"], e["stream"]), []).append(e)
    lanes = [sorted(v, key=lambda e: (e["start"], e["end"])) for _, v in sorted(lanes_of.items())]
    width = span * len(lanes) / max(1, max_events)
    while True:
        bars = _merge(lanes, width)
        if len(bars) <= max_events or width > 2 * span:
            return sorted(bars, key=lambda e: (e["rank"], e["start"]))
        width *= 2


def _kinds(stage: dict[str, Any], rep: int) -> list[dict[str, Any]]:
    """Per op kind over the whole step of representative `rep`: its stream(s), op count and
    busy seconds, largest first (the timeline view's statistics table; merged bars lose
    their kinds)."""
    table, cols = stage["op_table"], stage["ranks"][str(rep)]["events"]
    out: dict[str, dict[str, Any]] = {}
    for i, start, end in zip(cols["op"], cols["start"], cols["end"], strict=True):
        kind = table["kind"][i]
        entry = out.setdefault(kind, {"kind": kind, "streams": [], "count": 0, "busy_s": 0.0})
        if table["stream"][i] not in entry["streams"]:
            entry["streams"].append(table["stream"][i])
        entry["count"] += 1
        entry["busy_s"] += end - start
    return sorted(out.values(), key=lambda e: (-e["busy_s"], e["kind"]))


def _rank_head(stage: dict[str, Any], rep: int) -> dict[str, Any]:
    """A representative rank's figures, without its events, and its busy time per op kind."""
    head = {k: v for k, v in stage["ranks"][str(rep)].items() if k != "events"}
    return {"rank": rep, **head, "kinds": _kinds(stage, rep)}


@router.get("/{plan_id}/timeline", responses=errors(401, 404, 409, 422))
def get_timeline(
    plan_id: PathId,
    session: SessionDep,
    principal: PrincipalDep,
    stage: StageQuery = None,
    rank: RankQuery = None,
    t0: Annotated[
        float | None, Query(ge=0, allow_inf_nan=False, description="Window start, seconds.")
    ] = None,
    t1: Annotated[
        float | None, Query(ge=0, allow_inf_nan=False, description="Window end, seconds.")
    ] = None,
    max_events: Annotated[int, Query(ge=1, le=100_000)] = MAX_EVENTS,
) -> dict[str, Any]:
    """The simulated step of one stage: its representative ranks (`representatives`, each
    with the ranks it stands for and its whole step's busy seconds and op count per op kind,
    `kinds`; `ranks`: those shown, one when `rank` is given) and their
    events that overlap [t0, t1] (default the whole step), each with
    its stream, role, scope, span, bytes, exposed communication seconds and dependencies.
    Over `max_events`, consecutive events of one rank, stream and role merge into bars
    (`aggregated`: true; `count` ops, `busy` seconds kept); zoom in to split them."""
    _, data = _costed(session, principal.team_id, plan_id, "timelines")
    chosen = _stage(data, plan_id, stage)
    rep = _representative(chosen, plan_id, rank)
    step = float(chosen["step_time"])
    lo = 0.0 if t0 is None else t0
    hi = max(step, lo) if t1 is None else t1
    if hi < lo:
        raise ApiError(
            422, "invalid_request", f"t1 ({hi}) is before t0 ({lo})", field="t1", t0=lo, t1=hi
        )
    reps = [int(r) for r in chosen["ranks"]] if rep is None else [rep]
    events: list[dict[str, Any]] = []
    for r in reps:
        events += _events(chosen, r, lo, hi, deps=True)
    total = len(events)
    aggregated = total > max_events
    if aggregated:
        events = aggregate(events, max_events, max(hi - lo, 1e-12))
    return {
        "plan_id": plan_id,
        "stage": chosen["name"],
        "stages": [s["name"] for s in data["stages"]],
        "step_time_s": step,
        "figures": _cost_figures(chosen),
        "t0": lo,
        "t1": hi,
        "rank": rank,
        "ranks": [_rank_head(chosen, r) for r in reps],
        "representatives": [_rank_head(chosen, int(r)) for r in chosen["ranks"]],
        "streams": chosen["streams"],
        "total_events": total,
        "aggregated": aggregated,
        "max_events": max_events,
        "events": events,
    }


def _memory_rank(entry: dict[str, Any], capacity: float) -> dict[str, Any]:
    detail: dict[str, int] = entry["breakdown_at_peak"]
    breakdown = {
        label: sum(detail.get(c, 0) for c in cats) for label, cats in MEMORY_LABELS.items()
    }
    return {
        "rank": entry["rank"],
        "stands_for": entry["stands_for"],
        "peak_bytes": entry["peak_bytes"],
        "peak_op": entry["peak_op"],
        "capacity_bytes": capacity,
        "fits": entry["peak_bytes"] <= capacity,
        "headroom_bytes": capacity - entry["peak_bytes"],
        "breakdown": breakdown,
        "breakdown_detail": detail,
        "largest_buffers": [
            {**b, "label": LABEL_OF.get(b["category"], b["category"])}
            for b in entry["largest_at_peak"]
        ],
        "static_bytes": entry["static_bytes"],
        "model_state": entry["model_state"],
        "series": entry["series"],
    }


@router.get("/{plan_id}/memory", responses=errors(401, 404, 409, 422))
def get_memory(
    plan_id: PathId, session: SessionDep, principal: PrincipalDep, stage: StageQuery = None
) -> dict[str, Any]:
    """Memory per profiled rank after one stage: the peak, its breakdown by category
    (parameters, gradients, optimizer state, activations, buffers; `categories` says which
    cost-model categories each sums), the device capacity and whether it fits, the largest
    buffers live at the peak, and live bytes per op over the step (thinned)."""
    plan, data = _costed(session, principal.team_id, plan_id, "memory")
    chosen = _stage(data, plan_id, stage)
    capacity = float(chosen["capacity_bytes"])
    return {
        "plan_id": plan.id,
        "stage": chosen["name"],
        "stages": [s["name"] for s in data["stages"]],
        "cluster": chosen["cluster"],
        "capacity_bytes": capacity,
        "categories": {label: list(cats) for label, cats in MEMORY_LABELS.items()},
        "ranks": [_memory_rank(entry, capacity) for entry in chosen["ranks"]],
    }


def _scope_busy(stage: dict[str, Any], rep: int) -> dict[str, dict[str, float]]:
    """Per layer scope (`layers.3`, `lm_head`): compute, comm and exposed comm seconds."""
    table, cols = stage["op_table"], stage["ranks"][str(rep)]["events"]
    out: dict[str, dict[str, float]] = {}
    for i, start, end, exposed in zip(
        cols["op"], cols["start"], cols["end"], cols["exposed"], strict=True
    ):
        entry = out.setdefault(
            layer_scope(table["scope"][i]), {"compute": 0.0, "comm": 0.0, "exposed_comm": 0.0}
        )
        if table["stream"][i] == "compute":
            entry["compute"] += end - start
        else:
            entry["comm"] += end - start
            entry["exposed_comm"] += exposed
    return out


def _side(stage: dict[str, Any]) -> dict[str, Any]:
    return {"stage": stage["name"], "ops": stage["ops"], **_cost_figures(stage)}


@router.get("/{plan_id}/stages/compare", responses=errors(401, 404, 409, 422))
def compare_stages(
    plan_id: PathId,
    session: SessionDep,
    principal: PrincipalDep,
    a: Annotated[str | None, Query(max_length=100, description="Before; default lowered.")] = None,
    b: Annotated[str | None, Query(max_length=100, description="After; default the last.")] = None,
    rank: RankQuery = None,
) -> dict[str, Any]:
    """Stage `b` against stage `a` (deltas are b - a): step time, MFU, peak memory,
    collectives by kind, and per layer scope the compute, comm and exposed comm seconds of
    one representative rank (default rank 0's); `delta` per scope is compute + exposed comm,
    the time the scope adds to the step."""
    _, data = _costed(session, principal.team_id, plan_id, "timelines")
    before = _stage(data, plan_id, a or data["stages"][0]["name"])
    after = _stage(data, plan_id, b)
    rep_a = _representative(before, plan_id, rank or 0)
    rep_b = _representative(after, plan_id, rank or 0)
    assert rep_a is not None and rep_b is not None
    side_a, side_b = _side(before), _side(after)
    numbers = [k for k, v in side_a.items() if isinstance(v, int | float) and k != "fits"]
    delta = {k: side_b[k] - side_a[k] for k in numbers if isinstance(side_b.get(k), int | float)}
    kinds = sorted(set(before["collectives"]) | set(after["collectives"]))
    empty = {"count": 0, "bytes_per_rank": 0.0}
    collectives = []
    for kind in kinds:
        ca, cb = before["collectives"].get(kind, empty), after["collectives"].get(kind, empty)
        collectives.append(
            {
                "kind": kind,
                "a": ca,
                "b": cb,
                "delta_count": cb["count"] - ca["count"],
                "delta_bytes_per_rank": cb["bytes_per_rank"] - ca["bytes_per_rank"],
            }
        )
    busy_a, busy_b = _scope_busy(before, rep_a), _scope_busy(after, rep_b)
    zero = {"compute": 0.0, "comm": 0.0, "exposed_comm": 0.0}
    scopes = []
    for scope in sorted(set(busy_a) | set(busy_b), key=_natural):
        sa, sb = busy_a.get(scope, zero), busy_b.get(scope, zero)
        deltas = {f"{k}_delta": sb[k] - sa[k] for k in zero}
        scopes.append(
            {
                "scope": scope,
                "a": sa,
                "b": sb,
                **deltas,
                "delta": deltas["compute_delta"] + deltas["exposed_comm_delta"],
            }
        )
    return {
        "plan_id": plan_id,
        "stages": [s["name"] for s in data["stages"]],
        "rank": rep_a,
        "a": {**side_a, "collectives": before["collectives"]},
        "b": {**side_b, "collectives": after["collectives"]},
        "delta": delta,
        "collectives": collectives,
        "scopes": scopes,
    }
