"""Rules for matmul and linear: Megatron's column / row parallel specs, and numerics."""

from __future__ import annotations

from collections.abc import Sequence
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

MESHES = [Mesh((2,), ("x",)), Mesh((4,), ("x",)), Mesh((2, 2), ("dp", "tp"))]
CUBE = Mesh((2, 2, 2), ("x", "y", "z"))
ALL_MESHES = [*MESHES, CUBE]
TOL = 1e-9
M = TensorType((8, 8))


def rule(
    kind: str,
    texts: Sequence[str],
    types: Sequence[TensorType] = (M, M),
    attrs: dict[str, Any] | None = None,
    mesh: Mesh = MESHES[0],
) -> RuleResult:
    """The rule's answer for inputs arriving in the placements `texts`."""
    arriving = [DistSpec.parse(t, mesh) for t in texts]
    return infer(kind, list(types), arriving, attrs or {}, mesh)


def specs(result: RuleResult) -> tuple[list[str], list[str]]:
    return [str(s) for s in result.input_specs], [str(s) for s in result.output_specs]


CASES = [
    ("matmul", [M, M], {}),
    ("matmul", [TensorType((4, 8, 8)), TensorType((8, 4))], {}),
    ("matmul", [TensorType((2, 1, 8, 4)), TensorType((4, 4, 8))], {}),
    ("matmul", [M, TensorType((4, 8))], {"transpose_a": True, "transpose_b": True}),
    ("linear", [TensorType((8, 4, 8)), TensorType((8, 4))], {}),
    ("linear", [TensorType((4, 8)), TensorType((8, 8)), TensorType((8,))], {}),
]


@pytest.mark.parametrize(("kind", "types", "attrs"), CASES, ids=lambda v: str(v))
def test_linalg_matches_one_device(
    kind: str, types: list[TensorType], attrs: dict[str, Any]
) -> None:
    assert sweep_rule(kind, types, attrs, ALL_MESHES).total() > 300


def test_contracted_shards_give_partial_sums() -> None:
    result = rule("matmul", ["S(1)", "S(0)"])
    assert specs(result) == (["S(1)", "S(0)"], ["P(sum)"])
    assert "contracted" in result.reason


def test_row_and_column_shards_follow() -> None:
    assert specs(rule("matmul", ["S(0)", "R"])) == (["S(0)", "R"], ["S(0)"])
    assert specs(rule("matmul", ["R", "S(1)"])) == (["R", "S(1)"], ["S(1)"])
    mesh = MESHES[2]
    assert specs(rule("matmul", ["S(0)R", "RS(1)"], mesh=mesh)) == (
        ["S(0)R", "RS(1)"],
        ["S(0)S(1)"],
    )


def test_partial_inputs_pass_through_one_operand() -> None:
    assert specs(rule("matmul", ["P(sum)", "R"])) == (["P(sum)", "R"], ["P(sum)"])
    assert specs(rule("matmul", ["R", "P(avg)"])) == (["R", "P(avg)"], ["P(avg)"])
    both = rule("matmul", ["P(sum)", "P(sum)"])
    assert specs(both)[1] == ["P(sum)"]
    assert sorted(specs(both)[0]) == ["P(sum)", "R"]  # one operand resolved, not both partial


def test_row_parallel_linear_bias_joins_the_partial_sums() -> None:
    types = [TensorType((4, 8)), M, TensorType((8,))]
    result = rule("linear", ["S(1)", "S(0)", "R"], types)
    assert specs(result) == (["S(1)", "S(0)", "P(sum)"], ["P(sum)"])
    assert "bias joins the partial sums" in result.reason
    column = rule("linear", ["R", "S(1)", "S(0)"], types)
    assert specs(column) == (["R", "S(1)", "S(0)"], ["S(1)"])


@settings(max_examples=50, deadline=None)
@given(
    batch=st.lists(st.sampled_from([1, 2, 4]), max_size=2),
    m=st.sampled_from([2, 4, 8]),
    k=st.sampled_from([2, 4, 8]),
    n=st.sampled_from([2, 4, 8]),
    data=st.data(),
)
def test_random_matmuls_match_one_device(
    batch: list[int], m: int, k: int, n: int, data: st.DataObject
) -> None:
    b_batch = batch[data.draw(st.integers(0, len(batch))) :]
    types = [TensorType((*batch, m, k)), TensorType((*b_batch, k, n))]
    mesh = data.draw(st.sampled_from(ALL_MESHES))
    arriving = [data.draw(st.sampled_from([None, *all_specs(t, mesh)])) for t in types]
    check = check_rule("matmul", types, arriving, {}, mesh, np.random.default_rng(0))
    assert check.rule.fallback is False
    assert max(check.max_abs_error) < TOL, ([str(s) for s in arriving], check.rule.reason)
