"""reduce ops: numpy implementations against torch, shape inference, FLOPs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from shardlab.errors import OpSignatureError
from shardlab.ir import TensorType
from shardlab.ops import get_op, infer_types

TOL = {"rtol": 1e-12, "atol": 1e-12}
rng = np.random.default_rng(2)


def run(kind: str, *xs: np.ndarray, **attrs: Any) -> list[np.ndarray]:
    """The numpy impl's outputs, after checking they have the inferred shapes."""
    types = [TensorType(x.shape, "float32" if x.dtype.kind == "f" else x.dtype.name) for x in xs]
    want = infer_types(kind, types, attrs)
    impl = get_op(kind).numpy_impl
    assert impl is not None
    outs = impl(xs, attrs)
    assert [o.shape for o in outs] == [t.shape for t in want]
    return outs


def torch_reduce(kind: str, x: torch.Tensor, dims: list[int] | None, keep: bool) -> torch.Tensor:
    if kind == "max":
        if dims is None:
            return torch.amax(x, dim=tuple(range(x.dim())), keepdim=keep)
        return torch.amax(x, dim=dims, keepdim=keep)
    fn = torch.sum if kind == "sum" else torch.mean
    if dims is None:
        return fn(x, dim=tuple(range(x.dim())), keepdim=keep) if keep else fn(x)
    return fn(x, dim=dims, keepdim=keep)


@pytest.mark.parametrize("kind", ["sum", "mean", "max"])
@pytest.mark.parametrize("dims", [None, [0], [-1], [0, 2], [-1, 1], [2, 0, 1]])
@pytest.mark.parametrize("keep", [False, True])
def test_matches_torch(kind: str, dims: list[int] | None, keep: bool) -> None:
    x = rng.standard_normal((3, 4, 5))
    attrs: dict[str, Any] = {"keepdim": keep}
    if dims is not None:
        attrs["dims"] = dims
    (out,) = run(kind, x, **attrs)
    np.testing.assert_allclose(out, torch_reduce(kind, torch.tensor(x), dims, keep).numpy(), **TOL)


def test_max_of_the_torch_max_values() -> None:
    x = rng.standard_normal((4, 6))
    (out,) = run("max", x, dims=[1])
    np.testing.assert_array_equal(out, torch.max(torch.tensor(x), dim=1).values.numpy())


def test_sum_of_ints_keeps_dtype() -> None:
    x = rng.integers(-5, 5, (3, 4)).astype(np.int32)
    (out,) = run("sum", x, dims=[0])
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, torch.sum(torch.tensor(x), dim=0).numpy())


def test_infer_types() -> None:
    x = TensorType((2, 3, 4), "bfloat16")
    assert infer_types("sum", [x], {}) == [TensorType((), "bfloat16")]
    assert infer_types("sum", [x], {"dims": None, "keepdim": True}) == [
        TensorType((1, 1, 1), "bfloat16")
    ]
    assert infer_types("mean", [x], {"dims": [-1, 0]}) == [TensorType((3,), "bfloat16")]
    assert infer_types("max", [x], {"dims": [1], "keepdim": True}) == [
        TensorType((2, 1, 4), "bfloat16")
    ]
    assert infer_types("max", [TensorType((5,), "int64")], {}) == [TensorType((), "int64")]


@pytest.mark.parametrize(
    ("kind", "x", "attrs", "match"),
    [
        ("sum", TensorType((2, 3)), {"dims": [2]}, "sum: 'dims' entry 2 is out of range"),
        ("max", TensorType((2, 3)), {"dims": [-3]}, "max: 'dims' entry -3 is out of range"),
        ("sum", TensorType((2, 3)), {"dims": [1, -1]}, r"sum: attribute 'dims' \[1, -1\] names"),
        ("sum", TensorType((2, 3)), {"dims": []}, "'dims' is empty; use null"),
        ("sum", TensorType((2, 3)), {"dims": 1}, "'dims' must be a list of integers"),
        ("sum", TensorType((2, 3)), {"keepdim": 1}, "'keepdim' must be true or false"),
        ("mean", TensorType((2, 3), "int64"), {}, "mean needs a floating-point input"),
        ("sum", TensorType((2, 3), "bool"), {}, "sum needs a numeric input"),
    ],
)
def test_infer_errors(kind: str, x: TensorType, attrs: dict[str, Any], match: str) -> None:
    with pytest.raises(OpSignatureError, match=match):
        infer_types(kind, [x], attrs)


def test_flops_are_input_elements() -> None:
    x = TensorType((3, 4, 5))
    for kind in ("sum", "mean", "max"):
        (out,) = infer_types(kind, [x], {"dims": [1]})
        assert get_op(kind).flops([x], [out], {"dims": [1]}) == 60
