"""shape ops: numpy implementations against torch, shape inference, costs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from shardlab.errors import OpSignatureError
from shardlab.ir import TensorType
from shardlab.ops import get_op, infer_types

rng = np.random.default_rng(9)


def run(kind: str, *xs: np.ndarray, **attrs: Any) -> list[np.ndarray]:
    """The numpy impl's outputs, after checking they have the inferred shapes."""
    types = [TensorType(x.shape, "float32" if x.dtype.kind == "f" else x.dtype.name) for x in xs]
    want = infer_types(kind, types, attrs)
    impl = get_op(kind).numpy_impl
    assert impl is not None
    outs = impl(xs, attrs)
    assert [o.shape for o in outs] == [t.shape for t in want]
    return outs


def same(out: np.ndarray, want: torch.Tensor) -> None:
    """Data movement is exact."""
    np.testing.assert_array_equal(out, want.numpy())


@pytest.mark.parametrize("shape", [[6, 4], [-1], [2, -1, 2], [4, 3, 2], [24]])
def test_reshape_matches_torch(shape: list[int]) -> None:
    x = rng.standard_normal((2, 3, 4))
    (out,) = run("reshape", x, shape=shape)
    same(out, torch.tensor(x).reshape(shape))


@pytest.mark.parametrize(("dim0", "dim1"), [(0, 1), (0, -1), (-1, -2), (1, 1)])
def test_transpose_matches_torch(dim0: int, dim1: int) -> None:
    x = rng.standard_normal((2, 3, 4))
    (out,) = run("transpose", x, dim0=dim0, dim1=dim1)
    same(out, torch.tensor(x).transpose(dim0, dim1))


@pytest.mark.parametrize("perm", [[0, 1, 2], [2, 0, 1], [1, 2, 0], [2, 1, 0]])
def test_permute_matches_torch(perm: list[int]) -> None:
    x = rng.standard_normal((2, 3, 4))
    (out,) = run("permute", x, perm=perm)
    same(out, torch.tensor(x).permute(perm))


@pytest.mark.parametrize(("dim", "sizes"), [(0, [1, 1]), (1, [2, 3, 1]), (-1, [4]), (-1, [1, 3])])
def test_split_matches_torch(dim: int, sizes: list[int]) -> None:
    x = rng.standard_normal((2, 6, 4))
    outs = run("split", x, dim=dim, sizes=sizes)
    wants = torch.split(torch.tensor(x), sizes, dim=dim)
    assert len(outs) == len(wants) == len(sizes)
    for out, want in zip(outs, wants, strict=True):
        same(out, want)


@pytest.mark.parametrize(
    ("shapes", "dim"),
    [([(2, 3)], 0), ([(2, 3), (4, 3)], 0), ([(2, 3), (2, 1), (2, 5)], -1), ([(1, 2, 3)] * 3, 1)],
)
def test_concat_matches_torch(shapes: list[tuple[int, ...]], dim: int) -> None:
    xs = [rng.standard_normal(s) for s in shapes]
    (out,) = run("concat", *xs, dim=dim)
    same(out, torch.cat([torch.tensor(x) for x in xs], dim=dim))


@pytest.mark.parametrize(
    ("dim", "start", "stop", "step"),
    [
        (0, 1, 4, 1),
        (1, 0, 5, 2),
        (-1, -3, None, 1),
        (1, None, -1, 1),
        (0, 2, 100, None),
        (0, -100, 2, 3),
        (1, 4, 5, None),
    ],
)
def test_slice_matches_torch(
    dim: int, start: int | None, stop: int | None, step: int | None
) -> None:
    x = rng.standard_normal((6, 5))
    attrs: dict[str, Any] = {"dim": dim, "start": start, "stop": stop}
    if step is not None:
        attrs["step"] = step
    (out,) = run("slice", x, **attrs)
    index = [slice(None)] * 2
    index[dim] = slice(start, stop, step)
    same(out, torch.tensor(x)[tuple(index)])


