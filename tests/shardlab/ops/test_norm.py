"""norm ops: layer_norm against torch, rms_norm against a loop, shape inference, FLOPs."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from shardlab.errors import OpSignatureError
from shardlab.ir import TensorType
from shardlab.ops import get_op, infer_types

TOL = {"rtol": 1e-12, "atol": 1e-12}
rng = np.random.default_rng(4)


def run(kind: str, *xs: np.ndarray, **attrs: Any) -> list[np.ndarray]:
    """The numpy impl's outputs, after checking they have the inferred shapes."""
    types = [TensorType(x.shape, "float32" if x.dtype.kind == "f" else x.dtype.name) for x in xs]
    want = infer_types(kind, types, attrs)
    impl = get_op(kind).numpy_impl
    assert impl is not None
    outs = impl(xs, attrs)
    assert [o.shape for o in outs] == [t.shape for t in want]
    return outs


@pytest.mark.parametrize("shape", [(6,), (3, 8), (2, 3, 5)])
@pytest.mark.parametrize("eps", [None, 1e-3])
def test_layer_norm_matches_torch(shape: tuple[int, ...], eps: float | None) -> None:
    h = shape[-1]
    x, w, b = rng.standard_normal(shape) * 2 + 1, rng.standard_normal(h), rng.standard_normal(h)
    (out,) = run("layer_norm", x, w, b) if eps is None else run("layer_norm", x, w, b, eps=eps)
    tx = torch.tensor(x)
    want = F.layer_norm(tx, (h,), torch.tensor(w), torch.tensor(b), eps=eps or 1e-5)
    np.testing.assert_allclose(out, want.numpy(), **TOL)


def rms_norm_loop(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * weight, one row at a time in plain Python."""
    rows = x.reshape(-1, x.shape[-1])
    out = np.empty_like(rows)
    for r, row in enumerate(rows):
        ms = sum(float(v) * float(v) for v in row) / len(row)
        for i, v in enumerate(row):
            out[r, i] = float(v) / math.sqrt(ms + eps) * float(w[i])
    return out.reshape(x.shape)


@pytest.mark.parametrize("shape", [(6,), (3, 8), (2, 3, 5)])
@pytest.mark.parametrize("eps", [None, 1e-2])
def test_rms_norm_matches_loop(shape: tuple[int, ...], eps: float | None) -> None:
    x, w = rng.standard_normal(shape), rng.standard_normal(shape[-1])
    (out,) = run("rms_norm", x, w) if eps is None else run("rms_norm", x, w, eps=eps)
    np.testing.assert_allclose(out, rms_norm_loop(x, w, eps or 1e-6), **TOL)


def test_infer_types() -> None:
    x, h = TensorType((2, 3, 8), "bfloat16"), TensorType((8,), "bfloat16")
    assert infer_types("layer_norm", [x, h, h], {"eps": 1e-6}) == [x]
    assert infer_types("rms_norm", [x, h], {}) == [x]


@pytest.mark.parametrize(
    ("kind", "ins", "attrs", "match"),
    [
        ("layer_norm", [(2, 8), (7,), (8,)], {}, r"layer_norm: weight must have shape \[8\]"),
        ("layer_norm", [(2, 8), (8,), (2, 8)], {}, r"layer_norm: bias must have shape \[8\]"),
        ("rms_norm", [(2, 8), (8, 1)], {}, r"rms_norm: weight must have shape \[8\]"),
        ("rms_norm", [(2, 8), (8,)], {"eps": "small"}, "'eps' must be a number"),
        ("rms_norm", [(2, 8), (8,)], {"eps": -1.0}, "rms_norm: attribute 'eps' must be >= 0"),
        ("layer_norm", [(), (1,), (1,)], {}, "layer_norm: x must have rank >= 1"),
    ],
)
def test_infer_errors(
    kind: str, ins: list[tuple[int, ...]], attrs: dict[str, Any], match: str
) -> None:
    with pytest.raises(OpSignatureError, match=match):
        infer_types(kind, [TensorType(s) for s in ins], attrs)


def test_infer_dtype_errors() -> None:
    x, h = TensorType((2, 8), "int64"), TensorType((8,), "int64")
    with pytest.raises(OpSignatureError, match="rms_norm needs a floating-point x"):
        infer_types("rms_norm", [x, h], {})
    with pytest.raises(OpSignatureError, match="layer_norm needs inputs of one dtype"):
        infer_types("layer_norm", [TensorType((2, 8)), TensorType((8,), "float16"), h], {})


def test_flops() -> None:
    x, h = TensorType((4, 8)), TensorType((8,))
    assert get_op("layer_norm").flops([x, h, h], [x], {}) == 8 * 32
    assert get_op("rms_norm").flops([x, h], [x], {}) == 4 * 32
