"""The training graph: gradients and optimizer steps against torch autograd, in float64."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from shardlab.autodiff import training_graph
from shardlab.errors import GraphError
from shardlab.ir import Graph, OpRole, TensorType, ValueKind
from shardlab.models import build_model
from shardlab.models.builder import GraphBuilder
from shardlab.ops import all_ops, get_op
from shardlab.ops.dropout import keep_mask
from shardlab.runtime.reference import make_feeds, run_reference
from shardlab.spmd.complete import complete
from shardlab.strategy import Strategy
from shardlab.validate import validate_graph
from shardlab.vjp_rules import NON_DIFFERENTIABLE

Arrays = dict[str, np.ndarray]
TINY = {"layers": 2, "hidden": 32, "heads": 4, "kv_heads": 2, "ffn": 64, "vocab": 50, "seq": 8,
        "batch": 2, "dtype": "float32"}  # fmt: skip
LLAMA_CFG = build_model("llama3-8b", TINY).meta["config"]
GPT2 = {k: v for k, v in TINY.items() if k != "kv_heads"}


def _run(tg: Graph, base: Graph, seed: int = 0) -> tuple[Arrays, Arrays]:
    """Run the training graph on the forward graph's seeded feeds, zero optimizer state."""
    feeds = make_feeds(base, seed=seed)
    for v in tg.values_of_kind(ValueKind.STATE):
        if tg.producer(v.name) is None:
            feeds[v.name] = np.zeros(v.type.shape)
    return feeds, run_reference(tg, feeds)


def _torch_grads(feeds: Arrays, loss_fn: Callable[[dict[str, torch.Tensor]], torch.Tensor],
                 params: list[str]) -> tuple[float, dict[str, torch.Tensor]]:  # fmt: skip
    ts = {k: torch.tensor(v, requires_grad=k in params) for k, v in feeds.items()}
    loss = loss_fn(ts)
    loss.backward()
    return float(loss.detach()), {p: ts[p] for p in params}


def _llama(t: dict[str, torch.Tensor], heads: int = 4, kv_heads: int = 2) -> torch.Tensor:
    """An independent Llama forward (HF conventions), as in tests/shardlab/runtime."""
    h = F.embedding(t["tokens"], t["embed.weight"])
    b, s, hidden = h.shape
    hd = hidden // heads
    inv = LLAMA_CFG["rope_theta"] ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = torch.arange(s, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)

    def rot(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
        return x * cos[None, :, None, :] + torch.cat([-x2, x1], -1) * sin[None, :, None, :]

    def rms(x: torch.Tensor, w: str) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + LLAMA_CFG["norm_eps"]) * t[w]

    for i in range(2):
        p = f"layers.{i}."
        x = rms(h, p + "attn_norm.weight")
        q = (x @ t[p + "attn.q_proj.weight"]).view(b, s, heads, hd)
        k = (x @ t[p + "attn.k_proj.weight"]).view(b, s, kv_heads, hd)
        v = (x @ t[p + "attn.v_proj.weight"]).view(b, s, kv_heads, hd)
        q, k = rot(q), rot(k)
        rep = heads // kv_heads
        k, v = k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2)
        att = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        h = h + att.transpose(1, 2).reshape(b, s, hidden) @ t[p + "attn.o_proj.weight"]
        x = rms(h, p + "mlp_norm.weight")
        gate = F.silu(x @ t[p + "mlp.gate_proj.weight"])
        h = h + (gate * (x @ t[p + "mlp.up_proj.weight"])) @ t[p + "mlp.down_proj.weight"]
    logits = rms(h, "final_norm.weight") @ t["lm_head.weight"]
    return F.cross_entropy(logits.reshape(b * s, -1), t["labels"].reshape(-1))


