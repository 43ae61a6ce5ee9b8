"""The simulated mesh runs lowered programs and matches one device on every value."""

from __future__ import annotations

import numpy as np
import pytest

from shardlab.lower import lower
from shardlab.models import build_model
from shardlab.runtime.reference import run_reference, source_values
from shardlab.runtime.simulated import global_view, run_simulated
from shardlab.spmd.complete import complete
from shardlab.strategy import Strategy

LLAMA = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 64,
         "seq": 8, "batch": 4, "dtype": "float32"}  # fmt: skip


def _max_error(model: str, overrides: dict[str, object], strategy: Strategy) -> dict[str, float]:
    graph = build_model(model, overrides)
    program = lower(complete(graph, strategy))
    env = run_reference(graph, seed=0)
    sources = {v.name: env[v.name] for v in source_values(graph)}
    blocks = run_simulated(program, sources, seed=1)
    return {
        serial: float(np.max(np.abs(global_view(program, blocks, held) - env[serial]), initial=0))
        for serial, held in program.values.items()
    }


@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_seed_demo_dp_and_mp_match_one_device(ranks: int) -> None:
    dp = _max_error("mlp_demo", {}, Strategy.build(f"x={ranks}", ["dp"]))
    mp = _max_error("mlp_demo", {}, Strategy.build(f"x={ranks}", [], ["w0=S(1)", "w1=S(0)"]))
    assert max(dp.values()) < 1e-12 and max(mp.values()) < 1e-12


@pytest.mark.parametrize(
    ("mesh", "templates"),
    [
        ("dp=2,tp=2", ["dp", "megatron_tp"]),
        ("dp=2,tp=2", ["dp", "megatron_tp", "sequence_parallel"]),
        ("pp=2,dp=2,tp=2", ["dp", "megatron_tp", "sequence_parallel"]),
        ("dp=4", ["dp", "fsdp"]),
    ],
)
def test_small_llama_forward_matches_one_device(mesh: str, templates: list[str]) -> None:
    errors = _max_error("llama3-8b", LLAMA, Strategy.build(mesh, templates))
    assert max(errors.values()) < 1e-9, sorted(errors.items(), key=lambda kv: -kv[1])[:3]
