"""Shardlab's predictions for the published Megatron-LM runs of `bench.fidelity_data`.

Every row is planned as the paper ran it: the `gpt` preset at the paper's size (eager
attention with dropout 0.1, bf16 or fp16), mesh `pp=P,dp=D,tp=8` (tensor parallelism inside a
node, pipeline stages across nodes), templates `dp` + `megatron_tp` (+ `sequence_parallel`),
the paper's recomputation and, with a pipeline, its schedule, micro-batches and chunks per
stage (balance "even": the same layer count per chunk, as Megatron-LM splits them). Tied
embeddings cannot span pipeline stages in Shardlab, so pipelined rows untie them: Megatron-LM
keeps a copy of the word embeddings on the last stage and all-reduces its gradient with the
first stage once per iteration, so the untied plan holds the same V*h parameters there and
leaves out only that one all-reduce (V*h/t fp32 values between two nodes, ~30 ms).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from bench.fidelity_data import (
    LAYER_MICRO_BATCH,
    LAYER_MODEL,
    EndToEndRow,
    GptShape,
    LayerRow,
    Parallel,
)
from shardlab.cost.clusters import Cluster, load_cluster
from shardlab.cost.model import PlanCost
from shardlab.cost.pipeline_slots import PipelineSlotCost
from shardlab.cost.timeline import Event
from shardlab.ir import Graph
from shardlab.models import build_model
from shardlab.plan import build_plan
from shardlab.recompute import OP_SUFFIX
from shardlab.strategy import Strategy

CLUSTER_FAMILY = "a100-80g"
DROPOUT = 0.1


@dataclass(frozen=True, slots=True)
class Prediction:
    """Shardlab's figures for one row: step time, where it goes, memory, planning time.

    `terms` splits the step (seconds): `compute` (the busiest stage's forward and backward
    units, tensor-parallel comm and recomputation included; in a flat plan everything up to
    the optimizer), `recompute` (the part of compute that replays the forward), `bubble`
    (that stage's idle time inside the schedule: fill, drain and waits for sends) and `tail`
    (optimizer step, and the data-parallel gradient all-reduce before it)."""

    time_s: float
    terms: dict[str, float]
    peak_memory_bytes: int
    capacity_bytes: int
    plan_s: float
    model_flops: float  # Shardlab's own count of one iteration's model FLOPs
    #: seconds of the pipeline's sends per micro-batch on the busiest stage, had each one
    #: blocked its stage (2 per chunk: after the forward unit and after the backward unit)
    p2p_per_microbatch_s: float = 0.0
    microbatches: int = 1

    @property
    def fits(self) -> bool:
        """The worst stage's predicted peak fits the device memory."""
        return self.peak_memory_bytes <= self.capacity_bytes


def model_graph(shape: GptShape, batch: int, dtype: str, tied: bool) -> Graph:
    """The `gpt` preset at a paper's size for a global batch."""
    overrides: dict[str, Any] = {
        "layers": shape.layers, "hidden": shape.hidden, "heads": shape.heads,
        "ffn": 4 * shape.hidden, "vocab": shape.vocab, "seq": shape.seq, "batch": batch,
        "dropout": DROPOUT, "attention": "eager", "tie_embeddings": tied, "dtype": dtype,
    }  # fmt: skip
    return build_model("gpt", overrides)


def strategy_for(p: Parallel) -> Strategy:
    """Mesh pp x dp x tp (axes of size 1 left out), Megatron templates, the paper's options."""
    axes = [("pp", p.pp), ("dp", p.dp), ("tp", p.tp)]
    mesh = ",".join(f"{name}={n}" for name, n in axes if n > 1)
    templates = (["dp"] if p.dp > 1 else []) + ["megatron_tp"]
    templates += ["sequence_parallel"] if p.sequence_parallel else []
    options: dict[str, Any] = {"recompute": p.recompute}
    if p.pp > 1:
        options["pipeline"] = {
            "schedule": p.schedule,
            "microbatches": p.microbatches,
            "virtual_stages": p.virtual_stages,
            "balance": "even",
        }
    return Strategy.build(mesh, templates, options=options)


def cluster_for(gpus: int, cluster: Cluster | None = None) -> Cluster:
    """The `a100-80g` preset with gpus / 8 nodes, or `cluster`'s figures at that shape."""
    shaped = load_cluster(f"{CLUSTER_FAMILY}-{gpus // 8}x8")
    if cluster is None:
        return shaped
    return dataclasses.replace(cluster, name=shaped.name, nodes=shaped.nodes)


def predict(row: EndToEndRow, cluster: Cluster | None = None) -> Prediction:
    """Plan `row` as published and read its predicted step."""
    p = row.parallel
    started = time.perf_counter()
    graph = model_graph(row.model, p.global_batch, row.dtype, tied=p.pp == 1)
    plan = build_plan(graph, strategy_for(p), cluster=cluster_for(row.gpus, cluster))
    plan_s = time.perf_counter() - started
    if plan.pipeline is not None:
        assert plan.pipeline.cost is not None
        return _pipelined(plan.pipeline.cost, plan_s)
    assert plan.cost is not None
    return _flat(plan.cost, plan_s)


def _pipelined(cost: PipelineSlotCost, plan_s: float) -> Prediction:
    last = max(cost.stages, key=lambda s: s.end_s + s.tail_s)
    # the replayed share of the units, by FLOPs: hardware FLOPs less model FLOPs
    replayed = 1 - cost.model_flops / cost.hardware_flops if cost.hardware_flops else 0.0
    terms = {
        "compute": last.busy_s,
        "recompute": max(0.0, replayed) * last.busy_s,
        "bubble": last.end_s - last.busy_s,
        "tail": last.tail_s,
    }
    hops = list(cost.p2p_s.values())
    blocking = 2 * cost.virtual_stages * sum(hops) / len(hops) if hops else 0.0
    return Prediction(cost.step_time, terms, cost.peak_memory_bytes, int(cost.cluster.hbm_bytes),
                      plan_s, cost.model_flops, blocking, cost.microbatches)  # fmt: skip


def _flat(cost: PlanCost, plan_s: float) -> Prediction:
    events = cost.timeline.events_of(0)
    tail_start = min((e.start for e in events if e.role == "optimizer"), default=cost.step_time)
    recompute = sum(e.duration for e in events if e.name.endswith(OP_SUFFIX))
    terms = {
        "compute": tail_start,
        "recompute": recompute,
        "bubble": 0.0,
        "tail": cost.step_time - tail_start,
    }
    return Prediction(cost.step_time, terms, cost.memory.peak_bytes,
                      int(cost.cluster.hbm_bytes), plan_s, cost.model_flops)  # fmt: skip


# -- one layer (Table 4) ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LayerPrediction:
    """Predicted forward and backward milliseconds of one layer, as Table 4 times them."""

    forward_ms: float
    backward_ms: float


#: Layers of the stack Table 4's layer is timed in: layer 2 between layers 1 and 3.
_STACK = 4
_TIMED = 2


def predict_layer(row: LayerRow, cluster: Cluster | None = None) -> LayerPrediction:
    """One 22B layer (t 8, micro-batch 4) inside a 4-layer stack: its forward is the time
    from the end of the previous layer's forward to the end of its own, its backward the
    time from the end of the next layer's backward to the end of its own (recomputation
    and exposed tensor-parallel comm included, as a CUDA-event timing of the layer has)."""
    shape = dataclasses.replace(LAYER_MODEL, layers=_STACK)
    graph = model_graph(shape, LAYER_MICRO_BATCH, "bfloat16", tied=True)
    parallel = Parallel(8, 1, 1, LAYER_MICRO_BATCH, LAYER_MICRO_BATCH, row.recompute,
                        row.sequence_parallel)  # fmt: skip
    plan = build_plan(graph, strategy_for(parallel), cluster=cluster_for(8, cluster))
    assert plan.cost is not None
    events = plan.cost.timeline.events_of(0)
    before, mine, after = (_ends(events, i) for i in (_TIMED - 1, _TIMED, _TIMED + 1))
    return LayerPrediction((mine[0] - before[0]) * 1e3, (mine[1] - after[1]) * 1e3)


def _ends(events: list[Event], layer: int) -> tuple[float, float]:
    """When layer `layer`'s forward ends and when its backward ends."""
    scope = f"layers.{layer}"
    mine = [e for e in events if e.scope == scope or e.scope.startswith(scope + ".")]
    forward = max(e.end for e in mine if e.role == "forward")
    return forward, max(e.end for e in mine)
