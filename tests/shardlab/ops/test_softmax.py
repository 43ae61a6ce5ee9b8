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


def _torch_masked(x: torch.Tensor, scale: float, causal: bool, offset: int = 0) -> torch.Tensor:
    z = x * scale
    if causal:
        q, k = x.shape[-2:]
        above = torch.ones(q, k, dtype=torch.bool).triu(1 + offset)
        z = z.masked_fill(above, float("-inf"))
    return torch.softmax(z, -1)


@pytest.mark.parametrize(("shape", "scale", "causal"), [((2, 3, 5, 5), 0.4, True),
                         ((2, 4, 6), 1.0, False), ((3, 7, 7), 2.5, True)])  # fmt: skip
def test_masked_softmax_and_its_grad_match_torch(
    shape: tuple[int, ...], scale: float, causal: bool
) -> None:
    x, dy = rng.standard_normal(shape) * 3, rng.standard_normal(shape)
    (y,) = run("masked_softmax", x, scale=scale, causal=causal)
    t = torch.tensor(x, requires_grad=True)
    want = _torch_masked(t, scale, causal)
    np.testing.assert_allclose(y, want.detach().numpy(), **TOL)
    want.backward(torch.tensor(dy))
    (dx,) = run("masked_softmax_grad", y, dy, scale=scale)  # from the output alone
    np.testing.assert_allclose(dx, t.grad.numpy(), **TOL)  # type: ignore[union-attr]
    if causal:
        assert np.all(y[..., 0, 1:] == 0) and np.all(dx[..., 0, 1:] == 0)


def test_masked_softmax_of_a_query_block_masks_from_its_offset() -> None:
    from shardlab.ops.softmax import masked_softmax

    x = rng.standard_normal((2, 8, 8))
    whole = masked_softmax(x, 0.5, True)
    np.testing.assert_allclose(masked_softmax(x[:, 4:], 0.5, True, query_offset=4), whole[:, 4:])


def test_masked_softmax_infer_errors_and_flops() -> None:
    x = TensorType((2, 4, 4))
    assert infer_types("masked_softmax", [x], {"scale": 0.5, "causal": True}) == [x]
    assert infer_types("masked_softmax_grad", [x, x], {"scale": 0.5}) == [x]
    with pytest.raises(OpSignatureError, match=r"'causal' needs .* as many queries as keys"):
        infer_types("masked_softmax", [TensorType((2, 4, 5))], {"causal": True})
    with pytest.raises(OpSignatureError, match="'scale' must be a number"):
        infer_types("masked_softmax", [x], {"scale": "big"})
    with pytest.raises(OpSignatureError, match="must have y's type"):
        infer_types("masked_softmax_grad", [x, TensorType((2, 4, 5))], {})
    assert get_op("masked_softmax").flops([x], [x], {}) == 6 * 32
    assert get_op("masked_softmax_grad").flops([x, x], [x], {}) == 5 * 32
