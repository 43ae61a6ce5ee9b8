"""loss ops: numpy implementations against torch, stability, shape inference, FLOPs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from shardlab.errors import ExecutionError, OpSignatureError
from shardlab.ir import TensorType
from shardlab.ops import get_op, infer_types

TOL = {"rtol": 1e-12, "atol": 1e-12}
rng = np.random.default_rng(8)


def run(kind: str, *xs: np.ndarray, **attrs: Any) -> list[np.ndarray]:
    """The numpy impl's outputs, after checking they have the inferred shapes."""
    types = [TensorType(x.shape, "float32" if x.dtype.kind == "f" else x.dtype.name) for x in xs]
    want = infer_types(kind, types, attrs)
    impl = get_op(kind).numpy_impl
    assert impl is not None
    outs = impl(xs, attrs)
    assert [o.shape for o in outs] == [t.shape for t in want]
    return outs


@pytest.mark.parametrize("shape", [(7,), (5, 7), (2, 3, 7)])
@pytest.mark.parametrize("reduction", [None, "mean", "sum"])
@pytest.mark.parametrize("labels_dtype", [np.int64, np.int32])
def test_cross_entropy_matches_torch(
    shape: tuple[int, ...], reduction: str | None, labels_dtype: type
) -> None:
    logits = rng.standard_normal(shape) * 3
    labels = rng.integers(0, shape[-1], shape[:-1]).astype(labels_dtype)
    attrs = {} if reduction is None else {"reduction": reduction}
    (out,) = run("cross_entropy", logits, labels, **attrs)
    flat = torch.tensor(logits).reshape(-1, shape[-1])
    want = F.cross_entropy(
        flat, torch.tensor(labels).long().reshape(-1), reduction=reduction or "mean"
    )
    np.testing.assert_allclose(out, want.numpy(), **TOL)


def test_cross_entropy_is_stable() -> None:
    logits = np.array([[1000.0, -1000.0, 0.0], [-5000.0, -5001.0, -5002.0]])
    labels = np.array([1, 0])
    (out,) = run("cross_entropy", logits, labels, reduction="sum")
    want = F.cross_entropy(torch.tensor(logits), torch.tensor(labels), reduction="sum")
    np.testing.assert_allclose(out, want.numpy(), **TOL)


def test_cross_entropy_rejects_labels_out_of_range() -> None:
    with pytest.raises(ExecutionError, match=r"outside the classes \[0, 3\)"):
        run("cross_entropy", rng.standard_normal((2, 3)), np.array([0, 3]))


@pytest.mark.parametrize("shape", [(6,), (3, 4), (2, 3, 4)])
@pytest.mark.parametrize("reduction", [None, "mean", "sum"])
def test_mse_loss_matches_torch(shape: tuple[int, ...], reduction: str | None) -> None:
    pred, target = rng.standard_normal(shape), rng.standard_normal(shape)
    attrs = {} if reduction is None else {"reduction": reduction}
    (out,) = run("mse_loss", pred, target, **attrs)
    want = F.mse_loss(torch.tensor(pred), torch.tensor(target), reduction=reduction or "mean")
    np.testing.assert_allclose(out, want.numpy(), **TOL)


def test_infer_types() -> None:
    logits, labels = TensorType((2, 5, 11), "bfloat16"), TensorType((2, 5), "int32")
    assert infer_types("cross_entropy", [logits, labels], {}) == [TensorType((), "bfloat16")]
    x = TensorType((3, 4), "float16")
    assert infer_types("mse_loss", [x, x], {"reduction": "sum"}) == [TensorType((), "float16")]


@pytest.mark.parametrize(
    ("kind", "ins", "attrs", "match"),
    [
        ("cross_entropy", [((2, 5), "int64"), ((2,), "int64")], {}, "floating-point logits"),
        ("cross_entropy", [((), "float32"), ((), "int64")], {}, "logits must have rank >= 1"),
        ("cross_entropy", [((2, 5), "float32"), ((2,), "float32")], {}, "labels must be int64"),
        ("cross_entropy", [((2, 5), "float32"), ((5,), "int64")], {}, r"leading shape \[2\]"),
        ("cross_entropy", [((2, 5), "float32"), ((2,), "int64")], {"reduction": "none"}, "'red"),
        ("mse_loss", [((2, 5), "float32"), ((5,), "float32")], {}, "target must have pred's"),
        ("mse_loss", [((2,), "float32"), ((2,), "float16")], {}, "mse_loss needs inputs of one"),
        ("mse_loss", [((2,), "int64"), ((2,), "int64")], {}, "floating-point pred"),
        ("mse_loss", [((2,), "float32"), ((2,), "float32")], {"reduction": None}, "'reduction'"),
    ],
)
def test_infer_errors(
    kind: str, ins: list[tuple[tuple[int, ...], str]], attrs: dict[str, Any], match: str
) -> None:
    with pytest.raises(OpSignatureError, match=match):
        infer_types(kind, [TensorType(s, d) for s, d in ins], attrs)


def test_index_bounds_and_flops() -> None:
    opdef = get_op("cross_entropy")
    logits, labels = TensorType((4, 10)), TensorType((4,), "int64")
    assert opdef.index_bounds is not None
    assert opdef.index_bounds([logits, labels], {}) == {1: 10}
    assert opdef.flops([logits, labels], [TensorType(())], {}) == 5 * 40
    x = TensorType((4, 10))
    assert get_op("mse_loss").flops([x, x], [TensorType(())], {}) == 3 * 40
