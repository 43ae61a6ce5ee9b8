"""What a review comment is about: an anchor on a plan object, checked against the built plan,
and the permalink that opens that object in the UI.

Anchor kinds and where their permalinks lead:
- `op`: an op of the program (the graph view, opened on the scope that shows it, op selected);
- `value`: a serial value with a recorded placement (the sharding view on that value);
- `collective`: a communication op of the program (the graph view, collective selected);
- `scope`: a module path such as `layers.0.attn` (the graph view opened on it);
- `pass`: an optimization pass the plan ran (the passes view, that pass against the one before);
- `timeline`: a time range `[start_s, end_s]` of the predicted step (the timeline zoomed on it).

A plan's objects are known once it is built, so anchoring to one needs a built plan (409
before); a name the plan does not have is a 422 naming it.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from backend.errors import ApiError
from backend.plan_graph.index import GraphIndex
from backend.plan_graph.search import hit as graph_hit

KINDS = ("op", "value", "collective", "scope", "pass", "timeline")


def check_anchor(
    anchor: dict[str, Any], plan_id: int, index: GraphIndex, summary: dict[str, Any]
) -> dict[str, Any]:
    """The anchor as stored (kind, name or range, and the graph scope that shows it); 422
    naming the field for an object the plan does not have."""
    kind = anchor["kind"]
    name = anchor.get("name")
    if kind == "timeline":
        return _timeline(anchor, plan_id, summary)
    if not name:
        raise _bad(f"a {kind} anchor needs a name", "anchor.name")
    if kind in ("op", "collective"):
        i = index.by_name.get(name)
        if i is None or (kind == "collective") != index.is_comm[i]:
            what = "communication op" if kind == "collective" else "compute op"
            raise _bad(f"plan {plan_id} has no {what} {name!r}", "anchor.name", name=name)
        return {"kind": kind, "name": name, "scope": graph_hit(index, kind, name)["scope"]}
    if kind == "value":
        if name not in index.specs:
            raise _bad(f"plan {plan_id} has no value {name!r}", "anchor.name", name=name)
        return {"kind": kind, "name": name}
    if kind == "scope":
        if not any(s == name or s.startswith(name + ".") for s in index.scope):
            raise _bad(f"plan {plan_id} has no module scope {name!r}", "anchor.name", name=name)
        return {"kind": kind, "name": name}
    passes = [stage["name"] for stage in summary.get("passes") or []]
    if name not in passes:
        raise _bad(
            f"plan {plan_id} ran no pass {name!r} (it ran: {', '.join(passes) or 'none'})",
            "anchor.name",
            name=name,
        )
    return {"kind": kind, "name": name}


def _timeline(anchor: dict[str, Any], plan_id: int, summary: dict[str, Any]) -> dict[str, Any]:
    start, end = anchor.get("start_s"), anchor.get("end_s")
    if start is None or end is None:
        raise _bad("a timeline anchor needs start_s and end_s", "anchor.start_s")
    if not 0 <= start < end:
        raise _bad(
            f"a timeline range needs 0 <= start_s < end_s, got [{start}, {end}]",
            "anchor.end_s",
            start_s=start,
            end_s=end,
        )
    cost = summary.get("pipeline") or summary.get("cost") or {}
    step = cost.get("step_time_s")
    if step is None:
        raise _bad(f"plan {plan_id} has no timeline: it was planned without a cluster", "anchor")
    if start >= step:
        raise _bad(
            f"the range starts at {start} s, after the step ends ({step:.6g} s)",
            "anchor.start_s",
            start_s=start,
            step_time_s=step,
        )
    return {"kind": "timeline", "start_s": float(start), "end_s": float(min(end, step))}


def permalink(plan_id: int, anchor: dict[str, Any] | None) -> str:
    """The UI address that opens the anchored object (the plan's overview for none)."""
    base = f"#/plans/{plan_id}"
    if anchor is None:
        return base
    kind, name = anchor["kind"], anchor.get("name")
    if kind in ("op", "collective"):
        query = {"scope": anchor.get("scope") or None, kind: name}
        return f"{base}/graph?" + urlencode({k: v for k, v in query.items() if v})
    if kind == "scope":
        return f"{base}/graph?" + urlencode({"scope": name})
    if kind == "value":
        return f"{base}/sharding?" + urlencode({"value": name})
    if kind == "pass":
        return f"{base}/passes?" + urlencode({"b": name})
    return f"{base}/timeline?" + urlencode({"t0": anchor["start_s"], "t1": anchor["end_s"]})


def anchor_text(anchor: dict[str, Any] | None) -> str:
    """One line naming the anchored object ("op layers.0.attn.q_proj", "timeline 1-2 ms")."""
    if anchor is None:
        return "the plan"
    if anchor["kind"] == "timeline":
        start, end = anchor["start_s"] * 1e3, anchor["end_s"] * 1e3
        return f"timeline {start:.3f}-{end:.3f} ms"
    return f"{anchor['kind']} {anchor['name']}"


def _bad(message: str, field: str, **detail: Any) -> ApiError:
    return ApiError(422, "invalid_anchor", message, field=field, **detail)
