"""The cost of a tied weight's gradient all-reduce between pipeline stages (GPT's embedding).

The slot model prices it as one all-reduce of the gradient's local block between the first
ranks of the stages holding the weight, after the later of their last backward units and
before their tails; the schedule view shows it as a comm of both stages; memory counts the
replica on each; the detailed model simulates its sends and receives.
"""

from __future__ import annotations

import math

import pytest

from shardlab.autodiff import training_graph
from shardlab.cost.clusters import load_cluster
from shardlab.cost.comm import collective_time
from shardlab.cost.pipeline_cost import cost_pipeline
from shardlab.cost.pipeline_slots import PipelineSlotCost
from shardlab.export.schedule_view import schedule_json
from shardlab.models import build_model
from shardlab.passes.pipeline import build_pipeline
from shardlab.plan import build_plan
from shardlab.strategy import Strategy

GPT = {"layers": 4, "hidden": 256, "heads": 8, "seq": 128, "batch": 8, "vocab": 1024,
       "dtype": "float32"}  # fmt: skip
OPTIONS = {"pipeline": {"schedule": "1f1b", "microbatches": 4}}
CLUSTER = "h100-sxm-1x8"


def _slot_cost(tied: bool, mesh: str = "pp=4,dp=2", templates: tuple[str, ...] = ("dp",),
               dtype: str = "float32") -> PipelineSlotCost:  # fmt: skip
    model = build_model("gpt2", {**GPT, "tie_embeddings": tied, "dtype": dtype})
    plan = build_plan(model, Strategy.build(mesh, list(templates), options=OPTIONS),
                      cluster=CLUSTER)  # fmt: skip
    assert plan.pipeline is not None and plan.pipeline.cost is not None
    return plan.pipeline.cost


@pytest.mark.parametrize(
    ("mesh", "templates", "shards"), [("pp=4,dp=2", ("dp",), 1), ("pp=4,tp=2", ("megatron_tp",), 2)]
)
def test_the_slot_cost_includes_the_tied_all_reduce(
    mesh: str, templates: tuple[str, ...], shards: int
) -> None:
    cost = _slot_cost(True, mesh, templates)
    (tied,) = cost.tied
    assert (tied.param, tied.stages, tied.ranks) == ("embed.weight", (0, 3), (0, 6))
    # one rank's block of the float32 gradient (vocab-sharded under tensor parallelism)
    assert tied.bytes == GPT["vocab"] * GPT["hidden"] * 4 / shards
    cluster = load_cluster(CLUSTER)
    assert tied.seconds == collective_time("all_reduce", tied.bytes, (0, 6), cluster) > 0
    first, last = cost.stages[0], cost.stages[3]
    assert tied.start_s == max(first.end_s, last.end_s)
    assert first.tied_end_s == last.tied_end_s == tied.end_s
    assert cost.stages[1].tied_end_s == cost.stages[2].tied_end_s == 0.0
    assert cost.step == max(s.tail_start_s + s.tail_s for s in cost.stages)
    assert cost.step >= tied.end_s + min(first.tail_s, last.tail_s)
    summary = cost.summary()["tied_all_reduces"]
    assert summary[0]["bytes"] == tied.bytes and summary[0]["kind"] == "all_reduce"


def test_the_schedule_view_shows_it_as_a_comm_that_explains_itself() -> None:
    cost = _slot_cost(True)
    view = schedule_json(cost)
    (tied,) = view["tied_all_reduces"]
    assert [len(s["comms"]) for s in view["stages"]] == [1, 0, 0, 1]
    for s in (0, 3):
        comm = view["stages"][s]["comms"][0]
        assert comm == tied
        assert view["stages"][s]["tail_start_s"] == comm["end"] > comm["start"] > 0
    assert (tied["kind"], tied["stream"], tied["name"]) == (
        "all_reduce", "comm:pp", "tied_all_reduce:embed.weight")  # fmt: skip
    assert tied["reason"] == (
        "tied weight embed.weight is read on stages 0 and 3: its gradient is all-reduced "
        "between them (Megatron-LM's embedding group)"
    )
    assert schedule_json(_slot_cost(False))["tied_all_reduces"] == []


