"""Rules for elementwise ops: broadcasting letters and which partial values pass through."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardlab.spmd  # noqa: F401  (attaches the rules)
import shardlab.spmd.check as check_module
from shardlab.ir import TensorType
from shardlab.mesh import Mesh
from shardlab.ops.base import Array
from shardlab.placement import DistSpec
from shardlab.spmd import infer
from shardlab.spmd.check import all_specs, check_rule, sweep_rule
from shardlab.spmd.result import RuleResult

MESHES = [Mesh((2,), ("x",)), Mesh((4,), ("x",)), Mesh((2, 2), ("dp", "tp"))]
CUBE = Mesh((2, 2, 2), ("x", "y", "z"))
ALL_MESHES = [*MESHES, CUBE]
TOL = 1e-9
X = TensorType((8, 4, 8))


def rule(
    kind: str,
    texts: Sequence[str],
    types: Sequence[TensorType] = (X, X),
    attrs: dict[str, Any] | None = None,
) -> RuleResult:
    """The rule's answer on the (dp, tp) mesh for inputs arriving in the placements `texts`."""
    mesh = MESHES[2]
    arriving = [DistSpec.parse(t, mesh) for t in texts]
    return infer(kind, list(types[: len(texts)]), arriving, attrs or {}, mesh)


def specs(result: RuleResult) -> tuple[list[str], list[str]]:
    return [str(s) for s in result.input_specs], [str(s) for s in result.output_specs]


BROADCASTS = [
    [X, X],
    [X, TensorType((4, 8))],
    [TensorType((8, 1, 8)), TensorType((4, 1))],
]
UNARY = [
    ("neg", {}),
    ("relu", {}),
    ("gelu", {"approximate": "tanh"}),
    ("silu", {}),
    ("sigmoid", {}),
    ("tanh", {}),
    ("exp", {}),
    ("square", {}),
    ("scale", {"factor": 0.5}),
    ("cast", {"dtype": "float16"}),
    ("cast", {"dtype": "int64"}),
]


@pytest.mark.parametrize("kind", ["add", "sub", "mul", "div"])
@pytest.mark.parametrize("types", BROADCASTS, ids=str)
def test_binary_ops_match_one_device(kind: str, types: list[TensorType]) -> None:
    assert sweep_rule(kind, types, {}, ALL_MESHES).total() > 300


@pytest.mark.parametrize(("kind", "attrs"), UNARY, ids=str)
def test_unary_ops_match_one_device(kind: str, attrs: dict[str, Any]) -> None:
    sweep_rule(kind, [X], attrs, ALL_MESHES)


@pytest.mark.parametrize("kind", ["log", "sqrt", "rsqrt"])
def test_unary_ops_of_positive_inputs_match_one_device(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def positive(
        kind: str, types: Sequence[TensorType], attrs: Any, rng: np.random.Generator
    ) -> list[Array]:
        return [0.5 + rng.random(t.shape) for t in types]

    monkeypatch.setattr(check_module, "random_inputs", positive)
    sweep_rule(kind, [TensorType((8, 4))], {}, ALL_MESHES)


def test_add_of_partial_sums_stays_partial() -> None:
    assert specs(rule("add", ["P(sum)R", "P(sum)R"])) == (["P(sum)R"] * 2, ["P(sum)R"])
    result = rule("add", ["P(sum)S(0)", "P(sum)S(0)"])
    assert specs(result) == (["P(sum)S(0)"] * 2, ["P(sum)S(0)"])
    # affine: a replicated addend joins the partial sums (kept by one rank of the group)
    assert specs(rule("add", ["P(sum)R", "RR"])) == (["P(sum)R"] * 2, ["P(sum)R"])


def test_nonlinear_ops_resolve_partials() -> None:
    """By a reduce-scatter onto a free dim: half the bytes of an all-reduce."""
    assert specs(rule("relu", ["P(sum)S(1)"])) == (["S(0)S(1)"], ["S(0)S(1)"])
    assert specs(rule("exp", ["P(avg)R"])) == (["S(0)R"], ["S(0)R"])


def test_linear_unary_ops_pass_partials() -> None:
    assert specs(rule("neg", ["P(sum)R"])) == (["P(sum)R"], ["P(sum)R"])
    assert specs(rule("scale", ["RP(avg)"], attrs={"factor": 2.0}))[1] == ["RP(avg)"]


def test_multilinear_ops_keep_one_partial_input() -> None:
    assert specs(rule("mul", ["P(sum)R", "RR"])) == (["P(sum)R", "RR"], ["P(sum)R"])
    both = rule("mul", ["P(sum)R", "P(sum)R"])
    assert specs(both)[0].count("P(sum)R") == 1 and specs(both)[1] == ["P(sum)R"]
    # one partial input per mesh axis: a_i (dp) times b_j (tp) sums to a b over both axes
    crossed = rule("mul", ["RP(sum)", "P(sum)R"])
    assert specs(crossed) == (["RP(sum)", "P(sum)R"], ["P(sum)P(sum)"])
    assert specs(rule("div", ["P(sum)R", "RR"]))[1] == ["P(sum)R"]
    # not linear in the denominator: reduce-scattered, the numerator sliced alike
    assert specs(rule("div", ["RR", "P(sum)R"])) == (["S(0)R", "S(0)R"], ["S(0)R"])


def test_broadcast_dims_follow_the_larger_operand() -> None:
    types = [X, TensorType((4, 8))]
    assert specs(rule("add", ["S(0)S(2)", "RR"], types)) == (["S(0)S(2)", "RS(1)"], ["S(0)S(2)"])
    one = [TensorType((8, 1, 8)), TensorType((4, 1))]
    result = rule("mul", ["RS(0)", "S(0)R"], one)
    assert specs(result)[1] == ["S(1)S(0)"]


@st.composite
def broadcast_pair(draw: st.DrawFn) -> tuple[TensorType, TensorType]:
    out = draw(st.lists(st.sampled_from([2, 4, 8]), min_size=1, max_size=3))
    size = draw(st.integers(0, len(out)))
    other = [1 if draw(st.booleans()) else d for d in out[len(out) - size :]]
    a = [1 if draw(st.integers(0, 3)) == 0 else d for d in out]
    pair = [TensorType(tuple(a)), TensorType(tuple(other))]
    return (pair[0], pair[1]) if draw(st.booleans()) else (pair[1], pair[0])


@settings(max_examples=80, deadline=None)
@given(pair=broadcast_pair(), data=st.data())
def test_random_broadcast_adds_match_one_device(
    pair: tuple[TensorType, TensorType], data: st.DataObject
) -> None:
    kind = data.draw(st.sampled_from(["add", "mul", "sub"]))
    mesh = data.draw(st.sampled_from(ALL_MESHES))
    arriving = [data.draw(st.sampled_from([None, *all_specs(t, mesh)])) for t in pair]
    check = check_rule(kind, list(pair), arriving, {}, mesh, np.random.default_rng(0))
    assert check.rule.fallback is False
    assert max(check.max_abs_error) < TOL, ([str(s) for s in arriving], check.rule.reason)
