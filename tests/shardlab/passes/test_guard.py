"""The cost guard: a pass keeps its change only where the predicted step does not get worse,
tunable options are chosen by cost, and each program is costed once."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from shardlab.models import build_model
from shardlab.passes import data_parallel as dp
from shardlab.passes.guard import guard_pass, option_trials, same_program, tuning_text
from shardlab.passes.manager import PASSES
from shardlab.plan import build_plan
from shardlab.strategy import Strategy


@dataclass(frozen=True)
class Step:
    """A cost for toy programs: the program is its own step time."""

    step_time: float


class Coster:
    """Costs a toy program (a float) and counts the calls."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    def __call__(self, program: float) -> Step:
        self.calls.append(program)
        return Step(program)


def _add(program: float, options: Mapping[str, Any]) -> tuple[float, dict[str, Any]]:
    """A toy pass: adds `options["d"]` to the step."""
    d = float(options["d"])
    return program + d, {"message": f"added {d:g}", "count": 1}


def test_a_pass_that_makes_the_step_slower_is_declined_with_both_steps() -> None:
    cost = Coster()
    kept = guard_pass([{"d": 0.25}], 0, 2.0, Step(2.0), _add, cost, lambda a, b: a == b)
    assert kept.program == 2.0 and kept.cost == Step(2.0)
    assert kept.summary["declined"] is True
    assert kept.summary["declined_reason"] == "step 2250.0 ms > 2000.0 ms without it"
    assert kept.summary["message"] == (
        "declined: step 2250.0 ms > 2000.0 ms without it (it would have: added 0.25)"
    )
    assert kept.summary["step_before_s"] == 2.0 and kept.summary["step_after_s"] == 2.25
    assert kept.summary["proposed"] == {"message": "added 0.25", "count": 1}
    assert "count" not in kept.summary  # the counts describe a program the stage does not have
    assert cost.calls == [2.25]


def test_a_pass_no_slower_is_kept_and_equal_programs_are_not_costed_again() -> None:
    cost = Coster()
    faster = guard_pass([{"d": -0.5}], 0, 2.0, Step(2.0), _add, cost, lambda a, b: a == b)
    assert faster.program == 1.5 and faster.cost == Step(1.5)
    assert faster.summary == {
        "message": "added -0.5", "count": 1, "declined": False, "declined_reason": None,
        "step_before_s": 2.0, "step_after_s": 1.5,
    }  # fmt: skip
    same = guard_pass([{"d": 0.0}], 0, 2.0, Step(2.0), _add, cost, lambda a, b: a == b)
    assert same.summary["declined"] is False and same.cost == Step(2.0)
    assert cost.calls == [1.5]  # the unchanged program reuses the cost it came with


def test_tuning_descends_from_the_default_and_keeps_the_best() -> None:
    trials = [{"d": d} for d in (0.3, 0.1, -0.2, 0.0, 0.2, 0.4)]  # start at d=0.0 (index 3)
    cost = Coster()
    kept = guard_pass(trials, 3, 1.0, Step(1.0), _add, cost, lambda a, b: a == b)
    assert kept.program == pytest.approx(0.8)
    tuning = kept.summary["tuning"]
    assert tuning["chosen"] == {"d": -0.2}
    # default first (equal to the input: not costed), down while it improves, then up once
    assert [t["d"] for t in tuning["trials"]] == [0.0, -0.2, 0.1, 0.2]
    assert [t["costed"] for t in tuning["trials"]] == [False, True, True, True]
    assert len(cost.calls) == 3
    assert kept.summary["message"] == "added -0.2; d -0.2 chosen by cost of 4 tried"
    assert tuning_text(tuning).startswith("d 0: 1000.0 ms, -0.2: 800.0 ms")


def test_a_tie_keeps_the_default() -> None:
    def tagged(program: tuple[float, str], options: Mapping[str, Any]) -> Any:
        return (program[0] - 1.0, options["tag"]), {"message": options["tag"]}

    def cost(program: tuple[float, str]) -> Step:
        return Step(program[0])

    trials = [{"tag": "small"}, {"tag": "default"}, {"tag": "large"}]
    kept = guard_pass(trials, 1, (3.0, "in"), Step(3.0), tagged, cost, lambda a, b: a == b)
    assert kept.program == (2.0, "default")
    assert kept.summary["tuning"]["chosen"] == {"tag": "default"}
    assert [t["tag"] for t in kept.summary["tuning"]["trials"]] == ["default", "small", "large"]


TINY = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 64, "seq": 8,
        "batch": 8}  # fmt: skip


def _llama(mesh: str, templates: list[str]) -> Any:
    graph = build_model("llama3-8b", TINY)
    return build_plan(graph, Strategy.build(mesh, templates), passes=False)


def test_bucket_candidates_hold_the_default_and_one_bucket_per_group() -> None:
    plan = build_plan(
        build_model("llama3-8b", {"layers": 2, "batch": 8}),
        Strategy.build("dp=8", ["dp"]),
        passes=False,
    )
    sizes = [c["bucket_mb"] for c in dp.bucket_mb_candidates([plan.program])]
    assert sizes == sorted(sizes) and dp.DEFAULT_BUCKET_MB in sizes
    assert sizes[:-1] == list(dp.BUCKET_MB_CANDIDATES)
    whole = dp.dp_fuse_allreduce(plan.program, plan.training, {"bucket_mb": sizes[-1]})
    assert whole.summary["closed_by"].get("cap", 0) == 0  # no bucket reaches the last cap
    tiny = _llama("dp=2", ["dp"])
    assert dp.bucket_mb_candidates([tiny.program]) == [{"bucket_mb": dp.DEFAULT_BUCKET_MB}]


def test_option_trials_tune_only_what_the_user_left_unset() -> None:
    plan = build_plan(
        build_model("llama3-8b", {"layers": 2, "batch": 8}),
        Strategy.build("dp=8", ["dp"]),
        passes=False,
    )
    fuse = PASSES["dp_fuse_allreduce"]
    trials, start = option_trials(fuse, dict(fuse.options), {}, [plan.program])
    assert len(trials) > 1 and trials[start] == {"bucket_mb": dp.DEFAULT_BUCKET_MB}
    given = {"bucket_mb": 4.0}
    assert option_trials(fuse, given, given, [plan.program]) == ([given], 0)
    overlap = PASSES["dp_overlap"]
    assert option_trials(overlap, {}, {}, [plan.program]) == ([{}], 0)


def test_same_program_compares_ops() -> None:
    plan = _llama("dp=2", ["dp"])
    fused = dp.dp_fuse_allreduce(plan.program, plan.training, {}).program
    assert same_program(plan.program, plan.program)
    assert not same_program(plan.program, fused)
    again = dp.dp_fuse_allreduce(plan.program, plan.training, {}).program
    assert same_program(fused, again)
