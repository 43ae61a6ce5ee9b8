"""Pipelined steps from unit costs laid out as schedule slots: bubble, in-flight memory, and
agreement with the detailed simulation of every micro-batch's program."""

from __future__ import annotations

import pytest

from shardlab.autodiff import training_graph
from shardlab.cost.clusters import load_cluster
from shardlab.cost.pipeline_cost import cost_pipeline
from shardlab.cost.pipeline_layout import run_schedule
from shardlab.cost.pipeline_slots import cost_pipeline_slots
from shardlab.lower import lower
from shardlab.models import build_model
from shardlab.passes.pipeline import build_pipeline, stage_strategy
from shardlab.passes.pipeline_schedule import (
    PipelineError,
    PipelineOptions,
    bubble_fraction,
    schedule_units,
)
from shardlab.passes.pipeline_stages import assign_layers
from shardlab.passes.send_wait import pipeline_send_wait, with_send_waits
from shardlab.plan import build_plan
from shardlab.spmd.complete import complete
from shardlab.strategy import Strategy, StrategyError

CASES = [("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1), ("1f1b", 8, 3, 1), ("interleaved", 4, 8, 2),
         ("interleaved", 2, 4, 3)]  # fmt: skip


@pytest.mark.parametrize(("schedule", "pp", "m", "v"), CASES)
def test_equal_units_and_free_sends_give_the_textbook_bubble(
    schedule: str, pp: int, m: int, v: int
) -> None:
    """Each stage's forward 1/v and backward 2/v (v chunks share one layer stack's work):
    the idle share is (p - 1) / (v m + p - 1), 1F1B and GPipe alike (Narayanan et al.)."""
    orders = [schedule_units(schedule, pp, s, m, v) for s in range(pp)]
    times = {(g, phase): t / v for g in range(pp * v) for phase, t in (("F", 1.0), ("B", 2.0))}
    ends, busy = run_schedule(orders, pp, v, times, {})
    assert busy == pytest.approx([3.0 * m] * pp)
    assert 1 - max(busy) / max(ends) == pytest.approx(bubble_fraction(pp, m, v))


def test_sends_lie_on_the_critical_path() -> None:
    """Sends are not overlapped with the next unit: the fill and the drain cross every
    boundary once (2 (p - 1) hops), and in 1F1B's steady state a stage waits for its
    neighbour's unit and the hop between them (p = 2, m = 2: exactly 9 + 2h)."""
    times = {(g, phase): t for g in range(4) for phase, t in (("F", 1.0), ("B", 2.0))}
    pair = [schedule_units("1f1b", 2, s, 2) for s in range(2)]
    ends, _ = run_schedule(pair, 2, 1, times, {(0, 1, "F"): 0.5, (1, 0, "B"): 0.5})
    assert max(ends) == pytest.approx(9 + 2 * 0.5)
    pp, m = 4, 8
    orders = [schedule_units("1f1b", pp, s, m) for s in range(pp)]
    hops = {(g, g + 1, "F"): 0.5 for g in range(pp - 1)} | {
        (g + 1, g, "B"): 0.5 for g in range(pp - 1)
    }
    base, _ = run_schedule(orders, pp, 1, times, {})
    slow, _ = run_schedule(orders, pp, 1, times, hops)
    assert max(base) + 2 * (pp - 1) * 0.5 <= max(slow) <= max(base) + 2 * (m + pp - 1) * 0.5


SMALL = {"layers": 8, "hidden": 256, "heads": 8, "kv_heads": 4, "ffn": 512, "vocab": 1024,
         "seq": 512, "batch": 16}  # fmt: skip


def _slots(mesh: str, schedule: str, m: int, v: int = 1, templates: tuple[str, ...] = ("dp",)):
    strategy = Strategy.build(mesh, list(templates))
    micro = build_model("llama3-8b", {**SMALL, "batch": SMALL["batch"] // m})
    training = training_graph(micro)
    program = lower(complete(training, stage_strategy(strategy)))
    pp = strategy.mesh.axis_size("pp")
    assignment = assign_layers(training, pp, v)
    cluster = load_cluster("h100-sxm-1x8")
    cost = cost_pipeline_slots(program, training, assignment, strategy.mesh, cluster,
                               schedule=schedule, microbatches=m)  # fmt: skip
    return cost, micro, strategy, training


@pytest.mark.parametrize(("schedule", "m", "v"), [("1f1b", 4, 1), ("gpipe", 4, 1),
                                                  ("interleaved", 4, 2)])  # fmt: skip
def test_slots_agree_with_simulating_every_microbatch(schedule: str, m: int, v: int) -> None:
    """The detailed model builds every micro-batch's ops per stage and simulates them all;
    the slot model costs each unit once. The detailed programs sum each micro-batch's
    gradients with separate `add` ops, which Megatron-LM fuses into the weight-gradient
    GEMM and the slot model does not charge: without them every stage's work agrees within
    5%, and the step within 10% (the rest is the detailed model's blocking receives)."""
    slots, micro, strategy, training = _slots("pp=4,dp=2", schedule, m, v)
    pipeline = build_pipeline(micro, strategy, microbatches=m, schedule=schedule,
                              virtual_stages=v)  # fmt: skip
    final, _ = pipeline_send_wait(with_send_waits(pipeline))
    detailed = cost_pipeline(final, training, load_cluster("h100-sxm-1x8"))
    sums = [
        sum(e.duration for e in detailed.timeline.events_of(r) if ".acc_add#" in e.name)
        for r in detailed.stage_ranks
    ]
    for stage, busy, acc in zip(slots.stages, detailed.busy, sums, strict=True):
        assert stage.busy_s + stage.tail_s == pytest.approx(busy - acc, rel=0.05)
    assert slots.step_time == pytest.approx(detailed.step_time - max(sums), rel=0.10)
    assert slots.model_flops == detailed.model_flops
    assert slots.tokens == detailed.tokens


def test_memory_per_stage_holds_the_microbatches_in_flight() -> None:
    """1F1B: stage s holds p - s micro-batches' activations at its worst (Korthikanti et al.:
    the first stage holds p, i.e. all L layers' worth); GPipe holds all m on every stage."""
    one, *_ = _slots("pp=4,dp=2", "1f1b", 8)
    assert [s.memory.in_flight for s in one.stages] == [(4,), (3,), (2,), (1,)]
    gpipe, *_ = _slots("pp=4,dp=2", "gpipe", 8)
    assert [s.memory.in_flight for s in gpipe.stages] == [(8,)] * 4
    for st in one.stages:
        mem = st.memory
        assert mem.activations == mem.in_flight[0] * mem.activations_per_microbatch[0]
        assert mem.peak_bytes == sum(mem.model_state.values()) + mem.activations + (mem.temporaries)
    inter, *_ = _slots("pp=2,dp=2", "interleaved", 4, 2)
    # interleaved: 2(p-1-s) + (v-1)p warm-up forwards spread over the stage's two chunks
    assert [sum(s.memory.in_flight) for s in inter.stages] == [5, 3]


def test_a_pipelined_plan_reports_memory_per_stage_and_checks_its_options() -> None:
    model = build_model("llama3-8b", SMALL)
    options = {"pipeline": {"schedule": "1f1b", "microbatches": 4, "balance": "even"}}
    plan = build_plan(model, Strategy.build("pp=2,dp=4", ["dp"], options=options),
                      cluster="h100-sxm-1x8")  # fmt: skip
    assert plan.cost is None and plan.pipeline is not None and plan.pipeline.cost is not None
    summary = plan.summary()["pipeline"]
    assert [s["layers"] for s in summary["stages"]] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert summary["stages"][0]["memory"]["in_flight"] == [2]
    assert summary["fits"] and summary["step_time_s"] == plan.pipeline.cost.step_time
    assert plan.training.type_of("tokens").shape[0] == SMALL["batch"] // 4 // 1
    with pytest.raises(StrategyError, match="option 'pipeline' applies to a mesh with a 'pp'"):
        Strategy.build("dp=8", ["dp"], options=options)
    bad = {"pipeline": {"schedule": "zigzag"}}
    with pytest.raises(PipelineError, match="'schedule' must be one of gpipe, 1f1b, interleaved"):
        Strategy.build("pp=2,dp=4", ["dp"], options=bad)
    with pytest.raises(PipelineError, match="pipeline option 'chunks' is unknown"):
        PipelineOptions.from_options({"pipeline": {"chunks": 2}}, 2)
    uneven = {"pipeline": {"balance": "even", "microbatches": 4}}
    with pytest.raises(PipelineError, match="8 layers to divide into 3 chunks"):
        build_plan(model, Strategy.build("pp=3,dp=2", ["dp"], options=uneven))
