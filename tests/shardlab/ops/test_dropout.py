"""dropout and dropout_grad: the counter-based mask against a plain-Python SplitMix64, blocks
of the mask from global offsets, the VJP formula against torch autograd, inference, FLOPs."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
import torch

from shardlab.errors import OpSignatureError
from shardlab.ir import DTYPE_BYTES, TensorType
from shardlab.models import GraphBuilder
from shardlab.ops import get_op, infer_types, op_cost
from shardlab.ops.dropout import block_index, keep_mask

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
RNG = np.random.default_rng(11)


def splitmix64(z: int) -> int:
    """The SplitMix64 output function (Steele et al. 2014), on Python integers."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def kept(seed: int, index: int, p: float) -> bool:
    """The documented rule, element by element: keep when the top 32 bits reach p * 2^32."""
    return splitmix64((index + (seed + 1) * GOLDEN) & MASK64) >> 32 >= round(p * 2**32)


def run(kind: str, *xs: np.ndarray, **attrs: Any) -> list[np.ndarray]:
    types = [TensorType(x.shape, "bool" if x.dtype == bool else "float32") for x in xs]
    want = infer_types(kind, types, attrs)
    impl = get_op(kind).numpy_impl
    assert impl is not None
    outs = impl(list(xs), attrs)
    assert [o.shape for o in outs] == [t.shape for t in want]
    return outs


def test_splitmix64_matches_its_published_first_outputs() -> None:
    """Seed 0: the generator's first three outputs are mix(k * golden), k = 1, 2, 3."""
    assert [splitmix64(k * GOLDEN & MASK64) for k in (1, 2, 3)] == [
        0xE220A8397B1DCDAF,
        0x6E789E6AA1B965F4,
        0x06C45D188009454F,
    ]


@pytest.mark.parametrize(("seed", "p"), [(0, 0.1), (123456789, 0.5), (2**32 - 1, 0.9)])
def test_mask_is_the_documented_hash_of_seed_and_index(seed: int, p: float) -> None:
    x = RNG.standard_normal((3, 5, 7))
    y, mask = run("dropout", x, p=p, seed=seed)
    want = np.array([kept(seed, i, p) for i in range(x.size)]).reshape(x.shape)
    assert mask.dtype == bool
    np.testing.assert_array_equal(mask, want)
    np.testing.assert_array_equal(y, x * want / (1 - p))


def test_mask_keeps_about_one_minus_p_and_seeds_differ() -> None:
    x = np.ones((64, 256))
    _, a = run("dropout", x, p=0.1, seed=1)
    _, b = run("dropout", x, p=0.1, seed=2)
    assert abs(a.mean() - 0.9) < 0.01 and abs(b.mean() - 0.9) < 0.01
    assert (a != b).mean() > 0.1  # independent masks disagree on ~18% of the elements
    _, again = run("dropout", x, p=0.1, seed=1)
    np.testing.assert_array_equal(a, again)
    _, none = run("dropout", x, p=0.0, seed=1)
    assert none.all()


def test_a_block_computes_exactly_its_part_of_the_mask() -> None:
    shape = (4, 6, 5)
    whole = keep_mask(block_index(shape, [(0, n) for n in shape]), 7, 0.3)
    for cut in itertools.product([(0, 2), (2, 4)], [(0, 3), (3, 6), (1, 5)], [(0, 5), (2, 3)]):
        block = keep_mask(block_index(shape, cut), 7, 0.3)
        np.testing.assert_array_equal(block, whole[tuple(slice(a, b) for a, b in cut)])
    index = block_index(shape, [(1, 3), (2, 4), (0, 5)])
    np.testing.assert_array_equal(index, np.arange(120).reshape(shape)[1:3, 2:4, :])
    assert block_index((), ()).shape == ()


def test_dropout_grad_is_torch_autograd_of_the_masked_scale() -> None:
    x, dy = RNG.standard_normal((2, 3, 4)), RNG.standard_normal((2, 3, 4))
    p = 0.25
    _, mask = run("dropout", x, p=p, seed=5)
    (dx,) = run("dropout_grad", dy, mask, p=p)
    t = torch.tensor(x, requires_grad=True)
    (t * torch.tensor(mask) / (1 - p)).backward(torch.tensor(dy))
    np.testing.assert_allclose(dx, t.grad.numpy(), rtol=1e-12)  # type: ignore[union-attr]


def test_inference_and_errors_name_the_attribute() -> None:
    x = TensorType((2, 3), "bfloat16")
    y, mask = infer_types("dropout", [x], {"p": 0.1, "seed": 3})
    assert y == x and mask == TensorType((2, 3), "bool") and DTYPE_BYTES["bool"] == 1
    for attrs, message in [
        ({"p": 1.0, "seed": 1}, r"'p' must be in \[0, 1\), got 1.0"),
        ({"p": -0.1, "seed": 1}, r"'p' must be in \[0, 1\)"),
        ({"seed": 1}, r"attribute 'p' is required"),
        ({"p": 0.1}, r"attribute 'seed' is required"),
        ({"p": 0.1, "seed": 1.5}, r"'seed' must be an integer"),
    ]:
        with pytest.raises(OpSignatureError, match=message):
            infer_types("dropout", [x], attrs)
    with pytest.raises(OpSignatureError, match="floating-point"):
        infer_types("dropout", [TensorType((2,), "int64")], {"p": 0.1, "seed": 1})
    with pytest.raises(OpSignatureError, match="mask must be bool of dy's shape"):
        infer_types("dropout_grad", [x, TensorType((2, 3), "float32")], {"p": 0.1})


def test_flops_and_bytes_count_the_one_byte_mask() -> None:
    b = GraphBuilder("d")
    x = b.input("x", (4, 8), "bfloat16")
    y, mask = b.ops("dropout", [x], "drop", {"p": 0.1, "seed": 0}, output_names=["out", "mask"])
    g = b.build([y, mask])
    cost = op_cost(g, g.op("drop"))
    assert cost.flops == 2 * 32
    assert cost.bytes == 32 * 2 + 32 * 2 + 32 * 1  # x in, y out (16-bit), mask out (1 byte)
