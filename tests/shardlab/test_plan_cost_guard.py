"""Costed plans under the cost guard (`shardlab.passes.guard` via `build_plan`): no pass makes
the predicted step slower, a pass that would is declined and says why, the bucket size is
chosen by cost, and what the passes change still verifies against one device."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from shardlab.autodiff import training_graph
from shardlab.cli import app
from shardlab.cost.clusters import Cluster, Link, load_cluster
from shardlab.cost.pipeline_cost import PipelineCost, cost_pipeline
from shardlab.models import build_model
from shardlab.passes import data_parallel as dp
from shardlab.passes.guard import same_program
from shardlab.passes.pipeline import build_pipeline
from shardlab.passes.pipeline_passes import guarded_stage_pass_steps
from shardlab.passes.send_wait import with_send_waits
from shardlab.plan import Plan, build_plan
from shardlab.runtime.verify import verify
from shardlab.strategy import Strategy

TINY = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 64, "seq": 8,
        "batch": 8}  # fmt: skip
#: backend/demo.py's DEMO_PLANS, the full-size llama3-8b ones cut to 4 layers (the benchmark
#: `bench/bench_pass_guard.py` plans them at full size), and small dp / tp / ZeRO plans
PLANS = {
    "demo llama3-8b-tiny dp2-tp2": (TINY, "dp=2,tp=2", ["dp", "megatron_tp"], "h100-sxm-1x4"),
    "demo llama3-8b dp8-tp8+sp (4 layers)": (
        {"batch": 64, "layers": 4},
        "dp=8,tp=8",
        ["dp", "megatron_tp", "sequence_parallel"],
        "h100-sxm-8x8",
    ),
    "demo llama3-8b fsdp64 (4 layers)": (
        {"batch": 64, "layers": 4},
        "dp=64",
        ["dp", "fsdp"],
        "h100-sxm-8x8",
    ),
    "tiny dp4": (TINY, "dp=4", ["dp"], "h100-sxm-1x4"),
    "tiny dp4 zero1": (TINY, "dp=4", ["dp", "zero1"], "h100-sxm-1x4"),
    "tiny dp2 zero2": (TINY, "dp=2", ["dp", "zero2"], "h100-sxm-1x4"),
    "llama3-8b 2 layers dp8 (two nodes)": (
        {"layers": 2, "batch": 8},
        "dp=8",
        ["dp"],
        "h100-sxm-2x4",
    ),
}
runner = CliRunner()


def _plan(name: str, cluster: Cluster | str | None = None, **passes: Any) -> Plan:
    config, mesh, templates, preset = PLANS[name]
    strategy = Strategy.build(mesh, templates, options={"passes": passes} if passes else {})
    graph = build_model("llama3-8b", config)
    return build_plan(graph, strategy, cluster=preset if cluster is None else cluster)


def _no_latency(name: str) -> Cluster:
    """The plan's cluster with links that have no latency: fusing all-reduces saves nothing
    there, and a bucket waits for its last gradient."""
    c = load_cluster(PLANS[name][3])
    return dataclasses.replace(
        c,
        intra_node=Link(c.intra_node.bandwidth / 100, 0.0),
        inter_node=Link(c.inter_node.bandwidth / 100, 0.0),
    )


def check_no_pass_is_slower(plan: Plan) -> list[tuple[str, float]]:
    """Assert every pass stage's step is no worse than the stage before; (name, Δ) per pass."""
    deltas = []
    for before, stage in zip(plan.stages, plan.stages[1:], strict=False):
        assert before.cost is not None and stage.cost is not None
        s = stage.summary
        assert s["step_before_s"] == before.cost.step_time
        assert stage.cost.step_time <= before.cost.step_time, (stage.name, s["message"])
        assert isinstance(s["declined"], bool)
        if s["declined"]:
            assert s["step_after_s"] > s["step_before_s"] and s["declined_reason"]
            assert stage.program is before.program and stage.cost is before.cost
        else:
            assert s["declined_reason"] is None and s["step_after_s"] == stage.cost.step_time
        deltas.append((stage.name, stage.cost.step_time - before.cost.step_time))
    return deltas


@pytest.mark.parametrize("name", list(PLANS))
def test_no_pass_makes_a_costed_plan_slower(name: str) -> None:
    plan = _plan(name)
    deltas = check_no_pass_is_slower(plan)
    assert [n for n, _ in deltas] == ["dp_grad_scaling", "dp_fuse_allreduce", "dp_overlap"]
    passes = plan.summary()["passes"]
    assert all({"declined", "declined_reason", "step_before_s", "step_after_s"} <= set(p)
               for p in passes)  # fmt: skip
    assert plan.cost is plan.stages[-1].cost


def test_fusion_that_only_delays_the_all_reduces_is_declined_with_its_reason() -> None:
    plan = _plan("tiny dp4", _no_latency("tiny dp4"))
    check_no_pass_is_slower(plan)
    fuse = plan.stages[2]
    s = fuse.summary
    assert fuse.name == "dp_fuse_allreduce" and s["declined"] is True
    before, after = s["step_before_s"] * 1e3, s["step_after_s"] * 1e3
    assert s["declined_reason"] == f"step {after:.4g} ms > {before:.4g} ms without it"
    assert s["message"].startswith(f"declined: {s['declined_reason']} (it would have: ")
    assert s["proposed"]["all_reduces_after"] < s["proposed"]["all_reduces_before"]
    assert s["ops_before"] == s["ops_after"] and fuse.program is plan.stages[1].program
    assert plan.summary()["passes"][1]["declined"] is True