def _gpt2(t: dict[str, torch.Tensor]) -> torch.Tensor:
    h = F.embedding(t["tokens"], t["embed.weight"]) + t["pos_embed.weight"][:8]
    b, s, hidden = h.shape

    def ln(x: torch.Tensor, m: str) -> torch.Tensor:
        return F.layer_norm(x, (hidden,), t[m + ".weight"], t[m + ".bias"], 1e-5)

    def lin(x: torch.Tensor, m: str) -> torch.Tensor:
        return x @ t[m + ".weight"] + t[m + ".bias"]

    for i in range(2):
        p = f"layers.{i}."
        x = ln(h, p + "attn_norm")
        q, k, v = (lin(x, p + f"attn.{n}_proj").view(b, s, 4, 8).transpose(1, 2) for n in "qkv")
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + lin(att.transpose(1, 2).reshape(b, s, hidden), p + "attn.o_proj")
        x = ln(h, p + "mlp_norm")
        h = h + lin(F.gelu(lin(x, p + "mlp.up_proj"), approximate="tanh"), p + "mlp.down_proj")
    logits = ln(h, "final_norm") @ t["embed.weight"].T
    return F.cross_entropy(logits.reshape(b * s, -1), t["labels"].reshape(-1))


def _mlp(t: dict[str, torch.Tensor]) -> torch.Tensor:
    return ((t["x"] @ t["w0"] @ t["w1"] - t["label"]) ** 2).mean()


MODELS: dict[str, tuple[str, dict[str, Any], Callable[[dict[str, torch.Tensor]], torch.Tensor]]] = {
    "mlp_demo": ("mlp_demo", {}, _mlp),
    "llama": ("llama3-8b", TINY, _llama),
    "gpt2": ("gpt2", GPT2, _gpt2),
}


@pytest.mark.parametrize("model", list(MODELS))
def test_every_param_gradient_and_adamw_step_match_torch(model: str) -> None:
    preset, overrides, fn = MODELS[model]
    g = build_model(preset, overrides)
    opt = {"betas": [0.85, 0.99], "eps": 1e-7, "weight_decay": 0.05}
    tg = training_graph(g, "adamw", lr=0.01, **opt)
    validate_graph(tg)
    feeds, env = _run(tg, g)
    params = [v.name for v in g.values_of_kind(ValueKind.PARAM)]
    loss, ts = _torch_grads(feeds, fn, params)
    np.testing.assert_allclose(env[tg.meta["loss"]], loss, rtol=1e-12)
    for p in params:
        assert tg.value(f"{p}.grad").kind == ValueKind.GRAD
        want = ts[p].grad.numpy()  # type: ignore[union-attr]
        np.testing.assert_allclose(env[f"{p}.grad"], want, rtol=1e-9, atol=1e-12, err_msg=p)
    torch.optim.AdamW(list(ts.values()), lr=0.01, betas=(0.85, 0.99), eps=1e-7,
                      weight_decay=0.05).step()  # fmt: skip
    for p in params:
        np.testing.assert_allclose(env[f"{p}.new"], ts[p].detach().numpy(), rtol=1e-9, atol=1e-12)
        assert tg.value(f"{p}.new").kind == ValueKind.PARAM
        assert (
            tg.value(f"{p}.exp_avg").kind == tg.value(f"{p}.exp_avg_sq.new").kind == ValueKind.STATE
        )
        assert tg.op(f"{p}.adamw").attrs["inplace"] == [0, 2, 3]
        assert tg.op(f"{p}.adamw").role == OpRole.OPTIMIZER


def test_sgd_step_matches_torch() -> None:
    g = build_model("mlp_demo")
    tg = training_graph(g, "sgd", lr=0.1, weight_decay=0.01)
    assert not tg.values_of_kind(ValueKind.STATE)
    feeds, env = _run(tg, g)
    _, ts = _torch_grads(feeds, _mlp, ["w0", "w1"])
    torch.optim.SGD(list(ts.values()), lr=0.1, weight_decay=0.01).step()
    for p in ("w0", "w1"):
        np.testing.assert_allclose(env[f"{p}.new"], ts[p].detach().numpy(), rtol=1e-12)
        assert tg.op(f"{p}.sgd").attrs["inplace"] == [0]


