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
