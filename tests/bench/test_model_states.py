"""Model states per rank equal the recipes' accounting within 2% at every data-parallel size
(issue 34): llama3-8b (2 layers) and llama3-70b (4 layers), dp 4, 6, 12, 48 x tp 1, 2, 8 x
pp 1, 2, under Megatron (18 bytes a parameter), its distributed optimizer (6 + 12/d) and
FSDP2 (18/d), over tp x pp. At dp 6, 12 and 48 the templates once sharded nothing (a dim had
to divide), and ZeRO with tensor parallelism held each state whole on every TP rank."""

from __future__ import annotations

import pytest

from bench.bench_model_states import (
    MODEL_STATE,
    RECIPES,
    TOLERANCE,
    Case,
    cases,
    expected,
    model_states,
    plan_of,
)


@pytest.mark.parametrize(
    ("model", "recipe"), [(m, r) for m in ("llama3-8b", "llama3-70b") for r in RECIPES]
)
def test_model_states_per_rank_follow_the_recipe(model: str, recipe: str) -> None:
    mine: list[Case] = [c for c in cases() if c.model == model and c.recipe == recipe]
    assert len(mine) == 4 * 3 * 2
    for case in mine:
        plan = plan_of(case)
        got, want = model_states(plan), expected(case, plan.model.num_params())
        for kind in MODEL_STATE:
            assert got[kind] == pytest.approx(want[kind], rel=TOLERANCE), (case, kind)
