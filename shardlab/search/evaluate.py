"""One candidate of a search, planned and costed: its step, memory and why it lost.

`evaluate` builds the candidate's plan with `build_plan` on the cluster (passes and their
cost guard included, so a candidate is judged as the plan a user would get) and keeps the
figures a ranking needs. A candidate the planner refuses (a dim that does not divide, a
schedule that cannot run) is kept with the planner's message as its reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardlab.cost.clusters import Cluster
from shardlab.cost.model import PlanCost
from shardlab.cost.timeline import Event
from shardlab.errors import ShardlabError
from shardlab.ir import Graph, OpRole
from shardlab.plan import build_plan
from shardlab.program import DistProgram
from shardlab.search.space import Candidate


@dataclass
class Evaluation:
    """What one candidate costs, or why it could not be planned."""

    candidate: Candidate
    step_time_s: float | None = None
    peak_memory_bytes: int | None = None
    capacity_bytes: int = 0
    usable_bytes: int = 0  # capacity less the headroom asked for
    mfu: float | None = None
    #: step-time terms for "why this one": compute (of which the optimizer's), comm, exposed
    #: comm (of which on the tensor-parallel axis, `exposed_tp_s`); the repeated layers' share
    #: (`layers_s`, `layer_work`; their forward's and backward's compute,
    #: `layers_forward_s` and `layers_backward_s`: `layer_compute`) and the modules
    #: before and after them (`first_s`,
    #: `last_s`: `edge_work`);
    #: a pipeline's bubble fraction and when its last stage ends its forward and backward
    #: units (`stages_end_s`: the step before the stages' tails, `bound.sibling_work`), when
    #: the first stage's tail starts and the least its gradient reductions take there
    #: (`first_tail_at_s`, `first_reduce_s`: `StageCost.reduce_floor_s`), and one layer's
    #: forward and backward unit of one micro-batch (`layer_units`)
    terms: dict[str, float] = field(default_factory=dict)
    comm_bytes_per_rank: float = 0.0
    error: str | None = None
    #: the two shallow depths the figures were drawn from (`screen`), None for a full plan
    screened: tuple[int, int] | None = None
    #: the other candidates whose plans are this one's exactly (`identical`), merged into
    #: this row of the ranking
    same_plan: list[Candidate] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return self.error is None and (self.peak_memory_bytes or 0) <= self.usable_bytes

    @property
    def reason(self) -> str | None:
        """Why it cannot be used: the planner's refusal, or the memory it needs."""
        if self.error is not None:
            return self.error
        if not self.fits:
            gib = 1 << 30
            return (f"needs {(self.peak_memory_bytes or 0) / gib:.1f} GiB of "
                    f"{self.usable_bytes / gib:.1f} GiB usable")  # fmt: skip
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            **self.candidate.to_json(),
            "label": self.candidate.label(),
            "step_time_s": self.step_time_s,
            "peak_memory_bytes": self.peak_memory_bytes,
            "memory_capacity_bytes": self.capacity_bytes,
            "usable_memory_bytes": self.usable_bytes,
            "fits": self.fits,
            "mfu": self.mfu,
            "terms": dict(self.terms),
            "comm_bytes_per_rank": self.comm_bytes_per_rank,
            "reason": self.reason,
            "same_plan": [{**c.to_json(), "label": c.label()} for c in self.same_plan],
        }


def exposed_tp_comm(events: Iterable[Event]) -> float:
    """Seconds the tensor-parallel collectives (stream `comm:tp`) run while no compute does:
    blocking work that every micro-batch of a pipeline stage pays as well."""
    return sum(e.exposed for e in events if e.stream == "comm:tp")


def _in_layers(scope: str) -> bool:
    """Whether a scope is under the repeated layers (`layers.<i>...`)."""
    return scope == "layers" or scope.startswith("layers.")


def layer_work(events: Iterable[Event]) -> float:
    """Seconds of the repeated layers' work (scope `layers`): their compute and their
    exposed tensor-parallel collectives, which a pipeline stage pays for each layer it has."""
    inside = [e for e in events if _in_layers(e.scope)]
    return exposed_tp_comm(inside) + sum(e.duration for e in inside if not e.is_comm)


