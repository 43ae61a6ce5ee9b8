"""The torch backend's local compute (`runtime.torch_ops`): every torch implementation equals
its kind's numpy implementation, in float64 and float32, attrs variants included."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from shardlab.errors import ExecutionError
from shardlab.ops import get_op
from shardlab.ops.base import Array

pytest.importorskip("torch")
from shardlab.runtime.torch_ops import TORCH_IMPLS, run_torch

Gen = np.random.Generator
#: (name, kind, attrs, inputs of (rng, float dtype))
Case = tuple[str, str, dict[str, Any], Callable[[Gen, type], list[Array]]]


def _f(*shape: int, low: float = -2.0, high: float = 2.0) -> Callable[[Gen, type], Array]:
    return lambda rng, dt: rng.uniform(low, high, shape).astype(dt)


def _ins(*makers: Callable[[Gen, type], Array]) -> Callable[[Gen, type], list[Array]]:
    return lambda rng, dt: [m(rng, dt) for m in makers]


def _ids(high: int, *shape: int, dtype: type = np.int64) -> Callable[[Gen, type], Array]:
    return lambda rng, dt: rng.integers(0, high, shape).astype(dtype)


def _same(*shape: int) -> Callable[[Gen, type], list[Array]]:
    """x, then y = x with one element per row repeated (ties for max_grad), dy."""

    def make(rng: Gen, dt: type) -> list[Array]:
        x = rng.uniform(-2, 2, shape).astype(dt)
        x[..., 1] = x.max(axis=-1)  # a tie at the maximum of every row
        return [x, x.max(axis=-1), rng.uniform(-1, 1, shape[:-1]).astype(dt)]

    return make


ATTN = {"q": _f(2, 6, 4, 8), "k": _f(2, 6, 2, 8), "v": _f(2, 6, 2, 8)}
CASES: list[Case] = [
    ("matmul", "matmul", {}, _ins(_f(3, 4), _f(4, 5))),
    ("matmul_batched", "matmul", {}, _ins(_f(2, 3, 4, 5), _f(3, 5, 6))),
    ("matmul_ta", "matmul", {"transpose_a": True}, _ins(_f(2, 4, 3), _f(2, 4, 5))),
    ("matmul_tb", "matmul", {"transpose_b": True}, _ins(_f(2, 3, 4), _f(5, 4))),
    ("matmul_tab", "matmul", {"transpose_a": True, "transpose_b": True}, _ins(_f(4, 3), _f(5, 4))),
    ("linear", "linear", {}, _ins(_f(2, 3, 8), _f(8, 5))),
    ("linear_bias", "linear", {}, _ins(_f(2, 3, 8), _f(8, 5), _f(5))),
    *[(k, k, {}, _ins(_f(3, 4), _f(1, 4, low=0.5))) for k in ("add", "sub", "mul", "div")],
    ("add_int", "add", {}, _ins(_ids(9, 3, 4), _ids(9, 4))),
    *[
        (k, k, {}, _ins(_f(3, 5)))
        for k in ("neg", "relu", "gelu", "silu", "sigmoid", "tanh", "exp", "square")
    ],
    ("gelu_tanh", "gelu", {"approximate": "tanh"}, _ins(_f(3, 5))),
    *[(k, k, {}, _ins(_f(3, 5, low=0.1))) for k in ("log", "sqrt", "rsqrt")],
    ("scale", "scale", {"factor": 0.37}, _ins(_f(3, 5))),
    ("cast_float", "cast", {"dtype": "bfloat16"}, _ins(_f(3, 5))),
    ("cast_int_to_float", "cast", {"dtype": "float32"}, _ins(_ids(9, 3, 5))),
    ("cast_int", "cast", {"dtype": "int32"}, _ins(_f(3, 5, low=-9, high=9))),
    ("cast_bool", "cast", {"dtype": "bool"}, _ins(_ids(2, 3, 5))),
    *[
        (k, k, {}, _ins(_f(3, 5), _f(3, 5)))
        for k in ("relu_grad", "gelu_grad", "silu_grad", "sigmoid_grad", "tanh_grad")
    ],
    ("gelu_grad_tanh", "gelu_grad", {"approximate": "tanh"}, _ins(_f(3, 5), _f(3, 5))),
    ("softmax", "softmax", {}, _ins(_f(2, 3, 7, low=-9, high=9))),
    ("softmax_dim0", "softmax", {"dim": 0}, _ins(_f(4, 3, 7))),
    ("log_softmax", "log_softmax", {"dim": 1}, _ins(_f(2, 3, 7))),
    ("masked_softmax", "masked_softmax", {"scale": 0.5}, _ins(_f(2, 6, 6))),
    (
        "masked_softmax_causal",
        "masked_softmax",
        {"scale": 0.3, "causal": True},
        _ins(_f(2, 2, 6, 6)),
    ),
    (
        "masked_softmax_grad",
        "masked_softmax_grad",
        {"scale": 0.3},
        _ins(_f(2, 6, 6, low=0, high=1), _f(2, 6, 6)),
    ),
    ("layer_norm", "layer_norm", {"eps": 1e-3}, _ins(_f(2, 3, 8), _f(8), _f(8))),
    ("rms_norm", "rms_norm", {}, _ins(_f(2, 3, 8), _f(8))),
    ("layer_norm_grad", "layer_norm_grad", {}, _ins(_f(2, 3, 8), _f(8), _f(2, 3, 8))),
    ("rms_norm_grad", "rms_norm_grad", {"eps": 1e-4}, _ins(_f(2, 3, 8), _f(8), _f(2, 3, 8))),
    ("sdpa_causal_gqa", "scaled_dot_product_attention", {}, _ins(*ATTN.values())),
    (
        "sdpa_full_scaled",
        "scaled_dot_product_attention",
        {"causal": False, "scale": 0.2},
        _ins(_f(2, 3, 4, 8), _f(2, 6, 4, 8), _f(2, 6, 4, 5)),
    ),
    ("attention_grad_causal_gqa", "attention_grad", {}, _ins(*ATTN.values(), _f(2, 6, 4, 8))),
    (
        "attention_grad_full",
        "attention_grad",
        {"causal": False, "scale": 0.3},
        _ins(_f(2, 3, 4, 8), _f(2, 6, 1, 8), _f(2, 6, 1, 5), _f(2, 3, 4, 5)),
    ),
    ("rotary_embedding", "rotary_embedding", {}, _ins(_f(2, 6, 3, 8), _f(6, 4), _f(6, 4))),
    ("embedding", "embedding", {}, _ins(_ids(10, 2, 5), _f(10, 6))),
    ("embedding_int32", "embedding", {}, _ins(_ids(10, 7, dtype=np.int32), _f(10, 6))),
    ("embedding_grad", "embedding_grad", {"vocab": 10}, _ins(_ids(10, 4, 5), _f(4, 5, 6))),
    ("cross_entropy", "cross_entropy", {}, _ins(_f(4, 5, 11, low=-9, high=9), _ids(11, 4, 5))),
    ("cross_entropy_sum", "cross_entropy", {"reduction": "sum"}, _ins(_f(6, 11), _ids(11, 6))),
    ("cross_entropy_lse", "cross_entropy", {"lse": True}, _ins(_f(6, 11), _ids(11, 6))),
    (
        "cross_entropy_grad",
        "cross_entropy_grad",
        {},
        _ins(_f(4, 5, 11), _ids(11, 4, 5), _f(), _f(4, 5)),
    ),
    (
        "cross_entropy_grad_sum",
        "cross_entropy_grad",
        {"reduction": "sum"},
        _ins(_f(6, 11), _ids(11, 6, dtype=np.int32), _f(), _f(6)),
    ),
    ("mse_loss", "mse_loss", {}, _ins(_f(3, 4), _f(3, 4))),
    ("mse_loss_sum", "mse_loss", {"reduction": "sum"}, _ins(_f(3, 4), _f(3, 4))),
    ("reshape", "reshape", {"shape": [4, -1]}, _ins(_f(2, 3, 4))),
    ("transpose", "transpose", {"dim0": 0, "dim1": -1}, _ins(_f(2, 3, 4))),
    ("permute", "permute", {"perm": [2, 0, 1]}, _ins(_f(2, 3, 4))),
    ("concat", "concat", {"dim": 1}, _ins(_f(2, 3, 4), _f(2, 1, 4), _f(2, 2, 4))),
    ("split", "split", {"dim": -1, "sizes": [1, 3, 2]}, _ins(_f(2, 3, 6))),
    ("slice", "slice", {"dim": 1, "start": 1, "stop": -1, "step": 2}, _ins(_f(2, 7, 3))),
    ("slice_clamped", "slice", {"dim": 0, "start": -3, "stop": 99}, _ins(_f(5, 2))),
    (
        "slice_grad",
        "slice_grad",
        {"dim": 1, "start": 1, "stop": -1, "step": 2, "size": 7},
        _ins(_f(2, 3, 3)),
    ),
    ("broadcast_to", "broadcast_to", {"shape": [2, 3, 4]}, _ins(_f(3, 1))),
    ("sum_all", "sum", {}, _ins(_f(2, 3, 4))),
    ("sum_dims", "sum", {"dims": [0, -1], "keepdim": True}, _ins(_f(2, 3, 4))),
    ("sum_int32", "sum", {"dims": [1]}, _ins(_ids(9, 3, 4, dtype=np.int32))),
    ("mean_dims", "mean", {"dims": [1]}, _ins(_f(2, 3, 4))),
    ("max_dims", "max", {"dims": [-1], "keepdim": True}, _ins(_f(2, 3, 4))),
    ("max_grad", "max_grad", {"dims": [-1]}, _same(3, 5)),
    ("main_grad", "main_grad", {}, _ins(_f(3, 4))),
    ("dropout", "dropout", {"p": 0.3, "seed": 5}, _ins(_f(4, 6, 5))),
    ("dropout_offset", "dropout", {"p": 0.9, "seed": -2, "offset": 77}, _ins(_f(3, 7))),
    ("dropout_keep_all", "dropout", {"p": 0.0, "seed": 1}, _ins(_f(2, 5))),
    ("dropout_grad", "dropout_grad", {"p": 0.25}, _ins(_f(3, 4), _ids(2, 3, 4, dtype=np.bool_))),
    ("pack", "pack", {}, _ins(_f(2, 3), _f(4), _f(1, 2, 2))),
    ("unpack", "unpack", {"shapes": [[2, 3], [4]]}, _ins(_f(10))),
    (
        "unpack_block",
        "unpack",
        {"shapes": [[4, 3], [8]], "block_shapes": [[2, 3], [4]]},
        _ins(_f(10)),
    ),
    ("fill", "fill", {"shape": [2, 3], "value": 1.5}, _ins()),
    ("rope_cache", "rope_cache", {"seq": 6, "head_dim": 8, "theta": 500.0}, _ins()),
    ("sgd", "sgd", {"lr": 0.1, "weight_decay": 0.01}, _ins(_f(3, 4), _f(3, 4))),
    (
        "adamw",
        "adamw",
        {"lr": 1e-2, "betas": [0.8, 0.99], "step": 3, "weight_decay": 0.1},
        _ins(_f(3, 4), _f(3, 4), _f(3, 4), _f(3, 4, low=0, high=1)),
    ),
    (
        "adamw_master",
        "adamw",
        {"lr": 1e-3},
        _ins(_f(3, 4), _f(3, 4), _f(3, 4), _f(3, 4, low=0, high=1), _f(3, 4)),
    ),
]
TOLERANCE = {np.float64: 1e-12, np.float32: 1e-5}


def test_every_kind_has_a_case_and_exists_in_the_catalog() -> None:
    assert {kind for _, kind, _, _ in CASES} == set(TORCH_IMPLS)
    for kind in TORCH_IMPLS:
        assert get_op(kind).numpy_impl is not None


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize(
    ("kind", "attrs", "make"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_torch_impl_equals_the_numpy_impl(
    kind: str, attrs: dict[str, Any], make: Callable[[Gen, type], list[Array]], dtype: type
) -> None:
    xs = make(np.random.default_rng(7), dtype)
    numpy_impl = get_op(kind).numpy_impl
    assert numpy_impl is not None
    want = [np.asarray(y) for y in numpy_impl([x.copy() for x in xs], attrs)]
    got = run_torch(kind, xs, attrs)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        if w.dtype.kind != "f":
            assert g.dtype == w.dtype
            np.testing.assert_array_equal(g, w)
            continue
        assert g.dtype == w.dtype
        rtol = TOLERANCE[dtype]
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * max(1.0, float(np.abs(w).max())))


@pytest.mark.parametrize(
    ("kind", "xs", "match"),
    [
        ("embedding", [np.array([0, 10]), np.zeros((10, 2))], r"ids hold values in \[0, 10\]"),
        ("cross_entropy", [np.zeros((2, 3)), np.array([-1, 2])], r"labels hold .*\[-1, 2\]"),
        ("cast", [np.array([1.0, np.inf])], "non-finite"),
    ],
)
def test_bad_values_are_refused_as_numpy_refuses_them(
    kind: str, xs: list[Array], match: str
) -> None:
    attrs = {"dtype": "int64"} if kind == "cast" else {}
    with pytest.raises(ExecutionError, match=match):
        run_torch(kind, xs, attrs)


@pytest.mark.parametrize(
    ("kind", "xs", "attrs"),
    [
        ("matmul", [np.ones((2, 3), np.float32), np.full((3, 2), 0.1)], {}),
        (
            "rotary_embedding",
            [np.ones((1, 2, 1, 4), np.float32), np.full((2, 2), 0.3), np.full((2, 2), 0.7)],
            {},
        ),
        ("embedding_grad", [np.array([1, 1, 0]), np.full((3, 2), 0.1)], {"vocab": 3}),
        (
            "cross_entropy_grad",
            [np.zeros((2, 3), np.float32), np.array([0, 2]), np.array(2.0), np.full(2, np.log(3))],
            {},
        ),
    ],
)
def test_mixed_float_dtypes_promote_as_numpy_does(
    kind: str, xs: list[Array], attrs: dict[str, Any]
) -> None:
    numpy_impl = get_op(kind).numpy_impl
    assert numpy_impl is not None
    want = numpy_impl([x.copy() for x in xs], attrs)
    for g, w in zip(run_torch(kind, xs, attrs), want, strict=True):
        assert g.dtype == np.asarray(w).dtype
        np.testing.assert_allclose(g, w, rtol=1e-6)  # numpy may round to float32 midway


def test_inputs_are_shared_not_copied_and_read_only_views_are_copied() -> None:
    x = np.arange(12.0).reshape(3, 4)
    (y,) = run_torch("reshape", [x], {"shape": [4, 3]})
    assert np.shares_memory(x, y)
    (t,) = run_torch("scale", [x.T], {"factor": 2.0})  # a non-contiguous block
    np.testing.assert_array_equal(t, 2 * x.T)
    frozen = np.broadcast_to(np.arange(3.0), (2, 3))  # read-only
    (s,) = run_torch("sum", [frozen], {"dims": [0]})
    np.testing.assert_array_equal(s, [0.0, 2.0, 4.0])


def test_importing_shardlab_does_not_import_torch() -> None:
    import subprocess

    code = "import shardlab, shardlab.runtime.torch_rank, sys; assert 'torch' not in sys.modules"
    # torch_rank imports torch_ops lazily: only a rank's first torch op imports torch
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
