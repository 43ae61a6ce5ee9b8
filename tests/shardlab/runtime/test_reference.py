"""The one-device reference runtime, checked against independent torch models."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from shardlab.errors import ExecutionError
from shardlab.ir import Graph, Op, TensorType, Value, ValueKind
from shardlab.models import build_model
from shardlab.runtime.reference import index_bound, make_feeds, run_reference

TINY = {"layers": 2, "hidden": 32, "heads": 4, "ffn": 64, "vocab": 50, "seq": 8, "batch": 2,
        "dtype": "float32"}  # fmt: skip


def test_feeds_are_seeded_and_indices_in_range() -> None:
    g = build_model("llama3-8b", {**TINY, "kv_heads": 2})
    a, b = make_feeds(g, seed=3), make_feeds(g, seed=3)
    assert set(a) == {"tokens", "labels"} | {v.name for v in g.values_of_kind(ValueKind.PARAM)}
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert index_bound(g, "tokens") == 50 and index_bound(g, "labels") == 50
    assert a["tokens"].dtype == np.int64 and a["tokens"].min() >= 0 and a["tokens"].max() < 50
    assert a["embed.weight"].dtype == np.float64
    assert make_feeds(g, compute_dtype="float32")["embed.weight"].dtype == np.float32


def test_mlp_demo_loss_matches_the_formula() -> None:
    g = build_model("mlp_demo")
    env = run_reference(g, seed=1)
    expected = np.mean((env["x"] @ env["w0"] @ env["w1"] - env["label"]) ** 2)
    assert env["loss"].shape == ()
    np.testing.assert_allclose(env["loss"], expected, rtol=1e-14)


def _t(env: dict[str, np.ndarray], name: str) -> torch.Tensor:
    return torch.from_numpy(env[name])


def _torch_llama(env: dict[str, np.ndarray], heads: int, kv_heads: int, layers: int) -> float:
    """An independent Llama forward (HF conventions) over the same weights."""
    tokens, labels = _t(env, "tokens"), _t(env, "labels")
    h = F.embedding(tokens, _t(env, "embed.weight"))
    b, s, hidden = h.shape
    hd = hidden // heads
    inv = 10000.0 ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = torch.arange(s, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)

    def rot(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
        c, sn = cos[None, :, None, :], sin[None, :, None, :]
        return x * c + torch.cat([-x2, x1], -1) * sn

    def rms(x: torch.Tensor, w: str) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * _t(env, w)

    for i in range(layers):
        p = f"layers.{i}."
        x = rms(h, p + "attn_norm.weight")
        q = (x @ _t(env, p + "attn.q_proj.weight")).view(b, s, heads, hd)
        k = (x @ _t(env, p + "attn.k_proj.weight")).view(b, s, kv_heads, hd)
        v = (x @ _t(env, p + "attn.v_proj.weight")).view(b, s, kv_heads, hd)
        q, k = rot(q), rot(k)
        rep = heads // kv_heads
        k, v = k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2)
        att = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        h = h + att.transpose(1, 2).reshape(b, s, hidden) @ _t(env, p + "attn.o_proj.weight")
        x = rms(h, p + "mlp_norm.weight")
        gate = F.silu(x @ _t(env, p + "mlp.gate_proj.weight"))
        h = h + (gate * (x @ _t(env, p + "mlp.up_proj.weight"))) @ _t(
            env, p + "mlp.down_proj.weight"
        )
    logits = rms(h, "final_norm.weight") @ _t(env, "lm_head.weight")
    return float(F.cross_entropy(logits.reshape(b * s, -1), labels.reshape(-1)))


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_tiny_llama_matches_an_independent_torch_model(kv_heads: int) -> None:
    g = build_model("llama2-7b", {**TINY, "kv_heads": kv_heads})
    env = run_reference(g, seed=0)
    expected = _torch_llama(env, heads=4, kv_heads=kv_heads, layers=2)
    assert math.isclose(float(env["loss"]), expected, rel_tol=1e-12)


def test_tiny_gpt2_matches_an_independent_torch_model() -> None:
    g = build_model("gpt2", {k: v for k, v in TINY.items() if k != "heads"} | {"heads": 4})
    env = run_reference(g, seed=0)
    tokens = _t(env, "tokens")
    h = F.embedding(tokens, _t(env, "embed.weight")) + _t(env, "pos_embed.weight")[:8]
    b, s, hidden = h.shape

    def ln(x: torch.Tensor, m: str) -> torch.Tensor:
        return F.layer_norm(x, (hidden,), _t(env, m + ".weight"), _t(env, m + ".bias"), 1e-5)

    def lin(x: torch.Tensor, m: str) -> torch.Tensor:
        return x @ _t(env, m + ".weight") + _t(env, m + ".bias")

    for i in range(2):
        p = f"layers.{i}."
        x = ln(h, p + "attn_norm")
        q, k, v = (lin(x, p + f"attn.{n}_proj").view(b, s, 4, 8).transpose(1, 2) for n in "qkv")
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + lin(att.transpose(1, 2).reshape(b, s, hidden), p + "attn.o_proj")
        x = ln(h, p + "mlp_norm")
        h = h + lin(F.gelu(lin(x, p + "mlp.up_proj"), approximate="tanh"), p + "mlp.down_proj")
    logits = ln(h, "final_norm") @ _t(env, "embed.weight").T
    expected = float(F.cross_entropy(logits.reshape(b * s, -1), _t(env, "labels").reshape(-1)))
    assert math.isclose(float(env["loss"]), expected, rel_tol=1e-12)


def test_float32_run_stays_float32_and_close_to_float64() -> None:
    g = build_model("llama3-8b", {**TINY, "kv_heads": 2})
    lo = run_reference(g, compute_dtype="float32")
    hi = run_reference(g, compute_dtype="float64")
    assert lo["loss"].dtype == np.float32
    assert lo["layers.1.mlp.down_proj"].dtype == np.float32
    np.testing.assert_allclose(lo["loss"], hi["loss"], rtol=1e-5)


def test_given_feeds_override_seeded_ones() -> None:
    g = build_model("mlp_demo")
    x = np.ones((16, 32))
    env = run_reference(g, {"x": x})
    np.testing.assert_array_equal(env["x"], x)
    np.testing.assert_allclose(env["y"], x @ env["w0"])


def test_bad_feeds_and_unrunnable_ops_are_named() -> None:
    g = build_model("mlp_demo")
    with pytest.raises(
        ExecutionError, match=r"feed 'x' has shape \[2\], the graph declares \[16, 32\]"
    ):
        run_reference(g, {"x": np.ones(2)})
    with pytest.raises(ExecutionError, match=r"feed 'y' is not a source value"):
        run_reference(g, {"y": np.ones((16, 32))})
    with pytest.raises(ExecutionError, match=r"compute dtype must be float64 or float32"):
        run_reference(g, compute_dtype="float16")
    opaque = Graph(
        [Value("a", TensorType((2,)), ValueKind.INPUT), Value("b", TensorType((2,)))],
        [
            Op(
                "custom",
                "opaque",
                ("a",),
                ("b",),
                {"output_types": [{"shape": [2], "dtype": "float32"}]},
            )
        ],
    )
    with pytest.raises(ExecutionError, match=r"op 'custom' \(opaque\):.*reference"):
        run_reference(opaque)


def test_optimizer_state_starts_at_zero_and_a_training_step_is_finite() -> None:
    from shardlab.autodiff import training_graph

    tg = training_graph(build_model("mlp_demo"), optimizer="adamw", lr=1e-2)
    feeds = make_feeds(tg)
    assert np.all(feeds["w0.exp_avg_sq"] == 0)
    env = run_reference(tg)
    assert np.all(np.isfinite(env["w0.new"]))
