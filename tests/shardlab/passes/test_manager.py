"""The pass manager: which passes run, with which options, and what each stage keeps."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import pytest

from shardlab.ir import Graph
from shardlab.passes import manager
from shardlab.passes.manager import Pass, PassError, PassResult, resolve_passes, run_passes
from shardlab.plan import build_plan
from shardlab.program import DistProgram
from shardlab.strategy import Strategy


def _drop_last_op(program: DistProgram, training: Graph, options: Mapping[str, Any]) -> PassResult:
    """A toy pass for the manager's bookkeeping (never verified numerically)."""
    n = int(options["n"])
    kept = program.ops[: len(program.ops) - n]
    return PassResult(dataclasses.replace(program, ops=kept), {"message": f"dropped {n}"})


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(manager, "PASSES", {})
    manager.register_pass(Pass("toy", _drop_last_op, "drop ops", True, {"n": 1}))
    manager.register_pass(Pass("off_by_default", _drop_last_op, "drop ops", False, {"n": 2}))


def test_defaults_options_and_switching_off(toy: None) -> None:
    assert [(p.name, o) for p, o in resolve_passes(None)] == [("toy", {"n": 1})]
    chosen = resolve_passes({"toy": {"n": 3}, "off_by_default": True})
    assert [(p.name, o) for p, o in chosen] == [("toy", {"n": 3}), ("off_by_default", {"n": 2})]
    assert resolve_passes({"toy": False}) == []


def test_unknown_passes_and_options_are_named(toy: None) -> None:
    with pytest.raises(PassError, match="unknown pass 'tyo'; known passes: toy, off_by_default"):
        resolve_passes({"tyo": True})
    with pytest.raises(PassError, match="pass 'toy' has no option 'm'; options: n"):
        resolve_passes({"toy": {"m": 1}})
    with pytest.raises(PassError, match="must be an object"):
        resolve_passes(["toy"])


def test_every_stage_is_kept_with_counts(toy: None) -> None:
    plan = build_plan("mlp_demo", Strategy.build("x=2", ["dp"]))
    stages = run_passes(plan.stages[0].program, plan.training, {"off_by_default": {"n": 2}})
    assert [s.name for s in stages] == ["lowered", "toy", "off_by_default"]
    lowered = len(stages[0].program.ops)
    assert [len(s.program.ops) for s in stages] == [lowered, lowered - 1, lowered - 3]
    assert stages[2].summary == {"ops_before": lowered - 1, "ops_after": lowered - 3,
                                 "message": "dropped 2"}  # fmt: skip


def test_a_plan_keeps_the_cost_of_every_stage(toy: None) -> None:
    strategy = Strategy.build("x=2", ["dp"], options={"passes": {"toy": {"n": 0}}})
    plan = build_plan("mlp_demo", strategy, cluster="cpu-local")
    assert [s.name for s in plan.stages] == ["lowered", "toy"]
    assert all(s.cost is not None for s in plan.stages)
    assert plan.summary()["passes"][0]["name"] == "toy"
    assert plan.summary()["passes"][0]["step_time_s"] == plan.stages[1].cost.step_time  # type: ignore[union-attr]


def _add_op_copies(program: DistProgram, training: Graph, options: Mapping[str, Any]) -> PassResult:
    """A toy pass that makes the program longer (slower under `_ops_cost`)."""
    n = int(options["n"])
    extra = [dataclasses.replace(op, name=f"{op.name}~{k}") for k, op in enumerate(program.ops[:n])]
    return PassResult(
        dataclasses.replace(program, ops=[*program.ops, *extra]), {"message": f"added {n}"}
    )


@dataclasses.dataclass(frozen=True)
class _OpsCost:
    step_time: float


def test_with_a_cost_a_pass_keeps_its_change_only_where_the_step_does_not_grow(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plan = build_plan("mlp_demo", Strategy.build("x=2", ["dp"]), passes=False)
    monkeypatch.setattr(manager, "PASSES", {})
    manager.register_pass(Pass("shorter", _drop_last_op, "drop ops", True, {"n": 1}))
    manager.register_pass(Pass("longer", _add_op_copies, "add ops", True, {"n": 2}))
    manager.register_pass(Pass("same", _drop_last_op, "drop nothing", True, {"n": 0}))
    costed: list[int] = []

    def ops_cost(program: DistProgram) -> _OpsCost:
        costed.append(len(program.ops))
        return _OpsCost(float(len(program.ops)))

    stages = run_passes(plan.program, plan.training, None, cost=ops_cost)
    n = len(plan.program.ops)
    assert [s.name for s in stages] == ["lowered", "shorter", "longer", "same"]
    assert [len(s.program.ops) for s in stages] == [n, n - 1, n - 1, n - 1]
    assert [s.cost.step_time for s in stages if s.cost] == [n, n - 1, n - 1, n - 1]
    longer = stages[2].summary
    assert longer["declined"] is True and stages[2].program is stages[1].program
    slower, faster = f"{(n + 1) * 1e3:.1f} ms", f"{(n - 1) * 1e3:.1f} ms"
    assert (
        longer["message"]
        == f"declined: step {slower} > {faster} without it (it would have: added 2)"
    )
    assert longer["ops_before"] == longer["ops_after"] == n - 1
    assert stages[1].summary["declined"] is False and stages[3].summary["declined"] is False
    assert costed == [n, n - 1, n + 1]  # each program once; the unchanged one is not costed
