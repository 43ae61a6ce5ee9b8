"""scaled_dot_product_attention: numpy implementation against torch, inference, FLOPs."""

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
rng = np.random.default_rng(7)
KIND = "scaled_dot_product_attention"


def run(kind: str, *xs: np.ndarray, **attrs: Any) -> list[np.ndarray]:
    """The numpy impl's outputs, after checking they have the inferred shapes."""
    types = [TensorType(x.shape, "float32" if x.dtype.kind == "f" else x.dtype.name) for x in xs]
    want = infer_types(kind, types, attrs)
    impl = get_op(kind).numpy_impl
    assert impl is not None
    outs = impl(xs, attrs)
    assert [o.shape for o in outs] == [t.shape for t in want]
    return outs


def heads_first(x: np.ndarray) -> torch.Tensor:
    """[B, S, H, D] -> torch [B, H, S, D], the layout torch's sdpa expects."""
    return torch.tensor(x).transpose(1, 2)


# (B, Sq, Skv, Hq, Hkv, D, Dv, causal, scale)
CASES = [
    (1, 4, 4, 1, 1, 8, 8, True, None),
    (2, 5, 5, 4, 4, 6, 6, False, None),
    (2, 3, 7, 4, 2, 8, 5, False, None),
    (2, 6, 6, 6, 2, 4, 4, True, None),
    (1, 5, 5, 8, 1, 4, 3, True, 0.3),
    (3, 2, 9, 2, 1, 5, 5, False, 1.7),
]


@pytest.mark.parametrize(("b", "sq", "skv", "hq", "hkv", "d", "dv", "causal", "scale"), CASES)
def test_matches_torch(
    b: int, sq: int, skv: int, hq: int, hkv: int, d: int, dv: int, causal: bool, scale: float | None
) -> None:
    q = rng.standard_normal((b, sq, hq, d))
    k = rng.standard_normal((b, skv, hkv, d))
    v = rng.standard_normal((b, skv, hkv, dv))
    attrs: dict[str, Any] = {"causal": causal}
    if scale is not None:
        attrs["scale"] = scale
    (out,) = run(KIND, q, k, v, **attrs)
    want = F.scaled_dot_product_attention(
        heads_first(q),
        heads_first(k),
        heads_first(v),
        is_causal=causal,
        scale=scale,
        enable_gqa=hq != hkv,
    ).transpose(1, 2)
    np.testing.assert_allclose(out, want.numpy(), **TOL)


def test_gqa_is_repeat_interleave_of_kv_heads() -> None:
    q, k, v = (rng.standard_normal(s) for s in [(2, 5, 6, 4), (2, 5, 3, 4), (2, 5, 3, 4)])
    (out,) = run(KIND, q, k, v)  # causal by default
    k_rep = heads_first(k).repeat_interleave(2, dim=1)
    v_rep = heads_first(v).repeat_interleave(2, dim=1)
    want = F.scaled_dot_product_attention(heads_first(q), k_rep, v_rep, is_causal=True)
    np.testing.assert_allclose(out, want.transpose(1, 2).numpy(), **TOL)


def test_large_scores_stay_finite() -> None:
    q, k, v = (rng.standard_normal((1, 4, 2, 4)) * 100 for _ in range(3))
    (out,) = run(KIND, q, k, v, causal=False)
    assert np.all(np.isfinite(out))


def test_infer_types() -> None:
    q, k, v = TensorType((2, 7, 8, 16)), TensorType((2, 9, 2, 16)), TensorType((2, 9, 2, 32))
    assert infer_types(KIND, [q, k, v], {"causal": False, "scale": None}) == [
        TensorType((2, 7, 8, 32))
    ]


def qkv(q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...]) -> list[TensorType]:
    return [TensorType(q), TensorType(k), TensorType(v)]


