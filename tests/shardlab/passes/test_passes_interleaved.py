"""Every shipped pass, alone and together, is hazard-free and gives the same numbers under
50 random interleavings of its streams as in program order."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from shardlab.models import build_model
from shardlab.passes.manager import PASSES
from shardlab.plan import build_plan
from shardlab.runtime.hazards import check_hazards
from shardlab.runtime.reference import make_feeds, source_values
from shardlab.runtime.simulated import run_interleavings, run_simulated
from shardlab.strategy import Strategy

LLAMA = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 64,
         "seq": 8, "batch": 8, "dtype": "float32"}  # fmt: skip


def _options(alone: str | None) -> dict[str, Any]:
    """One pass alone (None: all of them); fusion with small buckets, so there are several."""
    passes: dict[str, Any] = {name: name == alone for name in PASSES} if alone else {}
    if passes.get("dp_fuse_allreduce", alone is None):
        passes["dp_fuse_allreduce"] = {"bucket_mb": 0.05}
    return {"passes": passes}


@pytest.mark.parametrize("alone", [*PASSES, None], ids=[*PASSES, "all"])
@pytest.mark.parametrize(
    ("mesh", "templates"), [("dp=4", ["dp"]), ("dp=2,tp=2", ["dp", "megatron_tp"])]
)
def test_passes_are_clean_under_50_interleavings(
    alone: str | None, mesh: str, templates: list[str]
) -> None:
    strategy = Strategy.build(mesh, templates, options=_options(alone))
    plan = build_plan(build_model("llama3-8b", LLAMA), strategy)
    program = plan.program
    assert [s.name for s in plan.stages][1:] == ([alone] if alone else list(PASSES))
    assert check_hazards(program) == []
    feeds = make_feeds(plan.training, seed=0)
    sources = {v.name: feeds[v.name] for v in source_values(plan.training)}
    ordered = run_simulated(program, sources, seed=0)
    interleaved = run_interleavings(program, sources, n=50, seed=1)
    for value in program.values.values():
        for rank, block in ordered[value].items():
            np.testing.assert_array_equal(interleaved[value][rank], block)
