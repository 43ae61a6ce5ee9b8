"""The `measure` job, with no database in sight: a plan's step timed on torch ranks.

What it is for: the service's "Measure on real ranks" (`backend/measuring.py`) queues a
`measure` job; the worker runs `measure_plan` in its child process (the ranks are that
child's processes, as for a torch-backend verification). It rebuilds the plan with its
cluster (the prediction), times it with `shardlab.runtime.measure` (one process per rank,
gloo collectives, numpy compute; a pipeline as its schedule says) and returns what the
worker stores as the plan's artifacts:

- `measured` (`measured_json`): the comparison rows, predicted against measured (step,
  compute, communication, per op kind and per layer) and every rank's median step as op
  spans, columnar, small enough for the timeline view to draw over the predicted lanes;
- `measured_trace`: the measured step as a Chrome trace, one process per rank.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardlab.errors import ExecutionError
from shardlab.graph_json import graph_from_json
from shardlab.plan import Plan
from worker.engine import Progress, _strategy, build

if TYPE_CHECKING:
    from shardlab.runtime.measure import Measurement

MEASURED_FORMAT = "shardlab.measured/1"
#: what the measured ranks compute in: float32, as training runs do
MEASURE_DTYPE = "float32"
#: the collectives and compute of the torch backend (`shardlab.runtime.torchdist`)
BACKEND = "torch (gloo collectives, numpy compute)"


def measured_json(plan: Plan, m: Measurement, device: str) -> dict[str, Any]:
    """A measurement, compact enough to draw: the comparison `rows` (`runtime.measure.Row`:
    name, group, predicted_s, measured_s, error_pct) and every rank's median step as op
    spans, columnar: `ops` is the op table (name, kind, stream, role) and each rank's `op`
    indices into it, with `start_s` and `end_s` since the step's start (the rank's barrier
    exit), in start order."""
    from shardlab.runtime.measure import compare

    table: dict[str, list[Any]] = {"name": [], "kind": [], "stream": [], "role": []}
    index: dict[str, int] = {}
    ranks = []
    for rank in sorted(m.ranks):
        ops = {op.name: op for op in m.program_of(rank).ops}
        cols: dict[str, list[Any]] = {"op": [], "start_s": [], "end_s": []}
        for name, (start, end) in sorted(m.ranks[rank].spans.items(), key=lambda kv: kv[1]):
            if name not in index:
                op = ops[name]
                index[name] = len(table["name"])
                for key, value in (("name", name), ("kind", op.kind), ("stream", op.stream),
                                   ("role", op.role.value)):  # fmt: skip
                    table[key].append(value)
            cols["op"].append(index[name])
            cols["start_s"].append(start * 1e-9)
            cols["end_s"].append(end * 1e-9)
        ranks.append({"rank": rank, "step_s": m.step_time(rank), **cols})
    rows = [row.to_json() for row in compare(plan, m)]
    step = next(r for r in rows if r["group"] == "step")
    return {
        "format": MEASURED_FORMAT,
        "steps": m.steps,
        "warmup": m.warmup,
        "nproc": len(m.ranks),
        "device": device,
        "backend": BACKEND,
        "compute_dtype": MEASURE_DTYPE,
        "mesh": str(plan.strategy.mesh),
        "pipelined": m.pipeline is not None,
        "predicted_step_s": step["predicted_s"],
        "measured_step_s": step["measured_s"],
        "rows": rows,
        "ops": table,
        "ranks": ranks,
    }


def check_measurable(inputs: dict[str, Any]) -> int:
    """The mesh size of the plan to measure; ExecutionError for a plan without a cluster,
    `nproc` other than the mesh size, or a model whose run would hold more than
    `MAX_VERIFICATION_BYTES` (never a scaled-down twin: its times say nothing of the plan)."""
    from shardlab.check import MAX_VERIFICATION_BYTES
    from shardlab.runtime.twin import verification_estimate

    if not inputs.get("cluster"):
        raise ExecutionError("measuring needs the plan's cluster: it is held against the "
                             "predicted step, and this plan was planned without one")  # fmt: skip
    mesh = _strategy(inputs["strategy"]).mesh
    nproc = int(inputs.get("nproc") or mesh.size)
    if nproc != mesh.size:
        raise ExecutionError(f"{nproc} processes asked for, but the mesh {mesh} has "
                             f"{mesh.size} ranks", nproc=nproc, mesh_size=mesh.size)  # fmt: skip
    need = verification_estimate(graph_from_json(inputs["graph"]), mesh.size, MEASURE_DTYPE)
    if need > MAX_VERIFICATION_BYTES:
        raise ExecutionError(
            f"measuring this model on {mesh.size} ranks would hold about {need / 2**30:.2f} "
            f"GiB, over the limit of {MAX_VERIFICATION_BYTES / 2**30:.2f} GiB",
            bytes=need,
            limit=MAX_VERIFICATION_BYTES,
        )
    return mesh.size


def measure_plan(inputs: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """Time the plan's step on one torch process per rank (`steps` after one warm-up) and
    compare it with the prediction of its cluster (`check_measurable` first):
    `{"measured": measured_json, "trace": measured_trace}`."""
    from shardlab.runtime.measure import measure, measured_trace

    size = check_measurable(inputs)
    plan = build(inputs, progress, (0.0, 0.3))
    steps, device = int(inputs.get("steps") or 5), str(inputs.get("device") or "cpu")
    progress(0.3, f"timing {steps} steps (after 1 warm-up) on {size} torch ranks ({device})")
    m = measure(plan, steps=steps, warmup=1, dtype=MEASURE_DTYPE, device=device)
    progress(0.9, "comparing with the prediction")
    return {"measured": measured_json(plan, m, device), "trace": measured_trace(m)}
