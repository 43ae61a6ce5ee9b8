"""Rules for reshape (view groups), transpose / permute, split, slice and concat."""

from __future__ import annotations

import math
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
from shardlab.spmd.rules.shape import view_groups

MESHES = [Mesh((2,), ("x",)), Mesh((4,), ("x",)), Mesh((2, 2), ("dp", "tp"))]
CUBE = Mesh((2, 2, 2), ("x", "y", "z"))
ALL_MESHES = [*MESHES, CUBE]
TOL = 1e-9
X = TensorType((8, 4, 16))


def rule(
    kind: str, texts: Sequence[str], attrs: dict[str, Any], types: Sequence[TensorType] = (X,)
) -> RuleResult:
    """The rule's answer for inputs arriving in the placements `texts` on the (dp, tp) mesh."""
    mesh = MESHES[2]
    return infer(kind, list(types), [DistSpec.parse(t, mesh) for t in texts], attrs, mesh)


def specs(result: RuleResult) -> tuple[list[str], list[str]]:
    return [str(s) for s in result.input_specs], [str(s) for s in result.output_specs]


CASES = [
    ("reshape", [X], {"shape": [8, 4, 4, 4]}),  # split the last dim (heads)
    ("reshape", [TensorType((8, 4, 4, 4))], {"shape": [8, 4, 16]}),  # merge heads
    ("reshape", [X], {"shape": [32, -1]}),  # merge the first two
    ("reshape", [X], {"shape": [4, 16, 8]}),  # mixed: [8, 4, 16] is one group
    ("reshape", [X], {"shape": [8, 1, 64]}),  # size-1 output dim
    ("reshape", [TensorType((8, 1, 16))], {"shape": [2, 4, 16]}),  # size-1 input dim
    ("reshape", [X], {"shape": [512]}),
    ("transpose", [X], {"dim0": 0, "dim1": -1}),
    ("transpose", [X], {"dim0": 1, "dim1": 2}),
    ("permute", [X], {"perm": [2, 0, 1]}),
    ("split", [X], {"dim": 2, "sizes": [8, 4, 4]}),
    ("split", [X], {"dim": -3, "sizes": [4, 4]}),
    ("slice", [X], {"dim": 2, "start": 2, "stop": -2, "step": 3}),
    ("slice", [X], {"dim": 0, "start": None, "stop": 4}),
    ("concat", [X, TensorType((8, 4, 8))], {"dim": -1}),
    ("concat", [TensorType((8, 4)), TensorType((8, 8)), TensorType((8, 4))], {"dim": 1}),
]


@pytest.mark.parametrize(("kind", "types", "attrs"), CASES, ids=lambda v: str(v))
def test_shape_ops_match_one_device(
    kind: str, types: list[TensorType], attrs: dict[str, Any]
) -> None:
    assert sweep_rule(kind, types, attrs, ALL_MESHES).total() > 300


def test_reshape_split_heads_keeps_the_sharding() -> None:
    result = rule("reshape", ["RS(2)"], {"shape": [8, 4, 4, 4]})
    assert specs(result) == (["RS(2)"], ["RS(2)"])
    assert result.kernel == "reshape_local"
    assert "tp: input dim 2 sharded carries to output dim 2" in result.reason
    assert [c.choice for c in result.choices] == ["R", "S(2)"]


def test_reshape_merge_heads_keeps_the_sharding() -> None:
    merged = rule("reshape", ["S(0)S(2)"], {"shape": [8, 4, 16]}, [TensorType((8, 4, 4, 4))])
    assert specs(merged) == (["S(0)S(2)"], ["S(0)S(2)"])
    assert "merged" in merged.reason