def test_a_bucket_size_the_user_sets_is_honoured_and_still_guarded() -> None:
    plan = _plan("tiny dp4", _no_latency("tiny dp4"), dp_fuse_allreduce={"bucket_mb": 1})
    s = plan.stages[2].summary
    assert s["declined"] is True and "tuning" not in s
    assert "buckets of up to 1 MiB" in s["message"]
    kept = _plan("llama3-8b 2 layers dp8 (two nodes)", dp_fuse_allreduce={"bucket_mb": 4})
    s = kept.stages[2].summary
    assert "tuning" not in s and s["bucket_bytes"] == 4 * dp.MIB


def test_the_bucket_size_chosen_by_cost_is_a_candidate_no_slower_than_the_default() -> None:
    name = "llama3-8b 2 layers dp8 (two nodes)"
    plan = _plan(name)
    fuse = plan.stages[2]
    tuning = fuse.summary["tuning"]
    candidates = [c["bucket_mb"] for c in dp.bucket_mb_candidates([plan.stages[1].program])]
    assert tuning["chosen"]["bucket_mb"] in candidates
    assert {t["bucket_mb"] for t in tuning["trials"]} <= set(candidates)
    assert tuning["trials"][0]["bucket_mb"] == dp.DEFAULT_BUCKET_MB  # the descent starts there
    default = _plan(name, dp_fuse_allreduce={"bucket_mb": dp.DEFAULT_BUCKET_MB})
    assert fuse.cost is not None and default.stages[2].cost is not None
    assert fuse.cost.step_time <= default.stages[2].cost.step_time
    assert fuse.summary["bucket_bytes"] == int(tuning["chosen"]["bucket_mb"] * dp.MIB)
    assert f"bucket_mb {tuning['chosen']['bucket_mb']:g} chosen by cost" in fuse.summary["message"]


def test_without_a_cluster_passes_run_as_before() -> None:
    config, mesh, templates, _ = PLANS["tiny dp4"]
    plan = build_plan(build_model("llama3-8b", config), Strategy.build(mesh, templates))
    assert all(s.cost is None and "declined" not in s.summary for s in plan.stages)
    assert plan.stages[2].summary["bucket_bytes"] == int(dp.DEFAULT_BUCKET_MB * dp.MIB)


@pytest.mark.parametrize("name", ["demo llama3-8b-tiny dp2-tp2", "tiny dp4 zero1"])
def test_guarded_plans_verify_against_one_device(name: str) -> None:
    config, mesh, templates, preset = PLANS[name]
    graph = build_model("llama3-8b", {**config, "dtype": "float32"})
    plan = build_plan(graph, Strategy.build(mesh, templates), cluster=preset)
    assert not same_program(plan.program, plan.stages[0].program)  # the passes changed it
    report = verify(plan)
    assert report.ok, report.failed()[:3]
    from shardlab.runtime.hazards import check_hazards

    assert check_hazards(plan.program) == []


def test_cli_text_names_the_declined_passes(tmp_path: Path) -> None:
    cluster = tmp_path / "no-latency.json"
    cluster.write_text(json.dumps(_no_latency("tiny dp4").to_json()))
    args = ["plan", "llama3-8b", "--mesh", "dp=4", "--template", "dp", "--cluster", str(cluster),
            *[a for k, v in TINY.items() for a in ("--set", f"{k}={v}")]]  # fmt: skip
    text = runner.invoke(app, args).output
    assert "pass dp_fuse_allreduce: declined: step " in text
    assert "declined by the cost guard (each would make the step slower): dp_fuse_allreduce" in text
    data = json.loads(runner.invoke(app, [*args, "--json"]).output)
    assert [p["declined"] for p in data["passes"]][1] is True


def test_the_pipeline_guard_declines_per_pass_for_all_stages() -> None:
    micro = build_model("llama3-8b", {**TINY, "layers": 4, "batch": 2})
    pipeline = build_pipeline(micro, Strategy.build("pp=2,dp=2", ["dp"]), microbatches=4)
    training = training_graph(micro)
    for cluster in (load_cluster("h100-sxm-1x4"), _no_latency("tiny dp4")):
        calls: list[int] = []

        def cost(p: Any, on: Cluster = cluster, calls: list[int] = calls) -> PipelineCost:
            calls.append(1)
            return cost_pipeline(with_send_waits(p), training, on)

        built = cost(pipeline)
        steps = guarded_stage_pass_steps(pipeline, training, None, cost, built)
        previous = built.step_time
        for program, summary, spent in steps:
            assert spent.step_time <= previous and summary["step_before_s"] == previous
            assert len(program.stages) == 2
            previous = spent.step_time
        declined = {s["pass"]: s["declined"] for _, s, _ in steps}
        if cluster.intra_node.latency == 0.0:
            assert declined["dp_fuse_allreduce"] is True
        # as built, then one cost per pass that changed the pipeline (no bucket sizes to try:
        # the gradients are under 1 MiB); dp_grad_scaling changes nothing and is not costed
        assert all("tuning" not in s for _, s, _ in steps)
        assert len(calls) == 1 + len(steps) - 1
