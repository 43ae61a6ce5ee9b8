"""softmax ops: numpy implementations against torch, stability, shape inference, FLOPs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from shardlab.errors import OpSignatureError
from shardlab.ir import TensorType
from shardlab.ops import get_op, infer_types

TOL = {"rtol": 1e-12, "atol": 1e-12}
rng = np.random.default_rng(3)


def run(kind: str, *xs: np.ndarray, **attrs: Any) -> list[np.ndarray]:
    """The numpy impl's outputs, after checking they have the inferred shapes."""
    types = [TensorType(x.shape, "float32" if x.dtype.kind == "f" else x.dtype.name) for x in xs]
    want = infer_types(kind, types, attrs)
    impl = get_op(kind).numpy_impl
    assert impl is not None
    outs = impl(xs, attrs)
    assert [o.shape for o in outs] == [t.shape for t in want]
    return outs


TORCH = {"softmax": F.softmax, "log_softmax": F.log_softmax}


@pytest.mark.parametrize("kind", sorted(TORCH))
@pytest.mark.parametrize(
    ("shape", "dim"), [((7,), None), ((3, 5), 0), ((3, 5), -1), ((2, 3, 4), 1), ((2, 3, 4), -2)]
)
def test_matches_torch(kind: str, shape: tuple[int, ...], dim: int | None) -> None:
    x = rng.standard_normal(shape) * 4
    (out,) = run(kind, x) if dim is None else run(kind, x, dim=dim)
    want = TORCH[kind](torch.tensor(x), dim=-1 if dim is None else dim)
    np.testing.assert_allclose(out, want.numpy(), **TOL)


@pytest.mark.parametrize("kind", sorted(TORCH))
def test_large_inputs_do_not_overflow(kind: str) -> None:
    x = np.array([[1000.0, 999.0, -1000.0], [-800.0, -801.0, -802.0]])
    (out,) = run(kind, x)
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, TORCH[kind](torch.tensor(x), dim=-1).numpy(), **TOL)


def test_infer_and_errors() -> None:
    x = TensorType((2, 3), "float16")
    assert infer_types("softmax", [x], {"dim": 0}) == [x]
    with pytest.raises(OpSignatureError, match="softmax: attribute 'dim' 2 is out of range"):
        infer_types("softmax", [x], {"dim": 2})
    with pytest.raises(OpSignatureError, match="log_softmax needs a floating-point input"):
        infer_types("log_softmax", [TensorType((2,), "int32")], {})
    with pytest.raises(OpSignatureError, match="'dim' must be an integer"):
        infer_types("softmax", [x], {"dim": None})


def test_flops() -> None:
    x = TensorType((4, 8))
    assert get_op("softmax").flops([x], [x], {}) == 5 * 32
    assert get_op("log_softmax").flops([x], [x], {}) == 5 * 32