def test_infer_types() -> None:
    x = TensorType((2, 3, 4), "int64")
    assert infer_types("reshape", [x], {"shape": [4, -1]}) == [TensorType((4, 6), "int64")]
    assert infer_types("transpose", [x], {"dim0": 0, "dim1": -1}) == [
        TensorType((4, 3, 2), "int64")
    ]
    assert infer_types("permute", [x], {"perm": [1, 2, 0]}) == [TensorType((3, 4, 2), "int64")]
    assert infer_types("split", [x], {"dim": 1, "sizes": [1, 2]}) == [
        TensorType((2, 1, 4), "int64"),
        TensorType((2, 2, 4), "int64"),
    ]
    y = TensorType((2, 5, 4), "int64")
    assert infer_types("concat", [x, y], {"dim": 1}) == [TensorType((2, 8, 4), "int64")]
    assert infer_types("slice", [x], {"dim": 2, "start": 1, "stop": None}) == [
        TensorType((2, 3, 3), "int64")
    ]


X = TensorType((2, 3, 4))


@pytest.mark.parametrize(
    ("kind", "ins", "attrs", "match"),
    [
        (
            "reshape",
            [X],
            {"shape": [5, 5]},
            r"cannot reshape \[2, 3, 4\] \(24 elements\) to \[5, 5\]",
        ),
        ("reshape", [X], {"shape": [5, -1]}, r"cannot reshape \[2, 3, 4\] .* to \[5, -1\]"),
        ("reshape", [X], {"shape": [-1, -1]}, "at most one -1"),
        ("reshape", [X], {"shape": [0, 24]}, "'shape' .* must hold positive sizes"),
        ("reshape", [X], {}, "'shape' is required"),
        ("transpose", [X], {"dim0": 3, "dim1": 0}, "transpose: attribute 'dim0' 3 is out of range"),
        ("transpose", [X], {"dim0": 0, "dim1": -4}, "attribute 'dim1' -4 is out of range"),
        ("permute", [X], {"perm": [0, 1]}, r"'perm' \[0, 1\] is not a permutation of range\(3\)"),
        ("permute", [X], {"perm": [0, 0, 1]}, "not a permutation"),
        ("permute", [X], {"perm": [0, 1, -1]}, "not a permutation"),
        ("split", [X], {"dim": 1, "sizes": [1, 1]}, r"'sizes' \[1, 1\] .* sum to dim 1 of size 3"),
        ("split", [X], {"dim": 1, "sizes": [4, -1]}, "must be positive"),
        ("split", [X], {"dim": 1, "sizes": []}, "'sizes'"),
        ("split", [X], {"dim": 5, "sizes": [3]}, "split: attribute 'dim' 5 is out of range"),
        ("concat", [X, TensorType((2, 3, 5))], {"dim": 0}, "concat: input 1 is float32"),
        ("concat", [X, X, TensorType((2, 3, 4), "int64")], {"dim": 0}, "input 2 is int64"),
        ("concat", [X, TensorType((2, 3))], {"dim": 0}, r"input 1 is float32\[2,3\]"),
        ("concat", [X], {"dim": 3}, "concat: attribute 'dim' 3 is out of range"),
        ("concat", [], {"dim": 0}, "concat takes at least 1 inputs, got 0"),
        ("slice", [X], {"dim": 1, "start": 3, "stop": 5}, "selects nothing of dim 1 .size 3."),
        ("slice", [X], {"dim": 1, "start": 2, "stop": 1}, "selects nothing"),
        ("slice", [X], {"dim": 1, "start": 0, "stop": 2, "step": 0}, "'step' must be > 0"),
        ("slice", [X], {"dim": 1, "start": 0, "stop": 2, "step": -1}, "'step' must be > 0"),
        ("slice", [X], {"dim": 1, "start": "a", "stop": 2}, "'start' must be an integer"),
    ],
)
def test_infer_errors(kind: str, ins: list[TensorType], attrs: dict[str, Any], match: str) -> None:
    with pytest.raises(OpSignatureError, match=match):
        infer_types(kind, ins, attrs)


def test_costs() -> None:
    x, y = TensorType((2, 3, 4)), TensorType((6, 4))
    for kind in ("reshape", "transpose", "permute", "split", "concat", "slice"):
        assert get_op(kind).flops([x], [y], {}) == 0
    assert get_op("reshape").bytes([x], [y], {}) == 0  # a view
    assert get_op("transpose").bytes([x], [x], {}) == 2 * 24 * 4  # a contiguous copy