def layer_compute(events: Iterable[Event], role: OpRole) -> float:
    """Seconds of the repeated layers' compute of one role: the forward's, or the
    backward's (recomputed forward ops included), which a pipeline stage's forward or
    backward unit pays for each layer it has (`bound.one_f_one_b`)."""
    return sum(e.duration for e in events
               if not e.is_comm and e.role == role and _in_layers(e.scope))  # fmt: skip


def edge_work(events: Iterable[Event], program: DistProgram) -> tuple[float, float]:
    """Seconds of the forward and backward work outside the repeated layers (compute and
    exposed tensor-parallel collectives): in the modules before them (the embedding) and
    after them (final norm, head, loss), which a pipeline's first and last stages run."""
    first_layer = next((i for i, op in enumerate(program.ops) if _in_layers(op.scope)), None)
    before = {op.scope.split(".")[0] for op in program.ops[:first_layer]
              if op.scope and op.role == OpRole.FORWARD}  # fmt: skip
    first = last = 0.0
    for e in events:
        if not e.scope or _in_layers(e.scope) or e.role == OpRole.OPTIMIZER:
            continue
        if e.is_comm and e.stream != "comm:tp":
            continue
        seconds = e.exposed if e.is_comm else e.duration
        if e.scope.split(".")[0] in before:
            first += seconds
        else:
            last += seconds
    return first, last


def layer_units(
    unit_s: Mapping[tuple[int, str], float], chunks: Sequence[tuple[int, int]]
) -> dict[str, float]:
    """One layer's forward and backward unit of one micro-batch (`layer_forward_s`,
    `layer_backward_s`): the least over the chunks between the first (the embedding's) and
    the last (the head's) of a unit's seconds per layer; none with two chunks or fewer."""
    middle = range(1, len(chunks) - 1)
    if not middle:
        return {}
    per = {phase: min(unit_s.get((c, phase), 0.0) / (chunks[c][1] - chunks[c][0])
                      for c in middle) for phase in ("F", "B")}  # fmt: skip
    return {"layer_forward_s": per["F"], "layer_backward_s": per["B"]}


def evaluate(candidate: Candidate, model: Graph, cluster: Cluster, headroom: float) -> Evaluation:
    """Plan `candidate` for `model` (the whole global batch) on `cluster` and cost it."""
    usable = int(cluster.hbm_bytes * (1.0 - headroom))
    out = Evaluation(candidate, capacity_bytes=int(cluster.hbm_bytes), usable_bytes=usable)
    try:
        plan = build_plan(model, candidate.strategy(), cluster=cluster)
    except ShardlabError as exc:
        out.error = exc.message
        return out
    cost = plan.cost if plan.pipeline is None else plan.pipeline.cost
    assert cost is not None  # a plan built with a cluster is costed
    if isinstance(cost, PlanCost):
        figures = cost.summary()
        out.terms = {k: figures[k] for k in ("compute_s", "comm_s", "exposed_comm_s")}
        out.terms["optimizer_s"] = sum(
            cost.op_times.get(op.name, 0.0)
            for op in plan.program.ops
            if op.role == OpRole.OPTIMIZER
        )
        events = cost.timeline.events_of(0)
        out.terms["exposed_tp_s"] = exposed_tp_comm(events)
        out.terms["layers_s"] = layer_work(events)
        out.terms["layers_forward_s"] = layer_compute(events, OpRole.FORWARD)
        out.terms["layers_backward_s"] = layer_compute(events, OpRole.BACKWARD)
        out.terms["first_s"], out.terms["last_s"] = edge_work(events, plan.program)
    else:
        first = cost.stages[0]
        out.terms = {"bubble_fraction": cost.bubble_fraction,
                     "stages_end_s": max(s.end_s for s in cost.stages),
                     "first_tail_at_s": first.tail_start_s,
                     "first_reduce_s": first.reduce_floor_s}  # fmt: skip
        assert plan.pipeline is not None
        out.terms.update(layer_units(cost.unit_s, plan.pipeline.assignment.chunks))
    out.step_time_s = cost.step_time
    out.peak_memory_bytes = cost.peak_memory_bytes
    out.mfu = cost.mfu
    out.comm_bytes_per_rank = plan.program.comm_bytes_per_rank()
    return out
