"""Attention-family rules: scaled_dot_product_attention, rotary_embedding, rope_cache.

Numerics: every combination of arriving specs on (2,), (4,) and (2, 2) meshes, except for
sdpa on (2, 2) where every (q, k) pair is checked with v drawn at random (all triples would
be ~47k checks); 200 random combinations on (2, 2, 2).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest

import shardlab.spmd  # noqa: F401  (attaches the rules)
from shardlab.ir import TensorType
from shardlab.mesh import Mesh
from shardlab.placement import DistSpec
from shardlab.spmd import infer
from shardlab.spmd.check import all_specs, check_rule, sweep_rule

MESHES = [
    Mesh((2,), ("x",)),
    Mesh((4,), ("x",)),
    Mesh((2, 2), ("dp", "tp")),
    Mesh((2, 2, 2), ("pp", "dp", "tp")),
]
SAMPLED = 200  # arriving specs drawn at random on the (2, 2, 2) mesh
TOL = 1e-9


def options(mesh: Mesh) -> dict[str, Any]:
    """`sweep_rule` options: a seed per mesh, None arriving on 1-D meshes only."""
    return {"sampled": SAMPLED, "seed": math.prod(mesh.shape), "free_max_ndim": 1}


def spec(text: str, mesh: Mesh) -> DistSpec:
    return DistSpec.parse(text, mesh)


SDPA = "scaled_dot_product_attention"
MESH2 = MESHES[2]


def qkv(b: int, s: int, hq: int, hkv: int, d: int, dv: int) -> list[TensorType]:
    return [TensorType((b, s, hq, d)), TensorType((b, s, hkv, d)), TensorType((b, s, hkv, dv))]


SDPA_CASES = {
    "gqa-causal": (qkv(2, 8, 4, 2, 4, 4), {"causal": True}),
    "gqa-noncausal-scaled": (qkv(4, 8, 4, 2, 4, 8), {"causal": False, "scale": 0.3}),
    "mha-causal": (qkv(2, 8, 4, 4, 4, 4), {}),
    "mha-noncausal": (qkv(2, 8, 4, 4, 8, 4), {"causal": False}),
}


@pytest.mark.parametrize("mesh", MESHES, ids=str)
@pytest.mark.parametrize("case", SDPA_CASES)
def test_sdpa_every_arriving_spec_matches_one_device(case: str, mesh: Mesh) -> None:
    types, attrs = SDPA_CASES[case]
    kernels = sweep_rule(SDPA, types, attrs, [mesh], pair=(0, 1), **options(mesh))
    assert kernels["default"] > 0
    if attrs.get("causal", True):
        assert kernels["attention_query_offset"] > 0, kernels
    else:
        assert "attention_query_offset" not in kernels


ROTARY = [TensorType((4, 8, 4, 4)), TensorType((8, 2)), TensorType((8, 2))]


@pytest.mark.parametrize("mesh", MESHES, ids=str)
def test_rotary_every_arriving_spec_matches_one_device(mesh: Mesh) -> None:
    assert sweep_rule("rotary_embedding", ROTARY, {}, [mesh], **options(mesh))["default"] > 0


@pytest.mark.parametrize("mesh", MESHES, ids=str)
def test_rope_cache_every_hint_matches_one_device(mesh: Mesh) -> None:
    attrs = {"seq": 8, "head_dim": 8}
    rng = np.random.default_rng(0)
    table = TensorType((8, 4))
    options: list[DistSpec | None] = [None, *all_specs(table, mesh, partial=False)]
    for cos, sin in itertools.product(options, repeat=2):
        check = check_rule("rope_cache", [], [], attrs, mesh, rng, [cos, sin])
        assert check.rule.kernel == "replicated" and not check.rule.fallback
        assert max(check.max_abs_error) < TOL
        if cos is not None and cos == sin:
            assert check.rule.output_specs == (cos, cos)


def test_rope_cache_follows_an_s_hint_else_replicates() -> None:
    attrs = {"seq": 8, "head_dim": 8}
    hinted = infer("rope_cache", [], [], attrs, MESH2, [spec("RS(0)", MESH2), None])
    assert [str(s) for s in hinted.output_specs] == ["RS(0)", "RS(0)"]
    assert hinted.input_specs == () and hinted.kernel == "replicated"
    free = infer("rope_cache", [], [], attrs, MESH2)
    assert [str(s) for s in free.output_specs] == ["RR", "RR"]
    assert "keeps its block" in free.reason


def test_sdpa_heads_sharded_stay_sharded_with_gqa() -> None:
    types, attrs = SDPA_CASES["gqa-causal"]
    rule = infer(SDPA, types, [spec("S(0)S(2)", MESH2)] * 3, attrs, MESH2)
    assert [str(s) for s in rule.input_specs] == ["S(0)S(2)"] * 3
    assert str(rule.output_specs[0]) == "S(0)S(2)"
    assert rule.kernel == "default"


def test_sdpa_shards_query_heads_alone_when_the_kv_heads_do_not_divide() -> None:
    mesh = Mesh((4,), ("tp",))
    types = qkv(2, 8, 4, 2, 4, 4)  # 4 query heads, 2 kv heads: 4 ranks cannot split the kv
    rule = infer(SDPA, types, [spec("S(2)", mesh), None, None], {}, mesh)
    assert [str(s) for s in rule.input_specs] == ["S(2)", "R", "R"]
    assert str(rule.output_specs[0]) == "S(2)"
    assert rule.kernel == "attention_head_offset" and "kv heads are whole" in rule.reason
    rng = np.random.default_rng(0)
    check = check_rule(SDPA, types, [spec(t, mesh) for t in ("S(2)", "R", "R")], {}, mesh, rng)
    assert max(check.max_abs_error) < TOL
    grad_types = [*types, TensorType((2, 8, 4, 4))]
    arriving_ = [spec(t, mesh) for t in ("S(2)", "R", "R", "S(2)")]
    grad = infer("attention_grad", grad_types, arriving_, {}, mesh)
    assert [str(s) for s in grad.output_specs] == ["S(2)", "P(sum)", "P(sum)"]
    assert grad.kernel == "attention_grad_head_offset"
    check = check_rule("attention_grad", grad_types, arriving_, {}, mesh, rng)
    assert max(check.max_abs_error) < TOL


def test_sdpa_causal_query_sequence_uses_the_offset_kernel() -> None:
    types, _ = SDPA_CASES["mha-causal"]
    arriving_ = [spec("RS(1)", MESH2), spec("RR", MESH2), spec("RR", MESH2)]
    rule = infer(SDPA, types, arriving_, {"causal": True}, MESH2)
    assert [str(s) for s in rule.input_specs] == ["RS(1)", "RR", "RR"]
    assert str(rule.output_specs[0]) == "RS(1)"
    assert rule.kernel == "attention_query_offset"
    assert "global query offset" in rule.reason
    plain = infer(SDPA, types, arriving_, {"causal": False}, MESH2)
    assert str(plain.output_specs[0]) == "RS(1)" and plain.kernel == "default"


def test_sdpa_keeps_kv_sequence_and_head_dims_whole_and_resolves_partials() -> None:
    types, attrs = SDPA_CASES["mha-causal"]
    mesh = MESHES[0]
    for text in ("S(1)", "S(3)", "P(sum)"):
        rule = infer(SDPA, types, [None, spec(text, mesh), spec(text, mesh)], attrs, mesh)
        # the kv sequence and head dims never stay sharded, nor do partial sums: moved onto
        # the batch (all_to_all; a reduce-scatter costs half an all-reduce)
        assert [str(s) for s in rule.input_specs[1:]] == ["S(0)", "S(0)"], text
    rule = infer(SDPA, types, [spec("P(sum)", mesh), None, None], attrs, mesh)
    assert [str(s) for s in rule.input_specs] == ["S(0)"] * 3
    assert str(rule.output_specs[0]) == "S(0)"


def test_rotary_shares_the_sequence_letter_with_cos_and_sin() -> None:
    rule = infer("rotary_embedding", ROTARY, [spec("S(1)S(2)", MESH2), None, None], {}, MESH2)
    assert [str(s) for s in rule.input_specs] == ["S(1)S(2)", "S(0)R", "S(0)R"]
    assert str(rule.output_specs[0]) == "S(1)S(2)"


def test_rotary_is_linear_in_x_only() -> None:
    mesh = MESHES[0]
    partial = spec("P(sum)", mesh)
    rule = infer("rotary_embedding", ROTARY, [partial, None, None], {}, mesh, [partial])
    assert [str(s) for s in rule.input_specs] == ["P(sum)", "R", "R"]
    assert str(rule.output_specs[0]) == "P(sum)"
    # a partial cos is reduce-scattered onto the sequence, which x then follows for free
    cos_partial = infer("rotary_embedding", ROTARY, [None, partial, None], {}, mesh, [partial])
    assert [str(s) for s in cos_partial.input_specs] == ["S(1)", "S(0)", "S(0)"]