def test_gpt2_tied_embedding_accumulates_both_uses() -> None:
    tg = training_graph(build_model("gpt2", GPT2))
    acc = tg.producer("embed.weight.grad")
    assert acc is not None and acc.kind == "add" and acc.role == OpRole.BACKWARD
    kinds = {tg.producer(v).kind for v in acc.inputs}  # type: ignore[union-attr]
    assert kinds == {"embedding_grad", "matmul"}  # the lm_head matmul's dB, already [V, H]
    head_grad = next(
        tg.producer(v)
        for v in acc.inputs
        if tg.producer(v).kind == "matmul"  # type: ignore[union-attr]
    )
    # one matmul over the flattened batch and sequence: never a [batch, V, H] gradient
    assert tg.value(head_grad.outputs[0]).type.shape == (GPT2["vocab"], GPT2["hidden"])
    assert all(tg.value(v).type.rank == 2 for v in head_grad.inputs)


@pytest.mark.parametrize("model", list(MODELS))
def test_training_graph_validates_and_completes_under_dp(model: str) -> None:
    preset, overrides, _ = MODELS[model]
    tg = validate_graph(training_graph(build_model(preset, overrides)))
    done = complete(tg, Strategy.build("dp=2", ["dp"]))
    counts = Counter(tg.op(name).kind for name in done.fallback_ops())
    print(model, "fallback ops:", sum(counts.values()), dict(counts))
    for op in tg.ops:
        if op.role == OpRole.OPTIMIZER:  # params and state keep their placement
            assert done.specs[op.outputs[0]] == done.specs[op.inputs[0]]
    roles = Counter(op.role for op in tg.ops)
    assert roles[OpRole.BACKWARD] > 0 and roles[OpRole.OPTIMIZER] > 0


# -- per-kind VJPs ---------------------------------------------------------------------


def _rot(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., :2], x[..., 2:]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)


