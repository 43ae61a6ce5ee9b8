"""linalg ops: numpy implementations against torch, shape inference, FLOPs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from shardlab.errors import OpSignatureError
from shardlab.ir import TensorType
from shardlab.ops import get_op, infer_types

TOL = {"rtol": 1e-12, "atol": 1e-12}
rng = np.random.default_rng(0)


def run(kind: str, *xs: np.ndarray, **attrs: Any) -> list[np.ndarray]:
    """The numpy impl's outputs, after checking they have the inferred shapes."""
    types = [TensorType(x.shape, "float32" if x.dtype.kind == "f" else x.dtype.name) for x in xs]
    want = infer_types(kind, types, attrs)
    impl = get_op(kind).numpy_impl
    assert impl is not None
    outs = impl(xs, attrs)
    assert [o.shape for o in outs] == [t.shape for t in want]
    return outs


def t(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(x)


@pytest.mark.parametrize(
    ("a_shape", "b_shape", "ta", "tb"),
    [
        ((3, 4), (4, 5), False, False),
        ((4, 3), (4, 5), True, False),
        ((3, 4), (5, 4), False, True),
        ((4, 3), (5, 4), True, True),
        ((2, 3, 4), (2, 4, 5), False, False),
        ((2, 1, 3, 4), (5, 4, 6), False, False),
        ((7, 4, 3), (5, 4), True, True),
    ],
)
def test_matmul_matches_torch(
    a_shape: tuple[int, ...], b_shape: tuple[int, ...], ta: bool, tb: bool
) -> None:
    a, b = rng.standard_normal(a_shape), rng.standard_normal(b_shape)
    (out,) = run("matmul", a, b, transpose_a=ta, transpose_b=tb)
    ta_ = t(a).transpose(-1, -2) if ta else t(a)
    tb_ = t(b).transpose(-1, -2) if tb else t(b)
    np.testing.assert_allclose(out, torch.matmul(ta_, tb_).numpy(), **TOL)


@pytest.mark.parametrize("x_shape", [(5, 4), (2, 3, 4), (4,)])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_matches_torch(x_shape: tuple[int, ...], bias: bool) -> None:
    x, w, b = rng.standard_normal(x_shape), rng.standard_normal((4, 6)), rng.standard_normal(6)
    xs = (x, w, b) if bias else (x, w)
    (out,) = run("linear", *xs)
    want = torch.nn.functional.linear(t(x), t(w).T, t(b) if bias else None)
    np.testing.assert_allclose(out, want.numpy(), **TOL)


def test_matmul_infer() -> None:
    a, b = TensorType((8, 1, 3, 4)), TensorType((5, 4, 6))
    assert infer_types("matmul", [a, b], {}) == [TensorType((8, 5, 3, 6))]
    assert infer_types(
        "matmul",
        [TensorType((4, 3)), TensorType((6, 4))],
        {
            "transpose_a": True,
            "transpose_b": True,
        },
    ) == [TensorType((3, 6))]


@pytest.mark.parametrize(
    ("a", "b", "attrs", "match"),
    [
        (TensorType((3,)), TensorType((3, 4)), {}, "a must have rank >= 2"),
        (TensorType((3, 4)), TensorType((4,)), {}, "b must have rank >= 2"),
        (TensorType((3, 4)), TensorType((5, 6)), {}, "contracted dims disagree"),
        (TensorType((2, 3, 4)), TensorType((3, 4, 5)), {}, r"batch dims: shapes \[2\] and \[3\]"),
        (TensorType((3, 4), "int64"), TensorType((4, 5), "int64"), {}, "floating-point"),
        (TensorType((3, 4)), TensorType((4, 5), "float16"), {}, "one dtype"),
        (TensorType((3, 4)), TensorType((4, 5)), {"transpose_a": 1}, "'transpose_a'"),
    ],
)
def test_matmul_errors(a: TensorType, b: TensorType, attrs: dict[str, Any], match: str) -> None:
    with pytest.raises(OpSignatureError, match=match):
        infer_types("matmul", [a, b], attrs)


def test_linear_infer_and_errors() -> None:
    x, w = TensorType((2, 3, 4)), TensorType((4, 6))
    assert infer_types("linear", [x, w, TensorType((6,))], {}) == [TensorType((2, 3, 6))]
    with pytest.raises(OpSignatureError, match="bias must have shape \\[6\\]"):
        infer_types("linear", [x, w, TensorType((4,))], {})
    with pytest.raises(OpSignatureError, match="last dim 5 does not match w's first dim 4"):
        infer_types("linear", [TensorType((2, 5)), w], {})
    with pytest.raises(OpSignatureError, match="w\\[in, out\\]"):
        infer_types("linear", [x, TensorType((4,))], {})
    with pytest.raises(OpSignatureError, match="takes 2 to 3 inputs, got 1"):
        infer_types("linear", [x], {})


def test_matmul_flops_batched() -> None:
    opdef = get_op("matmul")
    a, b = TensorType((8, 1, 3, 4)), TensorType((5, 4, 6))
    (out,) = infer_types("matmul", [a, b], {})
    assert opdef.flops([a, b], [out], {}) == 2 * 8 * 5 * 3 * 4 * 6
    a_t = TensorType((2, 4, 3))
    assert opdef.flops([a_t, a_t], [], {"transpose_a": True}) == 2 * 2 * 3 * 4 * 3


def test_linear_flops_with_and_without_bias() -> None:
    opdef = get_op("linear")
    x, w, b = TensorType((2, 3, 4)), TensorType((4, 6)), TensorType((6,))
    (out,) = infer_types("linear", [x, w, b], {})
    assert opdef.flops([x, w, b], [out], {}) == 2 * 6 * 4 * 6 + 6 * 6
    assert opdef.flops([x, w], [out], {}) == 2 * 6 * 4 * 6
    assert opdef.bytes([x, w, b], [out], {}) == 4 * (24 + 24 + 6 + 36)
