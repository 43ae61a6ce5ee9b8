"""What a job computes, with no database in sight: runs in the worker's child process.

Every function takes the job's inputs as plain JSON-able data (see `worker.inputs`) and a
`progress(fraction, message)` callback, and returns a JSON-able result:

- `run_plan`: `{"summary": Plan.summary(), "artifacts": {kind: data}}` with artifacts
  `plan` (Plan.to_json), `program` (compact ops), `placements` (per serial value: spec and
  the decisions that set it), `passes` (per stage: summary and step time) and, when costed,
  `trace` (Chrome trace JSON), `timelines` (per stage: the simulated step of every
  representative rank, see `timelines_json`) and `memory` (per stage: the memory profile,
  see `memory_json`).
- `run_verify`: `{"report": {...}}` (VerifyReport as JSON), on the inputs' `backend`.
- `run_measure`: `{"measured": {...}, "trace": Chrome trace}`, the plan's step timed on
  torch ranks against its prediction (`worker/measure.py`).
- `run_compare`: `{"comparison": Comparison.to_json()}`.
- `run_search`: `{"search": SearchResult.to_json()}`.
- `run_import`: `{"graph": graph JSON}`, a Hugging Face config's model (`worker/importing.py`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from shardlab.cost.clusters import cluster_from_dict
from shardlab.cost.model import PlanCost
from shardlab.cost.timeline import COMPUTE
from shardlab.cost.trace import chrome_trace
from shardlab.export.placements_json import placements_view as placements_json
from shardlab.export.schedule_view import schedule_json, units_json
from shardlab.graph_json import graph_from_json
from shardlab.plan import Plan, PlanStage, build_plan
from shardlab.program import DistOp, DistProgram
from shardlab.strategy import Strategy
from worker.importing import run_import

Progress = Callable[[float, str], None]


def jsonable(value: Any) -> Any:
    """`value` with tuples as lists, non-finite floats as None and unknown objects as text
    (PostgreSQL's JSON has no NaN or Infinity)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, str | int | bool):
        return value
    return str(value)


def _strategy(data: dict[str, Any]) -> Strategy:
    return Strategy.build(
        data["mesh"],
        data.get("templates", []),
        data.get("annotations", []),
        data.get("options", {}),
    )


def build(inputs: dict[str, Any], progress: Progress, span: tuple[float, float] = (0, 1)) -> Plan:
    """`build_plan` on the job's inputs, reporting each step within `span` of the progress bar
    (training graph, completion, lowering, each pass, the cost after each stage)."""
    lo, hi = span

    def report(fraction: float, message: str) -> None:
        progress(lo + (hi - lo) * fraction, message)

    model = graph_from_json(inputs["graph"])
    strategy = _strategy(inputs["strategy"])
    options = strategy.options
    return build_plan(
        model,
        strategy,
        optimizer=str(options.get("optimizer", "adamw")),
        lr=float(options.get("lr", 1e-3)),
        cluster=cluster_from_dict(inputs["cluster"]) if inputs.get("cluster") else None,
        progress=report,
    )


def op_json(op: DistOp) -> dict[str, Any]:
    """One program op, compactly: comm ops add their collective, axes, bytes and why."""
    out: dict[str, Any] = {
        "name": op.name,
        "kind": op.kind,
        "scope": op.scope,
        "role": op.role.value,
        "stream": op.stream,
        "inputs": list(op.inputs),
        "outputs": list(op.outputs),
        "reason": op.reason,
        "deps": list(op.deps),
    }
    if op.comm is not None:
        out["comm"] = {
            "kind": op.comm.kind,
            "axes": [op.comm.axis],
            "bytes_per_rank": op.comm.bytes_per_rank,
            "from": op.attrs.get("from"),
            "to": op.attrs.get("to"),
            "consumer": op.attrs.get("consumer"),
            "value": op.attrs.get("value"),
        }
    return out


TIMELINES_FORMAT = "shardlab.timelines/1"
MEMORY_FORMAT = "shardlab.memory/1"


def stage_collectives(program: DistProgram) -> dict[str, dict[str, float]]:
    """Per comm kind of `program`: how many ops and their bytes per rank."""
    out: dict[str, dict[str, float]] = {}
    for op in program.ops:
        if op.comm is not None:
            entry = out.setdefault(op.kind, {"count": 0, "bytes_per_rank": 0.0})
            entry["count"] += 1
            entry["bytes_per_rank"] += op.comm.bytes_per_rank
    return dict(sorted(out.items()))


def _stage_head(stage: PlanStage) -> dict[str, Any]:
    summary = stage.summary
    return {
        "name": stage.name,
        "message": summary.get("message", ""),
        "declined": bool(summary.get("declined", False)),
        "declined_reason": summary.get("declined_reason"),
        "ops": len(stage.program.ops),
        "collectives": stage_collectives(stage.program),
    }


def timeline_json(stage: PlanStage, cost: PlanCost) -> dict[str, Any]:
    """One stage's simulated step, columnar: `ops` is the stage program's op table (program
    order; `deps` as op indices; `bytes` moved per rank by comm ops), and every
    representative rank's `events` (in start order) point into it by `op` index."""
    program, timeline = stage.program, cost.timeline
    index = {op.name: i for i, op in enumerate(program.ops)}
    moved = [0.0] * len(program.ops)
    ranks: dict[str, Any] = {}
    for rep, events in sorted(timeline.events.items()):
        columns: dict[str, list[Any]] = {"op": [], "start": [], "end": [], "exposed": []}
        for e in events:
            i = index[e.name]
            moved[i] = e.bytes
            columns["op"].append(i)
            columns["start"].append(e.start)
            columns["end"].append(e.end)
            columns["exposed"].append(e.exposed)
        ranks[str(rep)] = {
            "stands_for": timeline.ranks_of(rep),
            "end_time": timeline.end_time(rep),
            "compute_time": timeline.compute_time(rep),
            "comm_time": timeline.comm_time(rep),
            "exposed_comm": timeline.exposed_comm(rep),
            "overlap_fraction": timeline.overlap_fraction(rep),
            "events": columns,
        }
    ops = program.ops
    return {
        **_stage_head(stage),
        "cost": cost.summary(),
        "step_time": timeline.step_time,
        "overlap_slowdown": timeline.overlap_slowdown,
        "rank_of_role": {str(r): p for r, p in sorted(timeline.rank_of_role.items())},
        "streams": sorted({op.stream for op in ops}, key=lambda s: (s != COMPUTE, s)),
        "op_table": {
            "name": [op.name for op in ops],
            "kind": [op.kind for op in ops],
            "stream": [op.stream for op in ops],
            "role": [op.role.value for op in ops],
            "scope": [op.scope for op in ops],
            "bytes": moved,
            "deps": [[index[d] for d in op.deps if d in index] for op in ops],
        },
        "ranks": ranks,
    }


def timelines_json(plan: Plan) -> dict[str, Any]:
    """The simulated step after lowering and after each pass (a costed plan's stages)."""
    stages = [timeline_json(s, s.cost) for s in plan.stages if isinstance(s.cost, PlanCost)]
    return {"format": TIMELINES_FORMAT, "stages": stages}


def memory_json(plan: Plan) -> dict[str, Any]:
    """Per stage, the memory profile of each rank the cost model profiled (one: every rank
    holds equal blocks, so the first rank of the mesh stands for all), with its series of
    live bytes per op in program order, each point with the op's start on the timeline."""
    mesh = plan.strategy.mesh
    stages = []
    for stage in plan.stages:
        cost = stage.cost
        if not isinstance(cost, PlanCost):  # not costed, or pipelined (see summary["pipeline"])
            continue
        profile = cost.memory
        data = profile.to_json()
        starts = {e.name: e.start for e in cost.timeline.events_of(profile.rank)}
        order = {op.name: i for i, op in enumerate(stage.program.ops)}
        data["series"] = {
            "op": [name for name, _ in data["timeline"]],
            "index": [order.get(name) for name, _ in data["timeline"]],
            "t": [starts.get(name) for name, _ in data["timeline"]],
            "bytes": [live for _, live in data["timeline"]],
        }
        del data["timeline"]
        data["stands_for"] = list(mesh.ranks)
        stages.append(
            {
                **_stage_head(stage),
                "capacity_bytes": cost.cluster.hbm_bytes,
                "cluster": cost.cluster.name,
                "ranks": [data],
            }
        )
    return {"format": MEMORY_FORMAT, "stages": stages}


def run_plan(inputs: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """Build (and with a cluster, cost) a plan; its summary and artifacts."""
    plan = build(inputs, progress, (0.0, 0.85))
    progress(0.85, "artifacts")
    program: dict[str, Any] = {"ops": [op_json(op) for op in plan.program.ops]}
    if plan.cost is not None:
        program["op_times_s"] = plan.cost.op_times
    artifacts: dict[str, Any] = {
        "plan": plan.to_json(),
        "program": program,
        "placements": placements_json(plan),
        "passes": [stage.to_json() for stage in plan.stages],
    }
    if plan.cost is not None:
        progress(0.92, "trace")
        artifacts["trace"] = chrome_trace(plan.cost.timeline, plan.program)
        progress(0.95, "timelines and memory per stage")
        artifacts["timelines"] = timelines_json(plan)
        artifacts["memory"] = memory_json(plan)
    elif plan.pipeline is not None and plan.pipeline.cost is not None:
        progress(0.95, "the pipeline's schedule slots")
        artifacts["schedule"] = schedule_json(plan.pipeline.cost)
        artifacts["schedule_units"] = units_json(plan.pipeline.cost)
    return {"summary": plan.summary(), "artifacts": artifacts}


def run_verify(inputs: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """One training step of the plan distributed against one device: on the simulated mesh,
    or (`backend: torch`) on one process per rank that `verify` spawns itself; a mesh with a
    `pp` axis runs as the pipeline its strategy says. A model whose run would hold more than
    `MAX_VERIFICATION_BYTES` is verified as its scaled-down twin (the report's `summary.twin`
    says so), or refused with `twin: false` (`shardlab.runtime.twin`)."""
    from shardlab.runtime.twin import verify_safely

    backend = str(inputs.get("backend") or "simulated")
    graph = graph_from_json(inputs["graph"])
    strategy = _strategy(inputs["strategy"])
    where = "simulated step" if backend == "simulated" else f"{strategy.mesh.size} torch ranks"
    progress(0.1, f"verify (plan, reference and {where})")
    report = verify_safely(
        graph,
        strategy,
        twin=bool(inputs.get("twin", True)),
        optimizer=str(strategy.options.get("optimizer", "adamw")),
        lr=float(strategy.options.get("lr", 1e-3)),
        compute_dtype=inputs.get("compute_dtype", "float64"),
        backend=backend,
        device=str(inputs.get("device") or "cpu"),
    )
    return {"report": report.to_json()}


def run_measure(inputs: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """The plan's step timed on torch ranks against its prediction (`worker.measure`)."""
    from worker.measure import measure_plan

    return measure_plan(inputs, progress)


def run_compare(inputs: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """Build plans A and B and compare them (deltas are B - A)."""
    from shardlab.comparison import compare

    a = build(inputs["a"], progress, (0.0, 0.45))
    b = build(inputs["b"], progress, (0.45, 0.9))
    progress(0.9, "compare")
    result = compare(a, b, inputs["a"].get("label", "A"), inputs["b"].get("label", "B"))
    return {"comparison": result.to_json()}


def run_search(inputs: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """A strategy search (`shardlab.search.run.search`); its result as JSON. It plans its
    candidates in the job's own process (a job runs in a daemonic process, which may not
    start a pool; the worker's concurrency is its jobs), where the CLI uses every core."""
    from shardlab.search.run import search

    result = search(
        inputs["preset"],
        cluster_from_dict(inputs["cluster"]),
        overrides=inputs.get("overrides") or {},
        gpus=inputs.get("gpus"),
        global_batch=inputs.get("global_batch"),
        headroom=float(inputs.get("memory_headroom", 0.1)),
        max_tp=inputs.get("max_tp"),
        min_dp=int(inputs.get("min_dp", 1)),
        cross_node_tp=bool(inputs.get("cross_node_tp", False)),
        workers=1,
        progress=progress,
    )
    return {"search": result.to_json()}


RUNNERS: dict[str, Callable[[dict[str, Any], Progress], dict[str, Any]]] = {
    "plan": run_plan,
    "verify": run_verify,
    "compare": run_compare,
    "search": run_search,
    "measure": run_measure,
    "import": run_import,
}