F_, POS = "f", "pos"  # float input (a param); positive float input
#: kind -> (inputs: (shape, "f" | "pos" | "i<bound>" | "c" constant float), attrs, torch fn)
CASES: list[tuple[str, list[tuple[tuple[int, ...], str]], dict[str, Any], Callable[..., Any]]] = [
    ("matmul", [((2, 3, 4), F_), ((4, 5), F_)], {}, torch.matmul),
    ("matmul", [((2, 4, 3), F_), ((5, 4), F_)], {"transpose_a": True, "transpose_b": True},
     lambda a, b: a.transpose(-1, -2) @ b.transpose(-1, -2)),
    ("matmul", [((4, 3), F_), ((2, 4, 5), F_)], {"transpose_a": True},
     lambda a, b: a.T @ b),
    ("matmul", [((2, 1, 3, 4), F_), ((3, 5, 4), F_)], {"transpose_b": True},
     lambda a, b: a @ b.transpose(-1, -2)),
    ("linear", [((2, 3, 4), F_), ((4, 5), F_), ((5,), F_)], {}, lambda x, w, b: x @ w + b),
    ("linear", [((4,), F_), ((4, 5), F_)], {}, lambda x, w: x @ w),
    ("add", [((2, 3), F_), ((3,), F_)], {}, torch.add),
    ("sub", [((2, 1, 3), F_), ((4, 3), F_)], {}, torch.sub),
    ("mul", [((2, 3), F_), ((2, 1), F_)], {}, torch.mul),
    ("div", [((2, 3), F_), ((3,), POS)], {}, torch.div),
    ("neg", [((2, 3), F_)], {}, torch.neg),
    ("scale", [((2, 3), F_)], {"factor": 1.5}, lambda x: x * 1.5),
    ("relu", [((2, 3), F_)], {}, torch.relu),
    ("gelu", [((2, 3), F_)], {}, F.gelu),
    ("gelu", [((2, 3), F_)], {"approximate": "tanh"}, lambda x: F.gelu(x, approximate="tanh")),
    ("silu", [((2, 3), F_)], {}, F.silu),
    ("sigmoid", [((2, 3), F_)], {}, torch.sigmoid),
    ("tanh", [((2, 3), F_)], {}, torch.tanh),
    ("exp", [((2, 3), F_)], {}, torch.exp),
    ("log", [((2, 3), POS)], {}, torch.log),
    ("square", [((2, 3), F_)], {}, torch.square),
    ("sqrt", [((2, 3), POS)], {}, torch.sqrt),
    ("rsqrt", [((2, 3), POS)], {}, torch.rsqrt),
    ("cast", [((2, 3), F_)], {"dtype": "bfloat16"}, lambda x: x),
    ("sum", [((2, 3, 4), F_)], {"dims": [1]}, lambda x: x.sum(1)),
    ("sum", [((2, 3, 4), F_)], {}, torch.sum),
    ("mean", [((2, 3, 4), F_)], {"dims": [0, -1], "keepdim": True},
     lambda x: x.mean((0, 2), keepdim=True)),
    ("max", [((2, 3, 4), F_)], {"dims": [-1]}, lambda x: x.amax(-1)),
    ("softmax", [((2, 3, 4), F_)], {"dim": 1}, lambda x: torch.softmax(x, 1)),
    ("log_softmax", [((2, 3, 4), F_)], {}, lambda x: torch.log_softmax(x, -1)),
    ("reshape", [((2, 3, 4), F_)], {"shape": [6, -1]}, lambda x: x.reshape(6, -1)),
    ("transpose", [((2, 3, 4), F_)], {"dim0": 0, "dim1": 2}, lambda x: x.transpose(0, 2)),
    ("permute", [((2, 3, 4), F_)], {"perm": [1, 2, 0]}, lambda x: x.permute(1, 2, 0)),
    ("split", [((2, 6), F_)], {"dim": 1, "sizes": [1, 2, 3]}, lambda x: x.split([1, 2, 3], 1)),
    ("concat", [((2, 1), F_), ((2, 3), F_)], {"dim": -1}, lambda a, b: torch.cat([a, b], -1)),
    ("slice", [((3, 9), F_)], {"dim": 1, "start": -7, "step": 2}, lambda x: x[:, -7::2]),
    ("broadcast_to", [((3, 1), F_)], {"shape": [2, 3, 4]}, lambda x: x.expand(2, 3, 4)),
    ("embedding", [((2, 3), "i7"), ((7, 4), F_)], {}, lambda i, t: F.embedding(i, t)),
    ("rotary_embedding", [((2, 3, 2, 4), F_), ((3, 2), "c"), ((3, 2), "c")], {},
     lambda x, c, s: _rot(x, c[None, :, None], s[None, :, None])),
    ("layer_norm", [((2, 3, 5), F_), ((5,), F_), ((5,), F_)], {"eps": 1e-5},
     lambda x, w, b: F.layer_norm(x, (5,), w, b, 1e-5)),
    ("rms_norm", [((2, 3, 5), F_), ((5,), F_)], {}, lambda x, w: F.rms_norm(x, (5,), w, 1e-6)),
    ("scaled_dot_product_attention", [((2, 4, 4, 3), F_), ((2, 4, 2, 3), F_), ((2, 4, 2, 3), F_)],
     {"causal": True}, lambda q, k, v: F.scaled_dot_product_attention(
         q.transpose(1, 2), k.repeat_interleave(2, 2).transpose(1, 2),
         v.repeat_interleave(2, 2).transpose(1, 2), is_causal=True).transpose(1, 2)),
    ("cross_entropy", [((2, 3, 5), F_), ((2, 3), "i5")], {"reduction": "sum"},
     lambda x, y: F.cross_entropy(x.reshape(6, 5), y.reshape(6), reduction="sum")),
    ("mse_loss", [((2, 3), F_), ((2, 3), F_)], {}, F.mse_loss),
    ("masked_softmax", [((2, 3, 4, 4), F_)], {"scale": 0.7, "causal": True},
     lambda x: torch.softmax((x * 0.7).masked_fill(
         torch.ones(4, 4, dtype=torch.bool).triu(1), float("-inf")), -1)),
    ("dropout", [((2, 3, 4), F_)], {"p": 0.3, "seed": 9},  # y only: the mask is bool
     lambda x: x * torch.tensor(keep_mask(np.arange(24).reshape(2, 3, 4), 9, 0.3)) / 0.7),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "ins", "attrs", "fn"), CASES, ids=[c[0] for c in CASES])
