"""The autodiff kinds' numpy kernels against torch autograd and torch.optim."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from shardlab.errors import OpSignatureError
from shardlab.ir import TensorType
from shardlab.ops import get_op, infer_types

RNG = np.random.default_rng(0)


def run(kind: str, *xs: np.ndarray, **attrs: Any) -> list[np.ndarray]:
    types = [TensorType(x.shape, "int64" if x.dtype.kind == "i" else "float32") for x in xs]
    out_types = infer_types(kind, types, attrs)
    impl = get_op(kind).numpy_impl
    assert impl is not None
    outs = impl(list(xs), attrs)
    assert [o.shape for o in outs] == [t.shape for t in out_types]
    return outs


def vjp_of(fn: Callable[..., torch.Tensor], xs: list[np.ndarray], dy: np.ndarray) -> list[Any]:
    ts = [torch.tensor(x, requires_grad=True) for x in xs]
    fn(*ts).backward(torch.tensor(dy))
    return [t.grad.numpy() for t in ts]  # type: ignore[union-attr]


def test_fill_and_broadcast_to() -> None:
    (z,) = run("fill", shape=[2, 3], value=1.5, dtype="float32")
    np.testing.assert_array_equal(z, np.full((2, 3), 1.5))
    (s,) = run("fill", shape=[], value=1.0, dtype="float32")
    assert s.shape == ()
    x = RNG.standard_normal((3, 1))
    (b,) = run("broadcast_to", x, shape=[2, 3, 4])
    np.testing.assert_array_equal(b, torch.tensor(x).expand(2, 3, 4).numpy())
    with pytest.raises(OpSignatureError, match="broadcast"):
        infer_types("broadcast_to", [TensorType((3, 2))], {"shape": [3, 4]})


@pytest.mark.parametrize(
    ("kind", "fn", "attrs"),
    [
        ("relu_grad", torch.relu, {}),
        ("gelu_grad", F.gelu, {}),
        ("gelu_grad", lambda x: F.gelu(x, approximate="tanh"), {"approximate": "tanh"}),
        ("silu_grad", F.silu, {}),
        ("sigmoid_grad", torch.sigmoid, {}),
        ("tanh_grad", torch.tanh, {}),
    ],
)
def test_activation_grads(kind: str, fn: Callable[..., torch.Tensor], attrs: Any) -> None:
    x, dy = RNG.standard_normal((3, 5)), RNG.standard_normal((3, 5))
    (dx,) = run(kind, x, dy, **attrs)
    np.testing.assert_allclose(dx, vjp_of(fn, [x], dy)[0], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("keepdim", [False, True])
def test_max_grad_splits_ties_like_amax(keepdim: bool) -> None:
    x = RNG.standard_normal((3, 4, 5))
    x[0, 1, :2] = 9.0  # a tie along dims (1, 2)
    y = np.max(x, axis=(1, 2), keepdims=keepdim)
    dy = RNG.standard_normal(y.shape)
    (dx,) = run("max_grad", x, y, dy, dims=[1, 2], keepdim=keepdim)
    expect = vjp_of(lambda t: torch.amax(t, dim=(1, 2), keepdim=keepdim), [x], dy)[0]
    np.testing.assert_allclose(dx, expect, rtol=1e-12)


def test_slice_grad() -> None:
    x = RNG.standard_normal((4, 9))
    dy = RNG.standard_normal((4, 3))
    (dx,) = run("slice_grad", dy, dim=1, start=-7, stop=None, step=3, size=9)
    np.testing.assert_array_equal(dx, vjp_of(lambda t: t[:, -7::3], [x], dy)[0])


def test_norm_grads() -> None:
    x, w, b = RNG.standard_normal((2, 3, 6)), RNG.standard_normal(6), RNG.standard_normal(6)
    dy = RNG.standard_normal((2, 3, 6))
    got = run("layer_norm_grad", x, w, dy, eps=1e-5)
    want = vjp_of(lambda x, w, b: F.layer_norm(x, (6,), w, b, 1e-5), [x, w, b], dy)
    for g, e in zip(got, want, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-9, atol=1e-12)
    got = run("rms_norm_grad", x, w, dy, eps=1e-6)
    want = vjp_of(lambda x, w: F.rms_norm(x, (6,), w, 1e-6), [x, w], dy)
    for g, e in zip(got, want, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(
    ("hkv", "causal", "scale"), [(4, True, None), (2, True, 0.3), (1, False, None)]
)
def test_attention_grad(hkv: int, causal: bool, scale: float | None) -> None:
    q = RNG.standard_normal((2, 5, 4, 3))
    k, v = RNG.standard_normal((2, 5, hkv, 3)), RNG.standard_normal((2, 5, hkv, 2))
    dy = RNG.standard_normal((2, 5, 4, 2))

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        k, v = k.repeat_interleave(4 // hkv, 2), v.repeat_interleave(4 // hkv, 2)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal, scale=scale
        )
        return out.transpose(1, 2)

    got = run("attention_grad", q, k, v, dy, causal=causal, scale=scale)
    for g, e in zip(got, vjp_of(fn, [q, k, v], dy), strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_cross_entropy_grad(reduction: str) -> None:
    logits, labels = RNG.standard_normal((2, 3, 7)), RNG.integers(0, 7, (2, 3))
    lse = np.log(np.sum(np.exp(logits), axis=-1))  # what the forward keeps (attr lse)
    (got,) = run("cross_entropy_grad", logits, labels, np.array(0.7), lse, reduction=reduction)

    def fn(t: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(
            t.reshape(-1, 7), torch.tensor(labels).reshape(-1), reduction=reduction
        )

    np.testing.assert_allclose(got, vjp_of(fn, [logits], np.array(0.7))[0], rtol=1e-10)
    assert get_op("cross_entropy_grad").index_bounds is not None


def test_embedding_grad_scatter_adds_repeated_ids() -> None:
    ids = np.array([[1, 3, 1], [0, 1, 4]])
    table, dy = RNG.standard_normal((6, 4)), RNG.standard_normal((2, 3, 4))
    (got,) = run("embedding_grad", ids, dy, vocab=6)
    want = vjp_of(lambda t: F.embedding(torch.tensor(ids), t), [table], dy)[0]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    bounds = get_op("embedding_grad").index_bounds
    assert bounds is not None and bounds([], {"vocab": 6}) == {0: 6}


def test_main_grad_is_the_float32_gradient() -> None:
    g = RNG.standard_normal((3, 4))
    (got,) = run("main_grad", g)
    np.testing.assert_array_equal(got, g)
    assert got is not g
    out = infer_types("main_grad", [TensorType((3, 4), "bfloat16")], {})
    assert out == [TensorType((3, 4), "float32")]
    with pytest.raises(OpSignatureError, match="main_grad needs a floating-point gradient"):
        infer_types("main_grad", [TensorType((3,), "int64")], {})


def test_sgd_matches_torch() -> None:
    p, g = RNG.standard_normal((3, 4)), RNG.standard_normal((3, 4))
    (new,) = run("sgd", p, g, lr=0.1, weight_decay=0.01)
    tp = torch.tensor(p, requires_grad=True)
    tp.grad = torch.tensor(g)
    torch.optim.SGD([tp], lr=0.1, weight_decay=0.01).step()
    np.testing.assert_allclose(new, tp.detach().numpy(), rtol=1e-14)


@pytest.mark.parametrize("step", [1, 3])
def test_adamw_matches_torch(step: int) -> None:
    p, g = RNG.standard_normal((3, 4)), RNG.standard_normal((3, 4))
    m = RNG.standard_normal((3, 4)) if step > 1 else np.zeros((3, 4))
    v = RNG.random((3, 4)) if step > 1 else np.zeros((3, 4))
    attrs = {"lr": 0.01, "betas": [0.8, 0.95], "eps": 1e-6, "weight_decay": 0.1}
    got = run("adamw", p, g, m, v, step=step, **attrs)
    tp = torch.tensor(p, requires_grad=True)
    tp.grad = torch.tensor(g)
    opt = torch.optim.AdamW([tp], lr=0.01, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
    if step > 1:
        opt.state[tp] = {"step": torch.tensor(float(step - 1)), "exp_avg": torch.tensor(m),
                         "exp_avg_sq": torch.tensor(v)}  # fmt: skip
    opt.step()
    st = opt.state[tp]
    for a, b in zip(got, [tp.detach(), st["exp_avg"], st["exp_avg_sq"]], strict=True):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-13, atol=1e-15)
    assert math.isclose(float(st["step"]), step)


def test_optimizer_signatures_are_checked() -> None:
    t = TensorType((3,))
    with pytest.raises(OpSignatureError, match="param's shape"):
        infer_types("sgd", [t, TensorType((4,))], {"lr": 0.1})
    with pytest.raises(OpSignatureError, match="step"):
        infer_types("adamw", [t] * 4, {"lr": 0.1, "step": 0})