@pytest.mark.parametrize(
    ("ins", "attrs", "match"),
    [
        (qkv((2, 4, 8), (2, 4, 2, 8), (2, 4, 2, 8)), {}, r"q must be \[batch, seq, heads, dim\]"),
        (qkv((2, 4, 2, 8), (2, 4, 8), (2, 4, 8)), {}, "k must be"),
        (qkv((2, 4, 2, 8), (3, 4, 2, 8), (2, 4, 2, 8)), {}, "batch dims disagree"),
        (qkv((2, 4, 2, 8), (2, 4, 2, 6), (2, 4, 2, 8)), {}, "k's head dim 6 differs from q's 8"),
        (qkv((2, 4, 2, 8), (2, 4, 2, 8), (2, 5, 2, 8)), {}, "v must have k's seq and heads"),
        (qkv((2, 4, 6, 8), (2, 4, 4, 8), (2, 4, 4, 8)), {}, r"q's heads \(6\) must be a multiple"),
        (qkv((2, 4, 2, 8), (2, 5, 2, 8), (2, 5, 2, 8)), {}, "'causal' needs q's seq"),
        (qkv((2, 4, 2, 8), (2, 4, 2, 8), (2, 4, 2, 8)), {"causal": 0}, "'causal' must be true"),
        (qkv((2, 4, 2, 8), (2, 4, 2, 8), (2, 4, 2, 8)), {"scale": "x"}, "'scale' must be a num"),
    ],
)
def test_infer_errors(ins: list[TensorType], attrs: dict[str, Any], match: str) -> None:
    with pytest.raises(OpSignatureError, match=match):
        infer_types(KIND, ins, attrs)


def test_infer_dtype_errors() -> None:
    q, kv = TensorType((1, 2, 1, 4), "int64"), TensorType((1, 2, 1, 4), "int64")
    with pytest.raises(OpSignatureError, match="needs a floating-point q"):
        infer_types(KIND, [q, kv, kv], {})
    with pytest.raises(OpSignatureError, match="one dtype"):
        infer_types(KIND, [TensorType((1, 2, 1, 4)), kv, kv], {})


def test_flops_non_causal() -> None:
    q, k, v = TensorType((2, 7, 8, 16)), TensorType((2, 9, 2, 16)), TensorType((2, 9, 2, 32))
    (out,) = infer_types(KIND, [q, k, v], {"causal": False})
    # scores: 2*B*Hq*Sq*Skv*D, weighted sum: 2*B*Hq*Sq*Skv*Dv
    assert get_op(KIND).flops([q, k, v], [out], {"causal": False}) == 2 * 2 * 8 * 7 * 9 * (16 + 32)


def test_flops_causal_counts_kept_pairs() -> None:
    q, k, v = TensorType((2, 6, 4, 8)), TensorType((2, 6, 2, 8)), TensorType((2, 6, 2, 8))
    (out,) = infer_types(KIND, [q, k, v], {})
    pairs = 6 * 7 // 2  # 21 of the 36 query/key pairs survive the mask
    assert get_op(KIND).flops([q, k, v], [out], {}) == 2 * 2 * 4 * pairs * 16 == 5376
    assert get_op(KIND).flops([q, k, v], [out], {"causal": True}) == 5376


def test_flops_of_a_sequence_shard_of_the_queries_count_the_busiest_rank() -> None:
    """A rank holding 2 of 6 queries (the sequence sharded over 3 ranks) against all 6 keys:
    the last shard sees 4 earlier keys per query and a triangle of its own, 2 * 4 + 3 = 11
    pairs, where the first shard keeps 3 and the whole sequence 21."""
    q, k, v = TensorType((2, 2, 4, 8)), TensorType((2, 6, 2, 8)), TensorType((2, 6, 2, 8))
    out = TensorType((2, 2, 4, 8))
    assert get_op(KIND).flops([q, k, v], [out], {}) == 2 * 2 * 4 * 11 * 16
    assert 3 * get_op(KIND).flops([q, k, v], [out], {}) >= 5376  # no shard counts less work
