"""Gradient accumulation on a mesh without a `pp` axis (issue 34, item 7): the strategy
option `microbatches`, planned as a schedule of one stage; activations of one micro-batch,
the gradient reductions overlapping only the last micro-batch's backward, and the step
verified against one device."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardlab.comparison import compare
from shardlab.cost.pipeline_units import fragment_timeline
from shardlab.models import build_model
from shardlab.plan import build_plan, load_plan, save_plan
from shardlab.runtime.verify import verify
from shardlab.strategy import Strategy, StrategyError

TINY = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 128,
        "seq": 8, "batch": 8}  # fmt: skip


def test_the_option_is_checked_and_names_itself() -> None:
    s = Strategy.build("dp=8", ["dp", "zero1"], options={"microbatches": 4})
    assert s.accumulation == 4 and s.pipelined and s.mesh.axis_names == ("dp",)
    inner = s.schedule_strategy()
    assert str(inner.mesh) == "pp=1,dp=8" and inner.options["pipeline"]["microbatches"] == 4
    assert "microbatches" not in inner.options
    assert not Strategy.build("dp=8", ["dp"], options={"microbatches": 1}).pipelined
    for bad, says in ((0, "must be a positive integer, got 0"), (True, "got True"),
                      ("2", "got '2'"), (70000, "more than the limit of 65536")):  # fmt: skip
        with pytest.raises(StrategyError, match=says) as info:
            Strategy.build("dp=8", ["dp"], options={"microbatches": bad})
        assert info.value.detail["option"] == "microbatches"
    with pytest.raises(StrategyError, match="mesh pp=2,dp=4 pipelines, and its micro-batches"):
        Strategy.build("pp=2,dp=4", ["dp"], options={"microbatches": 4})


def test_activations_follow_one_micro_batch_and_the_reductions_overlap_the_last_backward():
    """llama3-8b (2 layers, batch 64) with ZeRO-1 on dp=8: 2 and 4 micro-batches of 4 and 2
    sequences per rank. Activations halve with the micro-batch; the model states do not
    move; the step is K forwards and backwards plus what the gradient reduce-scatters and
    the optimizer add after the last backward, less than they take on their own."""
    model = build_model("llama3-8b", {"layers": 2, "batch": 64})
    plans = {
        k: build_plan(
            model,
            Strategy.build("dp=8", ["dp", "zero1"], options={"microbatches": k}),
            cluster="h100-sxm-1x8",
        )
        for k in (2, 4)
    }
    two, four = (plans[k].pipeline.cost for k in (2, 4))
    assert two is not None and four is not None
    (s2,), (s4,) = two.stages, four.stages
    assert s2.memory.activations == pytest.approx(2 * s4.memory.activations, rel=1e-4)
    assert s4.memory.activations / 2**30 == pytest.approx(9.29, abs=0.01)
    assert s2.memory.model_state == s4.memory.model_state
    assert s2.memory.in_flight == s4.memory.in_flight == (1,)
    for k, cost, stage in ((2, two, s2), (4, four, s4)):
        assert cost.step_time == pytest.approx(
            k * (stage.forward_s[0] + stage.backward_s[0]) + stage.tail_s, rel=1e-9
        )
    plan = plans[4]
    summary = plan.summary()
    assert summary["mesh"] == "dp=8" and summary["pipeline"]["accumulation"] is True
    # the tail on its own (reduce-scatters, optimizer, all-gathers) against what it adds
    # to the last backward: the reduce-scatters start as each gradient is ready
    cost = plan.pipeline.cost
    assert cost is not None
    mesh = plan.program.mesh
    kinds = {"reduce_scatter", "adamw", "all_gather", "local_slice"}
    tail = [i for i, op in enumerate(plan.program.ops) if op.kind in kinds]
    alone = fragment_timeline(plan.program, tail, mesh, cost.cluster, None).step_time
    assert s4.tail_s < 0.7 * alone  # 14.5 ms of 23.4 ms
    assert s4.tail_s == pytest.approx(0.0145, abs=0.001)


@pytest.mark.parametrize(
    ("mesh", "templates", "backend"),
    [("dp=2,tp=2", ["dp", "zero1", "megatron_tp"], "simulated"),
     ("dp=2", ["dp", "fsdp"], "torch")],
)  # fmt: skip
def test_accumulated_step_matches_one_device(mesh: str, templates: list[str], backend: str):
    """Two micro-batches accumulated, then AdamW: every parameter, gradient and state equals
    the one-device step of the whole batch (simulated mesh, and gloo ranks)."""
    strategy = Strategy.build(mesh, templates, options={"microbatches": 2})
    report = verify(build_model("llama3-8b", TINY), strategy, backend=backend)
    assert report.ok, report.first_divergence
    assert report.summary["microbatches"] == 2 and report.summary["pp"] == 1
    assert report.summary["compared"] > 100


def test_compare_weighs_accumulation_against_the_whole_batch(tmp_path: Path) -> None:
    """A saved accumulated plan keeps its cluster (a schedule's cost holds it) and loads
    costed; compare shows both steps and peaks: 4 micro-batches of llama3-8b (2 layers) on
    dp=8 with ZeRO-1 take 0.5% longer than the whole batch and hold 44% of its peak."""
    model = build_model("llama3-8b", {"layers": 2, "batch": 64})
    flat = build_plan(model, Strategy.build("dp=8", ["dp", "zero1"]), cluster="h100-sxm-1x8")
    accumulated = Strategy.build("dp=8", ["dp", "zero1"], options={"microbatches": 4})
    saved = save_plan(build_plan(model, accumulated, cluster="h100-sxm-1x8"), tmp_path / "b.json")
    loaded = load_plan(saved)
    assert loaded.pipeline is not None and loaded.pipeline.cost is not None
    rows = {d.name: d for d in compare(flat, loaded, "a", "b").headline}
    step = rows["step time (s)"]
    assert step.b / step.a == pytest.approx(1.0046, abs=0.001)
    memory = {d.name: d for d in compare(flat, loaded, "a", "b").memory}
    assert memory["peak"].b / memory["peak"].a == pytest.approx(0.436, abs=0.002)


def test_fsdp_and_zero2_reduce_every_micro_batch_zero1_once() -> None:
    """torchtitan's trainer leaves FSDP2's gradient sync on for every accumulation step (it
    reduce-scatters each micro-batch and keeps the sharded sum), DeepSpeed ZeRO-2 does the
    same; Megatron's distributed optimizer (zero1) reduces once, from its whole buffer. So
    the time after the last backward grows with the micro-batches under FSDP and ZeRO-2 by
    what one micro-batch's reductions add to its backward, and not under ZeRO-1."""
    model = build_model("llama3-8b", {"layers": 2, "batch": 64})
    tails = {}
    for templates in (["dp", "zero1"], ["fsdp"], ["dp", "zero2"]):
        for k in (2, 4):
            s = Strategy.build("dp=8", templates, options={"microbatches": k})
            cost = build_plan(model, s, cluster="h100-sxm-1x8").pipeline.cost
            assert cost is not None
            tails[templates[-1], k] = cost.stages[0].tail_s
    assert tails["zero1", 4] == pytest.approx(tails["zero1", 2], rel=1e-9)
    for recipe in ("fsdp", "zero2"):
        each = (tails[recipe, 4] - tails[recipe, 2]) / 2  # two more micro-batches
        assert each > 0.005  # the head's gradient, reduced at the end of every backward
