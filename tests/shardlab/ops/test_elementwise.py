"""elementwise ops: numpy implementations against torch, shape inference, FLOPs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from shardlab.errors import ExecutionError, OpSignatureError
from shardlab.ir import TensorType
from shardlab.ops import get_op, infer_types

TOL = {"rtol": 1e-12, "atol": 1e-12}
rng = np.random.default_rng(1)


def run(kind: str, *xs: np.ndarray, **attrs: Any) -> list[np.ndarray]:
    """The numpy impl's outputs, after checking they have the inferred shapes."""
    types = [TensorType(x.shape, "float32" if x.dtype.kind == "f" else x.dtype.name) for x in xs]
    want = infer_types(kind, types, attrs)
    impl = get_op(kind).numpy_impl
    assert impl is not None
    outs = impl(xs, attrs)
    assert [o.shape for o in outs] == [t.shape for t in want]
    return outs


BINARY: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.div,
}


@pytest.mark.parametrize("kind", sorted(BINARY))
@pytest.mark.parametrize(
    ("a_shape", "b_shape"), [((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((3, 1), (1, 5)), ((), (2, 2))]
)
def test_binary_matches_torch(
    kind: str, a_shape: tuple[int, ...], b_shape: tuple[int, ...]
) -> None:
    a, b = rng.standard_normal(a_shape), rng.standard_normal(b_shape) + 3.0
    (out,) = run(kind, a, b)
    want = BINARY[kind](torch.tensor(a), torch.tensor(b))
    np.testing.assert_allclose(out, want.numpy(), **TOL)


UNARY: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "neg": torch.neg,
    "relu": F.relu,
    "silu": F.silu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "exp": torch.exp,
    "log": torch.log,
    "square": torch.square,
    "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt,
}
POSITIVE_ONLY = {"log", "sqrt", "rsqrt"}


@pytest.mark.parametrize("kind", sorted(UNARY))
@pytest.mark.parametrize("shape", [(7,), (2, 3, 5), ()])
def test_unary_matches_torch(kind: str, shape: tuple[int, ...]) -> None:
    x = rng.standard_normal(shape) * 3
    if kind in POSITIVE_ONLY:
        x = np.abs(x) + 0.1
    (out,) = run(kind, x)
    np.testing.assert_allclose(out, UNARY[kind](torch.tensor(x)).numpy(), **TOL)


def test_gelu_tanh_matches_torch() -> None:
    x = rng.standard_normal((4, 9)) * 3
    (out,) = run("gelu", x, approximate="tanh")
    want = F.gelu(torch.tensor(x), approximate="tanh")
    np.testing.assert_allclose(out, want.numpy(), **TOL)


def test_gelu_exact_matches_torch() -> None:
    x = rng.standard_normal((4, 9)) * 3
    for attrs in ({}, {"approximate": "none"}):
        (out,) = run("gelu", x, **attrs)
        np.testing.assert_allclose(out, F.gelu(torch.tensor(x)).numpy(), **TOL)


def test_scale_matches_torch() -> None:
    x = rng.standard_normal((3, 4))
    (out,) = run("scale", x, factor=-0.125)
    np.testing.assert_allclose(out, torch.mul(torch.tensor(x), -0.125).numpy(), **TOL)


def test_cast_matches_torch() -> None:
    x = rng.standard_normal((3, 4)) * 10
    (as_int,) = run("cast", x, dtype="int64")
    assert as_int.dtype == np.int64
    np.testing.assert_array_equal(as_int, torch.tensor(x).to(torch.int64).numpy())
    (as_bool,) = run("cast", x, dtype="bool")
    np.testing.assert_array_equal(as_bool, torch.tensor(x).to(torch.bool).numpy())
    # float -> float keeps the runtime's compute dtype (float64 here).
    (as_half,) = run("cast", x, dtype="float16")
    assert as_half.dtype == np.float64
    np.testing.assert_array_equal(as_half, x)
    ids = np.arange(6, dtype=np.int64).reshape(2, 3)
    (as_float,) = run("cast", ids, dtype="float32")
    np.testing.assert_array_equal(as_float, torch.tensor(ids).to(torch.float64).numpy())


def test_cast_rejects_non_finite_to_int() -> None:
    with pytest.raises(ExecutionError, match="non-finite"):
        run("cast", np.array([1.0, np.inf]), dtype="int32")


def test_infer_types() -> None:
    a, b = TensorType((2, 1, 4), "float16"), TensorType((3, 1), "float16")
    assert infer_types("mul", [a, b], {}) == [TensorType((2, 3, 4), "float16")]
    x = TensorType((5, 6), "bfloat16")
    assert infer_types("gelu", [x], {"approximate": "tanh"}) == [x]
    assert infer_types("neg", [TensorType((2,), "int32")], {}) == [TensorType((2,), "int32")]
    assert infer_types("cast", [x], {"dtype": "int32"}) == [TensorType((5, 6), "int32")]


@pytest.mark.parametrize(
    ("kind", "ins", "attrs", "match"),
    [
        ("add", [TensorType((2, 3)), TensorType((4,))], {}, r"add: shapes \[2, 3\] and \[4\]"),
        ("sub", [TensorType((2,)), TensorType((2,), "float16")], {}, "sub needs inputs of one"),
        ("exp", [TensorType((2,), "int64")], {}, "exp needs a floating-point input"),
        ("gelu", [TensorType((2,))], {"approximate": "fast"}, "'approximate' must be one of"),
        ("scale", [TensorType((2,))], {}, "'factor' is required"),
        ("scale", [TensorType((2,))], {"factor": True}, "'factor' must be a number"),
        ("cast", [TensorType((2,))], {"dtype": "float8"}, "'dtype' must be one of"),
    ],
)
def test_infer_errors(kind: str, ins: list[TensorType], attrs: dict[str, Any], match: str) -> None:
    with pytest.raises(OpSignatureError, match=match):
        infer_types(kind, ins, attrs)


def test_flops() -> None:
    x = TensorType((4, 5))
    assert get_op("add").flops([x, TensorType((5,))], [x], {}) == 20
    assert get_op("gelu").flops([x], [x], {}) == 8 * 20
    assert get_op("rsqrt").flops([x], [x], {}) == 2 * 20
    assert get_op("cast").flops([x], [x], {}) == 0


def test_arithmetic_rejects_bool_and_integer_division() -> None:
    flags, ints = TensorType((3,), "bool"), TensorType((3,), "int64")
    with pytest.raises(OpSignatureError, match=r"add needs numeric inputs, got bool\[3\]"):
        infer_types("add", [flags, flags], {})
    with pytest.raises(OpSignatureError, match=r"div needs floating-point inputs, got int64\[3\]"):
        infer_types("div", [ints, ints], {})
    assert infer_types("mul", [ints, ints], {}) == [ints]
