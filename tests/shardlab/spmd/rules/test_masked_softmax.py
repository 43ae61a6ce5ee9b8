"""Rules for masked_softmax and masked_softmax_grad: every placement they produce matches one
device; keys stay whole; a causal query block masks from its global offset."""

from __future__ import annotations

from typing import Any

import pytest

import shardlab.spmd  # noqa: F401  (attaches the rules)
from shardlab.ir import TensorType
from shardlab.mesh import Mesh
from shardlab.placement import DistSpec
from shardlab.spmd import infer
from shardlab.spmd.check import sweep_rule

MESHES = [Mesh((2,), ("x",)), Mesh((4,), ("x",)), Mesh((2, 2), ("dp", "tp"))]
CUBE = Mesh((2, 2, 2), ("x", "y", "z"))
S = TensorType((2, 4, 8, 8))  # [batch, heads, queries, keys]
CASES: dict[str, dict[str, Any]] = {
    "causal": {"scale": 0.5, "causal": True},
    "plain": {"scale": 2.0},
}


@pytest.mark.parametrize("mesh", [*MESHES, CUBE], ids=str)
@pytest.mark.parametrize("case", CASES)
def test_masked_softmax_every_arriving_spec_matches_one_device(case: str, mesh: Mesh) -> None:
    kernels = sweep_rule("masked_softmax", [S], CASES[case], [mesh], sampled=100)
    assert kernels["default"] > 0
    if case == "causal":
        assert kernels["masked_softmax_query_offset"] > 0, kernels
    else:
        assert "masked_softmax_query_offset" not in kernels


@pytest.mark.parametrize("mesh", [*MESHES, CUBE], ids=str)
def test_masked_softmax_grad_every_arriving_spec_matches_one_device(mesh: Mesh) -> None:
    sweep_rule("masked_softmax_grad", [S, S], {"scale": 0.5}, [mesh], sampled=100)


def spec(text: str) -> DistSpec:
    return DistSpec.parse(text, MESHES[2])


def test_heads_and_queries_shard_keys_stay_whole() -> None:
    attrs = CASES["causal"]
    heads = infer("masked_softmax", [S], [spec("S(0)S(1)")], attrs, MESHES[2])
    assert str(heads.output_specs[0]) == "S(0)S(1)" and heads.kernel == "default"
    queries = infer("masked_softmax", [S], [spec("RS(2)")], attrs, MESHES[2])
    assert str(queries.output_specs[0]) == "RS(2)"
    assert queries.kernel == "masked_softmax_query_offset" and "global offset" in queries.reason
    keys = infer("masked_softmax", [S], [spec("RS(3)")], attrs, MESHES[2])
    assert "S(3)" not in str(keys.input_specs[0]) and "S(3)" not in str(keys.output_specs[0])
    partial = infer("masked_softmax", [S], [spec("RP(sum)")], attrs, MESHES[2])
    assert "P" not in str(partial.output_specs[0])


def test_grad_is_linear_in_dy() -> None:
    rule = infer("masked_softmax_grad", [S, S], [spec("S(0)R"), spec("S(0)P(sum)")],
                 {"scale": 0.5}, MESHES[2])  # fmt: skip
    assert [str(s) for s in rule.input_specs] == ["S(0)R", "S(0)P(sum)"]
    assert str(rule.output_specs[0]) == "S(0)P(sum)" and rule.kernel == "default"
