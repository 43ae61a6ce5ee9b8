"""`shardlab.plan`: the pipeline end to end, and what its summary reports."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import shardlab
from shardlab.cli import app
from shardlab.models import build_model
from shardlab.plan import Plan, build_plan
from shardlab.strategy import Strategy

runner = CliRunner()


@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_dp_all_reduces_every_weight_gradient_with_ring_bytes(ranks: int) -> None:
    plan = shardlab.plan("mlp_demo", Strategy.build(f"x={ranks}", ["dp"]), passes=False)
    assert isinstance(plan, Plan)
    collectives = plan.summary()["collectives"]
    assert list(collectives) == ["all_reduce"]
    grad_bytes = (32 * 32 + 32 * 8) * 4  # w0 [32,32] and w1 [32,8], float32
    assert collectives["all_reduce"]["count"] == 2
    assert collectives["all_reduce"]["bytes_per_rank"] == 2 * (ranks - 1) / ranks * grad_bytes
    assert collectives["all_reduce"]["reasons"] == [{"reason": "P(sum) -> R for adamw", "count": 2}]


def test_summary_counts_ops_by_role_and_matches_the_program() -> None:
    graph = build_model("llama3-8b", {"layers": 2})
    plan = build_plan(graph, Strategy.build("dp=8,tp=8", ["dp", "megatron_tp"]))
    s = plan.summary()
    assert s["fallback_ops"] == []
    assert sum(s["ops_by_role"].values()) == s["program_ops"] == len(plan.program.ops)
    assert s["ops_by_role"]["comm"] == sum(e["count"] for e in s["collectives"].values())
    total = sum(e["bytes_per_rank"] for e in s["collectives"].values())
    assert total == pytest.approx(s["comm_bytes_per_rank"])
    # each weight gradient sharded by tp is all-reduced over dp for its optimizer update
    ar = [r["reason"] for r in s["collectives"]["all_reduce"]["reasons"]]
    assert "P(sum)S(1) -> RS(1) for adamw" in ar


def test_every_comm_op_records_value_specs_and_consumer() -> None:
    plan = build_plan("mlp_demo", Strategy.build("x=2", ["dp"]), optimizer="sgd", passes=False)
    comms = [op for op in plan.program.ops if op.is_comm]
    assert {op.attrs["value"] for op in comms} == {"w0.grad", "w1.grad"}
    assert all(op.attrs["consumer"] == "sgd" for op in comms)
    assert all("w0.grad" in op.reason or "w1.grad" in op.reason for op in comms)


def test_cli_plan_text_and_json() -> None:
    args = ["plan", "mlp_demo", "--mesh", "x=2", "--annotate", "w0=S(1)", "--annotate", "w1=S(0)"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "all_reduce" in result.output and "fallback ops: 0" in result.output
    data = json.loads(runner.invoke(app, [*args, "--json"]).output)
    assert data["collectives"]["all_reduce"]["count"] == 2
    assert data["mesh"] == "x=2"


def test_cli_plan_names_a_bad_mesh_axis() -> None:
    result = runner.invoke(app, ["plan", "mlp_demo", "--mesh", "x=2", "--annotate", "w0=q:S(1)"])
    assert result.exit_code == 1
    assert "q" in result.output


def test_passes_run_by_default_and_fuse_the_gradient_all_reduces() -> None:
    plan = shardlab.plan("mlp_demo", Strategy.build("x=4", ["dp"]))
    assert [s.name for s in plan.stages] == [
        "lowered",
        "dp_grad_scaling",
        "dp_fuse_allreduce",
        "dp_overlap",
    ]
    fused = plan.summary()["passes"][1]
    assert fused["message"].startswith("2 all-reduces fused into 1")
    assert plan.summary()["collectives"]["all_reduce"]["count"] == 1


def test_cli_pass_flags_turn_passes_off_and_size_buckets() -> None:
    base = ["plan", "llama3-8b", "--set", "layers=4", "--mesh", "dp=8", "--template", "dp"]
    data = json.loads(runner.invoke(app, [*base, "--json"]).output)
    assert [p["name"] for p in data["passes"]] == [
        "dp_grad_scaling",
        "dp_fuse_allreduce",
        "dp_overlap",
    ]
    # float32 main gradients: at 25 MiB no two neighbours fit one bucket
    assert data["passes"][1]["message"].startswith("39 all-reduces fused into 39")
    big = json.loads(runner.invoke(app, [*base, "--bucket-mb", "100", "--json"]).output)
    assert big["passes"][1]["message"].startswith("39 all-reduces fused into 23")
    off = json.loads(runner.invoke(app, [*base, "--no-pass", "dp_fuse_allreduce", "--json"]).output)
    assert [p["name"] for p in off["passes"]] == ["dp_grad_scaling", "dp_overlap"]
    assert off["collectives"]["all_reduce"]["count"] == 39
    bad = runner.invoke(app, [*base, "--no-pass", "dp_ovrlap"])
    assert bad.exit_code == 1 and "unknown pass 'dp_ovrlap'" in bad.output


def test_cli_plan_on_a_pp_mesh_costs_the_schedule_and_memory_per_stage() -> None:
    args = ["plan", "llama3-8b", "--set", "layers=4", "--mesh", "pp=2,dp=2", "--template", "dp",
            "--schedule", "1f1b", "--balance", "even", "--microbatches", "4",
            "--cluster", "h100-sxm-1x8"]  # fmt: skip
    data = json.loads(runner.invoke(app, [*args, "--json"]).output)
    pipeline = data["pipeline"]
    assert (pipeline["schedule"], pipeline["pp"], pipeline["microbatches"]) == ("1f1b", 2, 4)
    assert [s["layers"] for s in pipeline["stages"]] == [[0, 1], [2, 3]]  # two layers each
    balanced = json.loads(runner.invoke(app, [*args[:10], *args[12:], "--json"]).output)
    # by FLOPs the last stage's head (vocab 128256) weighs as much as two layers
    assert [s["layers"] for s in balanced["pipeline"]["stages"]] == [[0, 1, 2], [3]]
    memory = [s["memory"] for s in pipeline["stages"]]
    # 1F1B: the first stage holds 2 micro-batches' activations, the last one
    assert [m["in_flight"] for m in memory] == [[2], [1]]
    for m in memory:
        assert (
            m["peak_bytes"]
            == sum(m["model_state_bytes"].values())
            + m["activations_bytes"]
            + (m["temporaries_bytes"])
        )
        assert m["activations_bytes"] == m["in_flight"][0] * m["activations_per_microbatch"][0]
    assert pipeline["step_time_s"] > 0 and 0 < pipeline["bubble_fraction"] < 1
    assert pipeline["bubble_formula"] == pytest.approx(1 / 5)
    assert "cost" not in data  # one micro-batch's program is not the step: see "pipeline"
    text = runner.invoke(app, args).output
    assert "stage 1: layers 2-3" in text and "micro-batches in flight" in text
    bad = runner.invoke(app, [*args[:-2], "--microbatches", "3"])
    assert bad.exit_code == 1 and "does not split into 3 micro-batches" in bad.output


def test_cli_plan_on_a_pp_mesh_builds_a_detailed_pipeline_and_costs_send_wait() -> None:
    args = ["plan", "llama3-8b", "--set", "layers=4", "--mesh", "pp=2,dp=2", "--template", "dp",
            "--schedule", "1f1b", "--microbatches", "4", "--cluster", "h100-sxm-1x8",
            "--detailed-pipeline"]  # fmt: skip
    data = json.loads(runner.invoke(app, [*args, "--json"]).output)
    pipeline = data["pipeline"]
    assert (pipeline["schedule"], pipeline["pp"], pipeline["microbatches"]) == ("1f1b", 2, 4)
    layers = [s["layers"] for s in pipeline["stages"]]
    assert sorted(layer for stage in layers for layer in stage) == [0, 1, 2, 3] and all(layers)
    assert data["passes"][-1]["message"].endswith("holds added")
    assert data["cost"]["step_time_s"] <= data["cost_before_send_wait"]["step_time_s"]
    names = [p["name"] for p in data["passes"]]
    assert names == ["lowered", "dp_grad_scaling", "dp_fuse_allreduce", "dp_overlap",
                     "pipeline_send_wait"]  # fmt: skip
    times = [p["step_time_s"] for p in data["passes"]]
    assert times[-2] == data["cost_before_send_wait"]["step_time_s"]
    assert times[-1] == data["cost"]["step_time_s"] <= times[-2] and min(times) > 0
    off = runner.invoke(app, [*args, "--no-pass", "dp_overlap", "--no-pass",
                              "pipeline_send_wait", "--json"])  # fmt: skip
    assert [p["name"] for p in json.loads(off.output)["passes"]] == names[:3]
    text = runner.invoke(app, args).output
    assert "stage 1" in text and "send waits removed" in text and "-> step" in text
    bad = runner.invoke(app, [*args[:-3], "--microbatches", "3", "--detailed-pipeline"])
    assert bad.exit_code == 1 and "does not split into 3 micro-batches" in bad.output
