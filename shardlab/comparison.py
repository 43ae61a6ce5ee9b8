"""Compare two plans: headline figures, collectives, time per scope and per op, placements.

`compare(a, b)` works on any two plans of the same or different strategies (and, once passes
exist, on a plan before and after a pass). Deltas are `b - a`: positive means plan B spends
more. Time per scope groups program ops by layer (`layers.3`, `embed`, `lm_head`), compute
and communication apart, so a reviewer sees which layers got faster or slower and whether
the change came from compute or from collectives.

Every figure carries its unit (`Delta.unit`), so `text()` prints it as a reviewer reads it
(seconds as ms, bytes in GiB, MFU in percent, counts whole); `to_json()` keeps raw numbers
for machines. Plans of a different global batch or sequence length do different work per
step: `warnings` says so, and the headline then leads with throughput (tokens/s), not step
time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shardlab.cost.memory import layer_scope
from shardlab.cost.model import PlanCost
from shardlab.cost.pipeline_slots import PipelineSlotCost
from shardlab.placement import DistSpec, Replicate
from shardlab.plan import Plan
from shardlab.summary import human_bytes

#: How many ops `compare` lists, largest |delta| first.
TOP_OPS = 20


@dataclass(frozen=True, slots=True)
class Delta:
    """One figure in both plans."""

    name: str
    a: float
    b: float
    #: how `text()` prints the figure: "s", "B", "%" (a fraction), "tok/s" or "" (a count)
    unit: str = ""

    @property
    def delta(self) -> float:
        return self.b - self.a

    @property
    def ratio(self) -> float | None:
        return self.b / self.a if self.a else None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "a": self.a, "b": self.b, "delta": self.delta,
                "ratio": self.ratio, "unit": self.unit}  # fmt: skip


@dataclass
class Comparison:
    """Everything `compare` found; `to_json()` for the API, `text()` for the terminal."""

    a_label: str
    b_label: str
    headline: list[Delta]
    memory: list[Delta]
    collectives: list[Delta]  # count and bytes per rank by kind
    scopes: list[Delta]  # seconds per (layer scope, compute|comm)
    ops: list[Delta]  # seconds per op present in both, largest |delta| first
    placements: list[tuple[str, str, str]] = field(default_factory=list)  # value, spec a, b
    #: what makes the two hard to compare (a different global batch or sequence length)
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "a": self.a_label,
            "b": self.b_label,
            "headline": [d.to_json() for d in self.headline],
            "memory": [d.to_json() for d in self.memory],
            "collectives": [d.to_json() for d in self.collectives],
            "scopes": [d.to_json() for d in self.scopes],
            "ops": [d.to_json() for d in self.ops],
            "placements": [{"value": v, "a": sa, "b": sb} for v, sa, sb in self.placements],
            "warnings": self.warnings,
        }

    def text(self, limit: int = 10) -> str:
        lines = [f"A: {self.a_label}", f"B: {self.b_label}", ""]
        lines += [f"warning: {w}" for w in self.warnings] + ([""] if self.warnings else [])
        for title, rows in (("headline", self.headline), ("memory per rank", self.memory),
                            ("collectives", self.collectives)):  # fmt: skip
            if rows:
                lines.append(title)
                lines += [_row(d) for d in rows]
        changed = _largest_first(self.scopes)[:limit]
        if changed:
            lines.append("time per scope, largest change first")
            lines += [_row(d) for d in changed]
        if self.placements:
            lines.append(f"placements that differ: {len(self.placements)}")
            lines += [f"  {v}: {sa} -> {sb}" for v, sa, sb in self.placements[:limit]]
        return "\n".join(lines)


def _row(d: Delta) -> str:
    ratio = f"  x{_ratio(d.ratio)}" if d.ratio is not None else ""
    delta = show(d.delta, d.unit, signed=True)
    return f"  {d.name:<32} {show(d.a, d.unit):>12} {show(d.b, d.unit):>12} {delta:>13}{ratio}"


def _ratio(r: float) -> str:
    """B / A in three digits, without exponents."""
    if r >= 1000:
        return f"{r:,.0f}"
    return "<0.001" if 0 < r < 0.001 else f"{r:.3g}"


def show(value: float, unit: str, signed: bool = False) -> str:
    """`value` in `unit` as a person reads it: 1.213 s, 42.1 ms, 113.8 GiB, 35.2%, 54,049/s."""
    sign = "+" if signed and value > 0 else ""
    if unit == "s":
        for scale, name in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
            if abs(value) >= scale or name == "µs":
                return f"{sign}{value / scale:.4g} {name}"
    if unit == "B":
        return human_bytes(value, signed)
    if unit == "%":
        return f"{sign}{value * 100:.1f}{' pt' if signed else '%'}"
    if unit == "tok/s":
        return f"{sign}{value:,.0f}/s"
    return f"{sign}{value:,.0f}" if float(value).is_integer() else f"{sign}{value:.4g}"


def compare(a: Plan, b: Plan, a_label: str = "", b_label: str = "") -> Comparison:
    """Compare plan `b` against plan `a`."""
    warnings = work_differs(a, b)
    headline = _headline(a, b)
    if warnings:  # the step does different work: throughput is the figure to read
        headline.sort(key=lambda d: d.name != "tokens/s")
    return Comparison(
        a_label=a_label or a.strategy.describe(),
        b_label=b_label or b.strategy.describe(),
        headline=headline,
        warnings=warnings,
        memory=_memory(a, b),
        collectives=_collectives(a, b),
        scopes=_pairs(_time_by_scope(a), _time_by_scope(b)) if a.cost and b.cost else [],
        ops=_largest_first(_pairs(_op_times(a), _op_times(b), both=True))[:TOP_OPS],
        placements=_placements(a, b),
    )


def work_differs(a: Plan, b: Plan) -> list[str]:
    """A warning for each of the global batch and the sequence length that differ."""
    out = []
    for name in ("batch", "seq"):
        va, vb = _setting(a, name), _setting(b, name)
        if va is not None and vb is not None and va != vb:
            what = "global batch" if name == "batch" else "sequence length"
            out.append(
                f"the plans' {what} differs (A {va}, B {vb}): a step does different work, so "
                "compare tokens/s, not step time"
            )
    return out


def _setting(plan: Plan, name: str) -> int | None:
    """The model's batch or seq: its preset config, else the shape of its `tokens` input."""
    config = plan.model.meta.get("config")
    if isinstance(config, dict) and isinstance(config.get(name), int):
        return int(config[name])
    if "tokens" in plan.model.values:
        shape = plan.model.type_of("tokens").shape
        index = 0 if name == "batch" else 1
        return int(shape[index]) if len(shape) > index else None
    return None


