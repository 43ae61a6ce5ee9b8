"""rope ops: numpy implementations against plain-Python loops, shape inference, FLOPs."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from shardlab.errors import OpSignatureError
from shardlab.ir import TensorType
from shardlab.ops import get_op, infer_types

TOL = {"rtol": 1e-12, "atol": 1e-12}
rng = np.random.default_rng(6)


def run(kind: str, *xs: np.ndarray, **attrs: Any) -> list[np.ndarray]:
    """The numpy impl's outputs, after checking they have the inferred shapes."""
    types = [TensorType(x.shape, "float32" if x.dtype.kind == "f" else x.dtype.name) for x in xs]
    want = infer_types(kind, types, attrs)
    impl = get_op(kind).numpy_impl
    assert impl is not None
    outs = impl(xs, attrs)
    assert [o.shape for o in outs] == [t.shape for t in want]
    return outs


def cache_loop(seq: int, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    cos, sin = np.empty((seq, head_dim // 2)), np.empty((seq, head_dim // 2))
    for s in range(seq):
        for i in range(head_dim // 2):
            angle = s * theta ** (-2 * i / head_dim)
            cos[s, i], sin[s, i] = math.cos(angle), math.sin(angle)
    return cos, sin


@pytest.mark.parametrize(("seq", "head_dim", "theta"), [(1, 2, None), (7, 8, None), (5, 6, 500.0)])
def test_rope_cache_matches_loop(seq: int, head_dim: int, theta: float | None) -> None:
    attrs: dict[str, Any] = {"seq": seq, "head_dim": head_dim}
    if theta is not None:
        attrs["theta"] = theta
    cos, sin = run("rope_cache", **attrs)
    want_cos, want_sin = cache_loop(seq, head_dim, theta or 10000.0)
    np.testing.assert_allclose(cos, want_cos, **TOL)
    np.testing.assert_allclose(sin, want_sin, **TOL)


def rotary_loop(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate-half rotary embedding, one element at a time."""
    b_, s_, n_, d = x.shape
    half = d // 2
    out = np.empty_like(x)
    for b in range(b_):
        for s in range(s_):
            for n in range(n_):
                for i in range(half):
                    x1, x2, c, si = x[b, s, n, i], x[b, s, n, i + half], cos[s, i], sin[s, i]
                    out[b, s, n, i] = x1 * c - x2 * si
                    out[b, s, n, i + half] = x2 * c + x1 * si
    return out


@pytest.mark.parametrize("shape", [(1, 1, 1, 2), (2, 5, 3, 8), (3, 4, 1, 6)])
def test_rotary_matches_loop(shape: tuple[int, int, int, int]) -> None:
    x = rng.standard_normal(shape)
    cos, sin = run("rope_cache", seq=shape[1], head_dim=shape[3])
    (out,) = run("rotary_embedding", x, cos, sin)
    np.testing.assert_allclose(out, rotary_loop(x, cos, sin), **TOL)
    # arbitrary tables, not only rotations
    cos, sin = rng.standard_normal(cos.shape), rng.standard_normal(sin.shape)
    (out,) = run("rotary_embedding", x, cos, sin)
    np.testing.assert_allclose(out, rotary_loop(x, cos, sin), **TOL)


def test_infer_types() -> None:
    cos = TensorType((16, 4), "bfloat16")
    assert infer_types("rope_cache", [], {"seq": 16, "head_dim": 8, "dtype": "bfloat16"}) == [
        cos,
        cos,
    ]
    assert infer_types("rope_cache", [], {"seq": 3, "head_dim": 2}) == [TensorType((3, 1))] * 2
    x = TensorType((2, 16, 4, 8), "bfloat16")
    assert infer_types("rotary_embedding", [x, cos, cos], {}) == [x]


@pytest.mark.parametrize(
    ("attrs", "match"),
    [
        ({"head_dim": 8}, "'seq' is required"),
        ({"seq": 0, "head_dim": 8}, "rope_cache: attribute 'seq' must be > 0"),
        ({"seq": 4, "head_dim": 7}, "'head_dim' must be a positive even integer, got 7"),
        ({"seq": 4, "head_dim": -2}, "'head_dim' must be a positive even integer"),
        ({"seq": 4, "head_dim": 8, "theta": 0}, "'theta' must be > 0"),
        ({"seq": 4, "head_dim": 8, "dtype": "int64"}, "'dtype' must be one of"),
    ],
)
def test_rope_cache_errors(attrs: dict[str, Any], match: str) -> None:
    with pytest.raises(OpSignatureError, match=match):
        infer_types("rope_cache", [], attrs)


def test_rope_cache_takes_no_inputs() -> None:
    with pytest.raises(OpSignatureError, match="rope_cache takes 0 inputs, got 1"):
        infer_types("rope_cache", [TensorType((1,))], {"seq": 1, "head_dim": 2})


@pytest.mark.parametrize(
    ("x", "cos", "sin", "match"),
    [
        ((2, 16, 4), (16, 4), (16, 4), r"x must be \[B, S, N, D\] with an even D"),
        ((2, 16, 4, 7), (16, 3), (16, 3), "even D"),
        ((2, 16, 4, 8), (8, 4), (16, 4), r"cos must have shape \[16, 4\]"),
        ((2, 16, 4, 8), (16, 4), (16, 8), r"sin must have shape \[16, 4\]"),
    ],
)
def test_rotary_errors(
    x: tuple[int, ...], cos: tuple[int, ...], sin: tuple[int, ...], match: str
) -> None:
    types = [TensorType(x), TensorType(cos), TensorType(sin)]
    with pytest.raises(OpSignatureError, match=match):
        infer_types("rotary_embedding", types, {})


def test_rotary_dtype_errors() -> None:
    cos = TensorType((16, 4))
    with pytest.raises(OpSignatureError, match="needs a floating-point x"):
        infer_types("rotary_embedding", [TensorType((1, 16, 1, 8), "int32"), cos, cos], {})
    with pytest.raises(OpSignatureError, match="one dtype"):
        infer_types("rotary_embedding", [TensorType((1, 16, 1, 8), "float16"), cos, cos], {})


def test_flops() -> None:
    x, cos = TensorType((2, 16, 4, 8)), TensorType((16, 4))
    assert get_op("rotary_embedding").flops([x, cos, cos], [x], {}) == 3 * 2 * 16 * 4 * 8
    assert get_op("rope_cache").flops([], [cos, cos], {}) == 2 * 64