def test_memory_counts_the_replica_on_each_stage() -> None:
    """The untied head has its own weight of the tied one's shape: each stage holds as many
    parameter bytes either way, so the tied last stage counts its replica."""
    tied, untied = _slot_cost(True), _slot_cost(False)
    for a, b in zip(tied.stages, untied.stages, strict=True):
        assert a.memory.model_state == b.memory.model_state
    head = GPT["vocab"] * GPT["hidden"]
    assert tied.stages[3].memory.model_state["parameters"] > head * 4


def test_the_detailed_cost_simulates_its_sends_after_the_last_backward() -> None:
    m = 4
    micro = build_model("gpt2", {**GPT, "batch": GPT["batch"] // m})
    pipeline = build_pipeline(micro, Strategy.build("pp=4,dp=2", ["dp"]), microbatches=m)
    cost = cost_pipeline(pipeline, training_graph(micro), load_cluster(CLUSTER))
    for stage, rank in ((0, 0), (3, 6)):
        events = cost.timeline.events_of(rank)
        (send,) = [e for e in events if e.name.startswith(f"s{stage}/tied_all_reduce:")
                   and e.kind == "send"]  # fmt: skip
        assert send.bytes == GPT["vocab"] * GPT["hidden"] * 4 and send.end > send.start
        backward = [e for e in events if e.role == "backward" and e.name.endswith(f"#{m - 1}")]
        adamw = next(e for e in events if e.name == f"s{stage}/embed.weight.adamw")
        assert max(e.end for e in backward) <= send.start < adamw.start
    assert math.isclose(cost.step_time, max(e.end for e in cost.timeline.events_of(6)),
                        rel_tol=0.5)  # fmt: skip


def test_a_plan_names_its_tied_weights_without_a_cluster() -> None:
    model = build_model("gpt2", GPT)
    plan = build_plan(model, Strategy.build("pp=2,tp=2", ["megatron_tp"], options=OPTIONS))
    assert plan.pipeline is not None and plan.pipeline.cost is None
    (tied,) = plan.summary()["pipeline"]["tied_weights"]
    assert tied["param"] == "embed.weight" and tied["stages"] == [0, 1]
    assert tied["reason"].startswith("tied weight embed.weight is read on stages 0 and 1")


@pytest.mark.parametrize(
    ("mesh", "templates", "shards"), [("pp=4,dp=2", ("dp",), 1), ("pp=4,tp=2", ("megatron_tp",), 2)]
)
def test_a_bf16_tied_weight_all_reduces_its_float32_main_grad(
    mesh: str, templates: tuple[str, ...], shards: int
) -> None:
    """bf16 training sums the tied weight's gradient as Megatron-LM's float32 main_grad:
    the slot cost's all-reduce moves 4 bytes per element, as the detailed model's sends."""
    cost = _slot_cost(True, mesh, templates, dtype="bfloat16")
    (tied,) = cost.tied
    assert tied.bytes == GPT["vocab"] * GPT["hidden"] * 4 / shards
    cluster = load_cluster(CLUSTER)
    assert tied.seconds == collective_time("all_reduce", tied.bytes, (0, 6), cluster)
    m = 4
    micro = build_model("gpt2", {**GPT, "batch": GPT["batch"] // m, "dtype": "bfloat16"})
    pipeline = build_pipeline(micro, Strategy.build(mesh, list(templates)), microbatches=m)
    detailed = cost_pipeline(pipeline, training_graph(micro), cluster)
    (send,) = [e for e in detailed.timeline.events_of(6) if e.kind == "send"
               and e.name.startswith("s3/tied_all_reduce:")]  # fmt: skip
    assert send.bytes == tied.bytes
