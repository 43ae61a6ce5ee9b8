"""Rules for layer_norm and rms_norm: the last dim stays whole, the others follow x."""

from __future__ import annotations

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

MESHES = [Mesh((2,), ("x",)), Mesh((4,), ("x",)), Mesh((2, 2), ("dp", "sp"))]
CUBE = Mesh((2, 2, 2), ("x", "y", "z"))
ALL_MESHES = [*MESHES, CUBE]
TOL = 1e-9


def norm_types(kind: str, shape: tuple[int, ...]) -> list[TensorType]:
    params = 2 if kind == "layer_norm" else 1
    return [TensorType(shape), *[TensorType(shape[-1:])] * params]


def rule(kind: str, *texts: str, shape: tuple[int, ...] = (8, 8, 4)) -> RuleResult:
    """The rule's answer for x (and the parameters) arriving in the placements `texts`."""
    mesh = MESHES[2]
    types = norm_types(kind, shape)
    arriving = [DistSpec.parse(t, mesh) for t in texts] + [None] * (len(types) - len(texts))
    return infer(kind, types, arriving, {}, mesh)


def specs(result: RuleResult) -> tuple[list[str], list[str]]:
    return [str(s) for s in result.input_specs], [str(s) for s in result.output_specs]


@pytest.mark.parametrize("kind", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("shape", [(8, 8, 4), (8, 4)])
def test_norms_match_one_device(kind: str, shape: tuple[int, ...]) -> None:
    assert sweep_rule(kind, norm_types(kind, shape), {"eps": 1e-5}, ALL_MESHES).total() > 300


def test_rms_norm_keeps_sequence_sharding() -> None:
    assert specs(rule("rms_norm", "S(1)R", "RR")) == (["S(1)R", "RR"], ["S(1)R"])
    assert specs(rule("rms_norm", "S(0)S(1)")) == (["S(0)S(1)", "RR"], ["S(0)S(1)"])


def test_layer_norm_batch_and_sequence_sharding_need_no_communication() -> None:
    result = rule("layer_norm", "S(0)S(1)", "RR", "RR")
    assert specs(result) == (["S(0)S(1)", "RR", "RR"], ["S(0)S(1)"])
    assert result.reshards([DistSpec.parse(t, MESHES[2]) for t in ("S(0)S(1)", "RR", "RR")]) == []


@pytest.mark.parametrize("kind", ["layer_norm", "rms_norm"])
def test_normalised_dim_stays_whole(kind: str) -> None:
    # dim 2 arrives sharded on dp: one all_to_all moves it onto dim 1 instead of gathering
    result = rule(kind, "S(2)S(0)", "S(0)R")
    assert specs(result)[0][:2] == ["S(1)S(0)", "RR"]
    assert specs(result)[1] == ["S(1)S(0)"]
    assert "which the op cannot keep" in result.reason


@pytest.mark.parametrize("kind", ["layer_norm", "rms_norm"])
def test_partial_inputs_are_resolved(kind: str) -> None:
    result = rule(kind, "P(sum)S(1)")  # reduce-scattered onto the batch
    assert specs(result)[0][0] == "S(0)S(1)"
    assert specs(result)[1] == ["S(0)S(1)"]
    weight_partial = rule(kind, "S(0)R", "P(sum)R")
    assert specs(weight_partial)[0][1] == "RR"


@settings(max_examples=40, deadline=None)
@given(
    kind=st.sampled_from(["layer_norm", "rms_norm"]),
    shape=st.lists(st.sampled_from([2, 4, 8]), min_size=1, max_size=4),
    data=st.data(),
)
def test_random_norms_match_one_device(kind: str, shape: list[int], data: st.DataObject) -> None:
    types = norm_types(kind, tuple(shape))
    mesh = data.draw(st.sampled_from(ALL_MESHES))
    arriving = [data.draw(st.sampled_from([None, *all_specs(t, mesh)])) for t in types]
    check = check_rule(kind, types, arriving, {}, mesh, np.random.default_rng(0))
    assert check.rule.fallback is False
    assert max(check.max_abs_error) < TOL, ([str(s) for s in arriving], check.rule.reason)
