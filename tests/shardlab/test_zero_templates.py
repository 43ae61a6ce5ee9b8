"""ZeRO-1 / ZeRO-2 / FSDP as templates: bytes of model state per parameter, and numerics."""

from __future__ import annotations

import pytest

from shardlab.models import build_model
from shardlab.plan import build_plan
from shardlab.runtime.verify import verify
from shardlab.strategy import Strategy

N = 8  # data-parallel ranks


@pytest.mark.parametrize(
    ("templates", "expected"),
    [
        (["dp"], {"parameters": 2, "gradients": 4, "optimizer_state": 12}),  # 18
        (["dp", "zero1"], {"parameters": 2, "gradients": 4, "optimizer_state": 12 / N}),  # 6+12/N
        (["dp", "zero2"], {"parameters": 2, "gradients": 4 / N, "optimizer_state": 12 / N}),
        (
            ["dp", "fsdp", "zero2"],
            {"parameters": 2 / N, "gradients": 4 / N, "optimizer_state": 12 / N},
        ),
        (["dp", "zero3"], {"parameters": 2 / N, "gradients": 4 / N, "optimizer_state": 12 / N}),
    ],
)
def test_model_state_bytes_per_param_follow_megatron_accounting(
    templates: list[str], expected: dict[str, float]
) -> None:
    """Megatron-LM's mixed-precision AdamW: bf16 params (2), fp32 main gradients (4), fp32
    master params and moments (12): 18 bytes per parameter. The distributed optimizer (ZeRO-1)
    divides the 12 by N (Megatron's 6 + 12/N), ZeRO-2 also the gradients' 4, ZeRO-3 / FSDP
    all 18 (Rajbhandari et al.'s stages with fp32 gradients)."""
    graph = build_model("llama3-8b", {"layers": 2, "dtype": "bfloat16"})
    plan = build_plan(graph, Strategy.build(f"dp={N}", templates), cluster="h100-sxm-1x8")
    assert plan.cost is not None
    assert plan.cost.memory.model_state_per_param() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("stage", ["zero1", "zero2"])
def test_zero_verifies_against_one_device_and_reduce_scatters(stage: str) -> None:
    graph = build_model("llama3-8b", {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2,
                                      "ffn": 128, "vocab": 64, "seq": 8, "batch": 8,
                                      "dtype": "bfloat16"})  # fmt: skip
    report = verify(graph, Strategy.build("dp=4", ["dp", stage]))
    assert report.ok, report.failed()[:3]
    collectives = report.summary["collectives"]
    assert "all_reduce" not in collectives  # gradients are reduce-scattered, params gathered
    assert collectives["reduce_scatter"] == collectives["all_gather"] > 0


TINY = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 64,
        "seq": 8, "batch": 12, "dtype": "bfloat16"}  # fmt: skip


def _kinds_by_axis(plan: object) -> dict[tuple[str, str], int]:
    """(collective kind, mesh axis) -> how many the plan's program issues (bytes moved)."""
    out: dict[tuple[str, str], int] = {}
    for op in plan.program.ops:  # type: ignore[attr-defined]
        if op.comm is not None and op.comm.bytes_per_rank > 0:
            key = (op.comm.kind, op.comm.axis)
            out[key] = out.get(key, 0) + 1
    return out


def test_llama3_8b_with_the_distributed_optimizer_on_8_gpus_does_not_fit() -> None:
    """Megatron keeps its fp32 main-gradient buffer all step: 2 + 4 + 12/8 = 7.5 bytes a
    parameter is 56 GiB of llama3-8b's model states before any activation, so dp=8 with
    the distributed optimizer and a batch of 8 does not fit an 80 GB H100 (it "fitted" at
    71.3 GiB when the gradients were counted only while the backward made them)."""
    graph = build_model("llama3-8b", {"batch": 8})
    plan = build_plan(graph, Strategy.build("dp=8", ["dp", "zero1"]), cluster="h100-sxm-1x8")
    assert plan.cost is not None
    memory = plan.cost.memory
    assert memory.breakdown_at_peak["gradients"] == memory.model_state["gradients"]
    assert memory.breakdown_at_peak["gradients"] == pytest.approx(4 * graph.num_params(), 1e-3)
    assert not plan.summary()["cost"]["fits"]


@pytest.mark.parametrize("order", [["fsdp", "megatron_tp"], ["megatron_tp", "fsdp"]])
def test_fsdp_x_tp_gathers_each_tp_shard_once_over_dp(order: list[str]) -> None:
    """torchtitan's 2D: FSDP2 all-gathers each parameter's TP shard over dp (forward and
    backward) and reduce-scatters its gradient; it never moves a weight over tp nor needs
    an all-to-all (the dp shard once nested in the tp shard of the same dim)."""
    graph = build_model("llama3-8b", TINY)
    plan = build_plan(graph, Strategy.build("dp=2,tp=2", order), passes=False)
    kinds = _kinds_by_axis(plan)
    assert not any(kind == "all_to_all" for kind, _ in kinds), kinds
    params = {v.name for v in plan.training.values.values() if v.kind.name == "PARAM"}
    for op in plan.program.ops:
        if op.comm is not None and op.comm.kind == "all_gather" and op.attrs.get("value") in params:
            assert op.comm.axis == "dp", (op.name, op.comm)
    assert kinds[("all_gather", "dp")] > 0 and kinds[("reduce_scatter", "dp")] > 0


def test_hsdp_shards_within_dps_and_reduces_across_dpr() -> None:
    """HSDP (`dp:dpr` + `fsdp:dps`): every rank trains on its own samples; parameters are
    all-gathered within `dps`, gradients reduce-scattered within `dps` and all-reduced
    across `dpr`, as FSDP2's 2-D mesh does; no all-to-all. It matches one device."""
    graph = build_model("llama3-8b", {**TINY, "batch": 8})
    strategy = Strategy.build("dpr=2,dps=2", ["dp:dpr", "fsdp:dps"])
    plan = build_plan(graph, strategy, passes=False)
    kinds = _kinds_by_axis(plan)
    assert set(kinds) == {("all_gather", "dps"), ("reduce_scatter", "dps"),
                          ("all_reduce", "dpr")}, kinds  # fmt: skip
    tokens = plan.completed.specs["tokens"]
    assert str(tokens) == "S(0)S(0)"  # the batch over all four ranks
    report = verify(graph, strategy)
    assert report.ok, report.failed()[:3]


@pytest.mark.parametrize("stage", ["zero1", "zero2"])
def test_the_distributed_optimizer_with_tp_keeps_each_state_on_its_tp_shard(stage: str) -> None:
    """Megatron's distributed optimizer with TP: each state is its parameter's TP shard, cut
    over dp (12/(tp x dp) bytes a parameter); the optimizer updates the shard, the new
    parameter is all-gathered over dp only. It matches one device."""
    graph = build_model("llama3-8b", TINY)
    strategy = Strategy.build("dp=2,tp=2", ["dp", stage, "megatron_tp"])
    plan = build_plan(graph, strategy, passes=False)
    state = plan.completed.specs["layers.0.attn.q_proj.weight.exp_avg"]
    assert str(state) == "S(0)S(1)"  # q_proj [in, out]: tp on out (column), dp on in
    assert not any(kind == "all_to_all" for kind, _ in _kinds_by_axis(plan))
    report = verify(graph, strategy)
    assert report.ok, report.failed()[:3]