def test_reshape_moves_inner_shardings_and_drops_non_dividing_ones() -> None:
    """An inner dim of a merge moves to the group's outer dim (one all_to_all, not a
    gather of n blocks); a sharding the output dim cannot divide is dropped."""
    inner = rule("reshape", ["RS(3)"], {"shape": [8, 4, 16]}, [TensorType((8, 4, 4, 4))])
    assert specs(inner) == (["RS(2)"], ["RS(2)"])
    assert "inner dim of its group" in inner.reason and "all_to_all" in inner.reason
    assert inner.reshards([DistSpec.parse("RS(3)", MESHES[2])]) == [0]
    small = rule("reshape", ["S(2)S(2)"], {"shape": [8, 4, 2, 8]})
    assert specs(small) == (["S(2)R"], ["S(2)R"])
    assert "does not divide into 4 shards" in small.reason
    # dim 2 joins dim 1's split as its inner part: [8, 4, 16] -> [8, 64], dim 1 over dp, tp
    assert specs(rule("reshape", ["S(1)S(2)"], {"shape": [8, 64]})) == (["S(1)S(1)"], ["S(1)S(1)"])
    assert specs(rule("reshape", ["S(0)R"], {"shape": [4, 16, 8]})) == (["S(0)R"], ["S(0)R"])


def test_reshape_passes_partials_and_keeps_the_default_kernel_when_unsharded() -> None:
    result = rule("reshape", ["P(sum)P(max)"], {"shape": [32, 16]})
    assert specs(result) == (["P(sum)P(max)"], ["P(sum)P(max)"])
    assert result.kernel == "default"
    assert specs(rule("reshape", ["P(avg)S(2)"], {"shape": [8, 4, 4, 4]})) == (
        ["P(avg)S(2)"],
        ["P(avg)S(2)"],
    )


def test_reshape_of_a_free_input_follows_a_simple_hint() -> None:
    mesh = MESHES[2]
    hint = DistSpec.parse("S(0)S(2)", mesh)
    result = infer("reshape", [X], [None], {"shape": [8, 4, 4, 4]}, mesh, [hint])
    assert specs(result) == (["S(0)S(2)"], ["S(0)S(2)"])
    inner = DistSpec.parse("RS(3)", mesh)
    result = infer("reshape", [X], [None], {"shape": [8, 4, 4, 4]}, mesh, [inner])
    assert specs(result) == (["RR"], ["RR"])


def test_view_groups() -> None:
    assert view_groups((8, 4, 16), (8, 4, 4, 4)) == [((0,), (0,)), ((1,), (1,)), ((2,), (2, 3))]
    assert view_groups((8, 4, 4, 4), (8, 4, 16)) == [((0,), (0,)), ((1,), (1,)), ((2, 3), (2,))]
    assert view_groups((6, 4), (4, 6)) == [((0, 1), (0, 1))]
    assert view_groups((2, 1, 3), (6,)) == [((0, 1, 2), (0,))]
    assert view_groups((4,), (1, 4)) == [((), (0,)), ((0,), (1,))]
    assert view_groups((1, 4), (4,)) == [((0,), ()), ((1,), (0,))]
    assert view_groups((), (1, 1)) == [((), (0,)), ((), (1,))]


def test_transpose_and_permute_move_the_letters() -> None:
    assert specs(rule("transpose", ["S(0)R"], {"dim0": 0, "dim1": 1})) == (["S(0)R"], ["S(1)R"])
    assert specs(rule("permute", ["S(0)S(2)"], {"perm": [2, 0, 1]})) == (
        ["S(0)S(2)"],
        ["S(1)S(0)"],
    )
    assert specs(rule("transpose", ["P(sum)S(0)"], {"dim0": 0, "dim1": 2})) == (
        ["P(sum)S(0)"],
        ["P(sum)S(2)"],
    )
    one = Mesh((2,), ("x",))
    for op in ("sum", "avg", "max"):
        spec = DistSpec.parse(f"P({op})", one)
        result = infer("transpose", [X], [spec], {"dim0": 0, "dim1": 2}, one)
        assert specs(result) == ([f"P({op})"], [f"P({op})"])


def test_split_and_slice_keep_their_dim_whole() -> None:
    # the cut dim arrives sharded: an all_to_all moves it onto a dim no other axis shards
    split = rule("split", ["S(0)S(2)"], {"dim": 2, "sizes": [8, 4, 4]})
    assert specs(split) == (["S(0)S(1)"], ["S(0)S(1)"] * 3)
    sliced = rule("slice", ["S(1)S(0)"], {"dim": 1, "start": 1, "stop": 3})
    assert specs(sliced) == (["S(2)S(0)"], ["S(2)S(0)"])
    assert specs(rule("slice", ["P(sum)S(1)"], {"dim": 2, "start": 0, "stop": 8})) == (
        ["P(sum)S(1)"],
        ["P(sum)S(1)"],
    )