def _largest_first(rows: list[Delta]) -> list[Delta]:
    return sorted(rows, key=lambda d: -abs(d.delta))


def _headline(a: Plan, b: Plan) -> list[Delta]:
    rows = [Delta("program ops", len(a.program.ops), len(b.program.ops)),
            Delta("comm bytes per rank", a.program.comm_bytes_per_rank(),
                  b.program.comm_bytes_per_rank(), "B")]  # fmt: skip
    sa, sb = _step_cost(a), _step_cost(b)
    if sa is not None and sb is not None:
        rows += [
            Delta("step time (s)", sa.step_time, sb.step_time, "s"),
            Delta("MFU", sa.mfu, sb.mfu, "%"),
            Delta("tokens/s", sa.tokens_per_second, sb.tokens_per_second, "tok/s"),
        ]
    if a.cost and b.cost:
        exposed = a.cost.timeline.exposed_comm(0), b.cost.timeline.exposed_comm(0)
        rows.append(Delta("exposed comm (s)", *exposed, "s"))
    return rows


def _step_cost(plan: Plan) -> PlanCost | PipelineSlotCost | None:
    """The plan's step figures: a flat plan's cost, or its schedule's (a pipeline, or
    gradient accumulation)."""
    if plan.cost is not None:
        return plan.cost
    return plan.pipeline.cost if plan.pipeline is not None else None


def _memory(a: Plan, b: Plan) -> list[Delta]:
    sa, sb = _step_cost(a), _step_cost(b)
    if sa is None or sb is None:
        return []
    rows = [Delta("peak", sa.peak_memory_bytes, sb.peak_memory_bytes, "B")]
    if not (a.cost and b.cost):  # a schedule's memory is per stage (`plan --json`)
        return rows
    ma, mb = a.cost.memory, b.cost.memory
    for cat in sorted(set(ma.breakdown_at_peak) | set(mb.breakdown_at_peak)):
        rows.append(
            Delta(
                f"at peak: {cat}",
                ma.breakdown_at_peak.get(cat, 0),
                mb.breakdown_at_peak.get(cat, 0),
                "B",
            )
        )
    return rows


def _collectives(a: Plan, b: Plan) -> list[Delta]:
    ka, kb = a.collectives_by_kind(), b.collectives_by_kind()
    rows = []
    for kind in sorted(set(ka) | set(kb)):
        ea, eb = ka.get(kind, {}), kb.get(kind, {})
        rows.append(Delta(f"{kind} count", ea.get("count", 0), eb.get("count", 0)))
        rows.append(Delta(f"{kind} bytes/rank", ea.get("bytes_per_rank", 0.0),
                          eb.get("bytes_per_rank", 0.0), "B"))  # fmt: skip
    return rows


def _op_times(plan: Plan) -> dict[str, float]:
    return dict(plan.cost.op_times) if plan.cost else {}


def _time_by_scope(plan: Plan) -> dict[str, float]:
    """Seconds per `<layer scope> compute|comm` on rank 0 (needs a cost)."""
    if plan.cost is None:
        return {}
    out: dict[str, float] = {}
    for op in plan.program.ops:
        seconds = plan.cost.op_times.get(op.name, 0.0)
        key = f"{layer_scope(op.scope) or '(top)'} {'comm' if op.is_comm else 'compute'}"
        out[key] = out.get(key, 0.0) + seconds
    return out


def _pairs(a: dict[str, float], b: dict[str, float], both: bool = False) -> list[Delta]:
    names = sorted(set(a) & set(b)) if both else sorted(set(a) | set(b))
    return [Delta(n, a.get(n, 0.0), b.get(n, 0.0), "s") for n in names]


def _named(spec: DistSpec) -> str:
    """A spec by named mesh axis without its replicated axes (`dp:S(0)`), so the same layout
    reads the same on meshes with different axes; fully replicated is `R`."""
    parts = [f"{axis}:{p}" for axis, p in zip(spec.mesh.axis_names, spec.placements, strict=True)
             if not isinstance(p, Replicate)]  # fmt: skip
    return ",".join(parts) or "R"


def _placements(a: Plan, b: Plan) -> list[tuple[str, str, str]]:
    """Values of both training graphs whose placements differ (by named mesh axis)."""
    sa, sb = a.completed.specs, b.completed.specs
    rows = [(v, _named(sa[v]), _named(sb[v])) for v in sa if v in sb]
    return [row for row in rows if row[1] != row[2]]
