"""Rules for sum / mean / max and softmax / log_softmax: exact specs and numerics."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardlab.spmd  # noqa: F401  (attaches the rules)
from shardlab.ir import TensorType
from shardlab.mesh import Mesh
from shardlab.placement import DistSpec
from shardlab.spmd import infer
from shardlab.spmd.check import all_specs, check_rule, sweep_rule
from shardlab.spmd.result import RuleResult

MESHES = [Mesh((2,), ("x",)), Mesh((4,), ("x",)), Mesh((2, 2), ("x", "y"))]
CUBE = Mesh((2, 2, 2), ("x", "y", "z"))
ALL_MESHES = [*MESHES, CUBE]
TOL = 1e-9
X = TensorType((8, 8, 4))


def rule(kind: str, text: str, attrs: dict[str, Any], mesh: Mesh = MESHES[2]) -> RuleResult:
    """The rule's answer for X arriving in the placements `text`."""
    return infer(kind, [X], [DistSpec.parse(text, mesh)], attrs, mesh)


def specs(result: RuleResult) -> tuple[list[str], list[str]]:
    return [str(s) for s in result.input_specs], [str(s) for s in result.output_specs]


REDUCE_CASES = [
    {"dims": [1]},
    {"dims": [-1], "keepdim": True},
    {"dims": [0, 2]},
    {"dims": None},
    {"dims": None, "keepdim": True},
]


@pytest.mark.parametrize("kind", ["sum", "mean", "max"])
@pytest.mark.parametrize("attrs", REDUCE_CASES, ids=str)
def test_reductions_match_one_device(kind: str, attrs: dict[str, Any]) -> None:
    assert sweep_rule(kind, [X], attrs, ALL_MESHES).total() > 300


@pytest.mark.parametrize("kind", ["sum", "max"])
def test_integer_reductions_match_one_device(kind: str) -> None:
    sweep_rule(kind, [TensorType((8, 4), "int64")], {"dims": [0]}, ALL_MESHES)


@pytest.mark.parametrize("kind", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dim", [-1, 1, 0])
def test_softmax_matches_one_device(kind: str, dim: int) -> None:
    sweep_rule(kind, [X], {"dim": dim}, ALL_MESHES)


@pytest.mark.parametrize(("kind", "op"), [("sum", "sum"), ("mean", "avg"), ("max", "max")])
def test_sharded_reduced_dim_is_contracted(kind: str, op: str) -> None:
    result = rule(kind, "S(1)R", {"dims": [1]})
    assert specs(result) == (["S(1)R"], [f"P({op})R"])
    assert "contracted" in result.reason
    result = rule(kind, "S(1)S(0)", {"dims": [1], "keepdim": True})
    assert specs(result) == (["S(1)S(0)"], [f"P({op})S(0)"])
    assert specs(rule(kind, "S(0)S(2)", {"dims": None})) == (["S(0)S(2)"], [f"P({op})P({op})"])


def test_kept_dims_move_left_when_earlier_dims_are_reduced() -> None:
    assert specs(rule("sum", "S(2)S(1)", {"dims": [0]})) == (["S(2)S(1)"], ["S(1)S(0)"])
    assert specs(rule("mean", "S(2)R", {"dims": [0], "keepdim": True})) == (["S(2)R"], ["S(2)R"])


@pytest.mark.parametrize("kind", ["sum", "mean"])
def test_linear_reductions_pass_sum_and_avg_partials(kind: str) -> None:
    assert specs(rule(kind, "P(sum)P(avg)", {"dims": [1]})) == (["P(sum)P(avg)"], ["P(sum)P(avg)"])
    result = rule(kind, "P(sum)S(1)", {"dims": [1]})
    op = "sum" if kind == "sum" else "avg"
    assert specs(result) == (["P(sum)S(1)"], [f"P(sum)P({op})"])


def test_max_passes_only_max_partials() -> None:
    assert specs(rule("max", "P(max)S(1)", {"dims": [1]})) == (["P(max)S(1)"], ["P(max)P(max)"])
    # other partials are resolved: reduce-scattered onto a dim the max keeps
    assert specs(rule("max", "P(sum)S(0)", {"dims": [1]})) == (["S(2)S(0)"], ["S(1)S(0)"])
    assert specs(rule("max", "P(avg)R", {"dims": [1]})) == (["S(0)R"], ["S(0)R"])


def test_max_of_partial_max_inputs_matches_one_device() -> None:
    rng = np.random.default_rng(1)
    for text in ["P(max)S(1)", "S(1)P(max)", "P(max)P(max)", "P(max)S(0)"]:
        for attrs in REDUCE_CASES:
            spec = DistSpec.parse(text, MESHES[2])
            check = check_rule("max", [X], [spec], attrs, MESHES[2], rng)
            assert max(check.max_abs_error) < TOL, (text, attrs)


@pytest.mark.parametrize("kind", ["softmax", "log_softmax"])
def test_softmax_dim_stays_whole_other_dims_follow(kind: str) -> None:
    # the softmax dim arrives sharded: an all_to_all moves it onto a free dim
    result = rule(kind, "S(0)S(2)", {"dim": 2})
    assert specs(result) == (["S(0)S(1)"], ["S(0)S(1)"])
    assert specs(rule(kind, "S(2)S(1)", {"dim": -2})) == (["S(2)S(0)"], ["S(2)S(0)"])
    assert specs(rule(kind, "S(1)S(0)", {})) == (["S(1)S(0)"], ["S(1)S(0)"])


@pytest.mark.parametrize("kind", ["softmax", "log_softmax"])
def test_softmax_resolves_partial_inputs(kind: str) -> None:
    # reduce-scattered onto a dim the softmax does not normalise over
    assert specs(rule(kind, "P(sum)S(0)", {"dim": -1})) == (["S(1)S(0)"], ["S(1)S(0)"])


@settings(max_examples=60, deadline=None)
@given(
    shape=st.lists(st.sampled_from([2, 4, 8]), min_size=1, max_size=4),
    data=st.data(),
)
def test_random_reductions_match_one_device(shape: list[int], data: st.DataObject) -> None:
    x = TensorType(tuple(shape))
    kind = data.draw(st.sampled_from(["sum", "mean", "max", "softmax", "log_softmax"]))
    dims = data.draw(st.sets(st.integers(-len(shape), len(shape) - 1), max_size=len(shape)))
    normalized = {d % len(shape) for d in dims}
    if kind.endswith("softmax"):
        attrs: dict[str, Any] = {"dim": data.draw(st.integers(-len(shape), len(shape) - 1))}
    else:
        picked = sorted(normalized) if len(normalized) == len(dims) and dims else None
        attrs = {"dims": picked, "keepdim": data.draw(st.booleans())}
    mesh = data.draw(st.sampled_from(ALL_MESHES))
    spec = data.draw(st.sampled_from([None, *all_specs(x, mesh)]))
    check = check_rule(kind, [x], [spec], attrs, mesh, np.random.default_rng(0))
    assert check.rule.fallback is False
    assert max(check.max_abs_error) < TOL, (kind, attrs, str(spec), check.rule.reason)