def test_vjp_matches_torch(kind: str, ins: Any, attrs: dict[str, Any], fn: Any) -> None:
    rng = np.random.default_rng(len(ins))
    b = GraphBuilder("one")
    names, feeds = [], {}
    for i, (shape, what) in enumerate(ins):
        name = f"in{i}"
        if what.startswith("i"):
            b.input(name, shape, "int64")
            feeds[name] = rng.integers(0, int(what[1:]), shape)
        else:
            (b.input if what == "c" else b.param)(name, shape, "float32")
            data = rng.standard_normal(shape)
            feeds[name] = np.abs(data) + 0.5 if what == POS else data
        names.append(name)
    outs = b.ops(kind, names, "op", attrs)
    parts = []
    for j, out in enumerate(outs):
        if not b.type_of(out).is_float:  # a bool output (dropout's mask) has no gradient
            continue
        b.input(f"w{j}", b.type_of(out).shape, b.type_of(out).dtype)
        feeds[f"w{j}"] = rng.standard_normal(b.type_of(out).shape)
        parts.append(b.op("sum", [b.op("mul", [out, f"w{j}"], f"weighted{j}")], f"part{j}"))
    loss = parts[0]
    for j, part in enumerate(parts[1:]):
        loss = b.op("add", [loss, part], f"total{j}")
    g = b.build([loss])
    env = run_reference(training_graph(g, "sgd"), feeds)
    params = [n for n, (_, what) in zip(names, ins, strict=True) if what in (F_, POS)]
    ts = {k: torch.tensor(v, requires_grad=k in params) for k, v in feeds.items()}
    res = fn(*(ts[n] for n in names))
    res = res if isinstance(res, tuple) else (res,)
    total = sum((r * ts[f"w{j}"]).sum() for j, r in enumerate(res))
    total.backward()  # type: ignore[union-attr]
    np.testing.assert_allclose(env[loss], float(total.detach()), rtol=1e-12)
    for p in params:
        np.testing.assert_allclose(env[f"{p}.grad"], ts[p].grad.numpy(), rtol=1e-9, atol=1e-12)  # type: ignore[union-attr]  # fmt: skip


def test_every_kind_has_a_vjp_or_a_reason() -> None:
    tested = {c[0] for c in CASES}
    for opdef in all_ops():
        if opdef.vjp is None:
            assert NON_DIFFERENTIABLE.get(opdef.kind), f"{opdef.kind}: no VJP and no reason"
        else:
            assert opdef.kind not in NON_DIFFERENTIABLE
            assert opdef.kind in tested, f"{opdef.kind}: VJP without a test case"


def test_non_differentiable_op_on_the_path_is_named() -> None:
    b = GraphBuilder("opq")
    w = b.param("w", (2, 3), "float32")
    y = b.op("opaque", [w], "blackbox", {"output_types": [{"shape": [2, 3], "dtype": "float32"}]})
    g = b.build([b.op("mse_loss", [y, b.input("t", (2, 3))], "loss", role=OpRole.LOSS)])
    with pytest.raises(GraphError, match=r"'blackbox' \(opaque\).*not differentiable"):
        training_graph(g)


def test_bad_arguments_are_named() -> None:
    g = build_model("mlp_demo")
    with pytest.raises(GraphError, match="unknown optimizer 'lamb'"):
        training_graph(g, "lamb")
    with pytest.raises(GraphError, match="no option"):
        training_graph(g, "sgd", betas=[0.9, 0.9])
    assert get_op("fill").vjp is None and TensorType(()).numel == 1