def test_split_of_a_partial_resolves_once_before_the_pieces() -> None:
    # One all-reduce of the input is cheaper than one per piece: the cost model resolves.
    assert specs(rule("split", ["P(sum)R"], {"dim": 2, "sizes": [8, 8]})) == (["RR"], ["RR", "RR"])
    mesh = MESHES[2]
    hints = [DistSpec.parse("P(sum)R", mesh)] * 2
    arriving = [DistSpec.parse("P(sum)R", mesh)]
    result = infer("split", [X], arriving, {"dim": 2, "sizes": [8, 8]}, mesh, hints)
    assert specs(result) == (["P(sum)R"], ["P(sum)R", "P(sum)R"])


def test_concat_is_affine_and_keeps_its_dim_whole() -> None:
    types = [X, TensorType((8, 4, 8))]
    result = rule("concat", ["P(sum)S(0)", "P(sum)S(0)"], {"dim": 2}, types)
    assert specs(result) == (["P(sum)S(0)", "P(sum)S(0)"], ["P(sum)S(0)"])
    # A replicated input joins the partial sums for free (held by one rank of the group).
    three = [TensorType((8, 4)), TensorType((8, 8)), TensorType((8, 4))]
    result = rule("concat", ["P(sum)R", "P(sum)R", "RR"], {"dim": 1}, three)
    assert specs(result) == (["P(sum)R"] * 3, ["P(sum)R"])
    whole = rule("concat", ["S(2)R", "S(1)R"], {"dim": 2}, types)
    assert specs(whole) == (["S(1)R", "S(1)R"], ["S(1)R"])  # dim 2 whole, dim 1 followed
    # the joined dim arrives sharded: moved onto dim 0 (the other input slices for free)
    moved = rule("concat", ["RS(2)", "RR"], {"dim": 2}, types)
    assert specs(moved) == (["RS(0)", "RS(0)"], ["RS(0)"])


def _factor_shapes(draw: st.DrawFn) -> tuple[list[int], list[int]]:
    """Two shapes with the same element count, built from one list of small factors."""
    factors = draw(st.lists(st.sampled_from([1, 2, 2, 3, 4]), min_size=1, max_size=6))

    def group(perm: list[int]) -> list[int]:
        cuts = draw(st.lists(st.booleans(), min_size=len(perm) - 1, max_size=len(perm) - 1))
        shape = [perm[0]]
        for f, cut in zip(perm[1:], cuts, strict=True):
            if cut:
                shape.append(f)
            else:
                shape[-1] *= f
        return shape

    return group(factors), group(draw(st.permutations(factors)))


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_random_reshapes_match_one_device(data: st.DataObject) -> None:
    src, dst = _factor_shapes(data.draw)
    groups = view_groups(src, dst)
    assert [d for ins, _ in groups for d in ins] == list(range(len(src)))
    assert [d for _, outs in groups for d in outs] == list(range(len(dst)))
    for ins, outs in groups:
        assert math.prod(src[d] for d in ins) == math.prod(dst[d] for d in outs)
    x = TensorType(tuple(src))
    mesh = data.draw(st.sampled_from(ALL_MESHES))
    spec = data.draw(st.sampled_from([None, *all_specs(x, mesh)]))
    check = check_rule("reshape", [x], [spec], {"shape": dst}, mesh, np.random.default_rng(0))
    assert check.rule.fallback is False
    assert max(check.max_abs_error) < TOL, (src, dst, str(spec), check.rule.reason)


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.sampled_from([2, 4, 8]), min_size=1, max_size=4),
    data=st.data(),
)
def test_random_permutes_match_one_device(shape: list[int], data: st.DataObject) -> None:
    x = TensorType(tuple(shape))
    perm = data.draw(st.permutations(range(len(shape))))
    mesh = data.draw(st.sampled_from(ALL_MESHES))
    spec = data.draw(st.sampled_from([None, *all_specs(x, mesh)]))
    check = check_rule("permute", [x], [spec], {"perm": perm}, mesh, np.random.default_rng(0))
    assert max(check.max_abs_error) < TOL, (shape, perm, str(spec), check.rule.reason)
