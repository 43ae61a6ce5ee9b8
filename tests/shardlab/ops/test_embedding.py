"""embedding: numpy implementation against torch, shape inference, index bounds, cost."""

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
rng = np.random.default_rng(5)


def run(kind: str, *xs: np.ndarray, **attrs: Any) -> list[np.ndarray]:
    """The numpy impl's outputs, after checking they have the inferred shapes."""
    types = [TensorType(x.shape, "float32" if x.dtype.kind == "f" else x.dtype.name) for x in xs]
    want = infer_types(kind, types, attrs)
    impl = get_op(kind).numpy_impl
    assert impl is not None
    outs = impl(xs, attrs)
    assert [o.shape for o in outs] == [t.shape for t in want]
    return outs


@pytest.mark.parametrize("ids_shape", [(), (5,), (2, 3), (2, 2, 3)])
@pytest.mark.parametrize("ids_dtype", [np.int64, np.int32])
def test_matches_torch(ids_shape: tuple[int, ...], ids_dtype: type) -> None:
    table = rng.standard_normal((11, 4))
    ids = rng.integers(0, 11, ids_shape).astype(ids_dtype)
    (out,) = run("embedding", ids, table)
    want = F.embedding(torch.tensor(ids).long(), torch.tensor(table))
    np.testing.assert_allclose(out, want.numpy(), **TOL)


def test_out_of_range_ids_fail_at_run_time() -> None:
    with pytest.raises(ExecutionError, match=r"outside the table's rows \[0, 3\)"):
        run("embedding", np.array([0, 3]), rng.standard_normal((3, 2)))
    with pytest.raises(ExecutionError, match="embedding: ids hold values in"):
        run("embedding", np.array([-1]), rng.standard_normal((3, 2)))


def test_infer_types() -> None:
    ids, table = TensorType((2, 7), "int32"), TensorType((100, 16), "bfloat16")
    assert infer_types("embedding", [ids, table], {}) == [TensorType((2, 7, 16), "bfloat16")]


@pytest.mark.parametrize(
    ("ids", "table", "match"),
    [
        (TensorType((2,), "float32"), TensorType((5, 3)), "embedding: ids must be int64 or int32"),
        (TensorType((2,), "int64"), TensorType((5, 3), "int64"), "floating-point table"),
        (TensorType((2,), "int64"), TensorType((5, 3, 2)), "embedding: table must have rank 2"),
    ],
)
def test_infer_errors(ids: TensorType, table: TensorType, match: str) -> None:
    with pytest.raises(OpSignatureError, match=match):
        infer_types("embedding", [ids, table], {})


def test_index_bounds_and_cost() -> None:
    opdef = get_op("embedding")
    ids, table = TensorType((2, 7), "int64"), TensorType((100, 16))
    (out,) = infer_types("embedding", [ids, table], {})
    assert opdef.index_bounds is not None
    assert opdef.index_bounds([ids, table], {}) == {0: 100}
    assert opdef.flops([ids, table], [out], {}) == 0
    assert opdef.bytes([ids, table], [out], {}) == 14 * 8 + 2 * (14 * 16 * 4)
