"""The torch versions of the rank-aware kernels (`runtime.torch_kernels`): on every rank, each
equals its numpy kernel (`runtime.kernels`) in float64 and float32, its mid-op requests
included; the dropout mask is bit for bit the numpy one; and the torch backend runs them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from shardlab.ir import TensorType
from shardlab.mesh import Mesh
from shardlab.ops.base import Array
from shardlab.ops.dropout import keep_mask
from shardlab.placement import DistSpec
from shardlab.runtime.distribute import to_local
from shardlab.runtime.kernels import KERNELS, CollectiveRequest, LocalContext

torch = pytest.importorskip("torch")
from shardlab.runtime import torch_dropout, torch_ops  # noqa: E402
from shardlab.runtime.torch_kernels import TORCH_KERNELS, drive, torch_kernel  # noqa: E402

MESH = Mesh((2, 2), ("dp", "tp"))
LINE = Mesh((4,), ("tp",))
TOLERANCE = {np.float64: 1e-12, np.float32: 1e-5}


def _ctx(
    mesh: Mesh,
    rank: int,
    types: Sequence[TensorType],
    specs: Sequence[str],
    out_types: Sequence[TensorType],
    out_specs: Sequence[str],
) -> LocalContext:
    return LocalContext(
        mesh,
        rank,
        tuple(types),
        tuple(out_types),
        tuple(DistSpec.parse(s, mesh) for s in specs),
        tuple(DistSpec.parse(s, mesh) for s in out_specs),
    )


class Reducer:
    """A fake all_reduce: the request's data unchanged, or a fixed array per request (the
    same for the numpy and the torch run); records the requests."""

    def __init__(self, fixed: bool) -> None:
        self.fixed = fixed
        self.seen: list[CollectiveRequest] = []

    def __call__(self, req: CollectiveRequest) -> Any:
        is_tensor = isinstance(req.data, torch.Tensor)
        data = req.data.numpy() if is_tensor else np.asarray(req.data)
        self.seen.append(CollectiveRequest(req.op, req.axes, data))
        reply = data.copy()
        if self.fixed:  # above the local max, a larger sum: like the other ranks' share
            n = len(self.seen)
            reply = np.asarray(np.abs(data) + 0.25 * n + 1.0, dtype=data.dtype)
        return torch.from_numpy(reply) if is_tensor else reply


def assert_torch_kernel_matches(
    kernel: str,
    kind: str,
    xs: Sequence[Array],
    attrs: dict[str, Any],
    ctx: LocalContext,
    dtype: type,
    fixed: bool = False,
) -> None:
    """The torch kernel equals the numpy kernel on these blocks, requests included."""
    xs = [x.astype(dtype) if x.dtype.kind == "f" else x for x in xs]
    ref, red = Reducer(fixed), Reducer(fixed)
    want = drive(KERNELS[kernel](kind, [x.copy() for x in xs], attrs, ctx), ref)
    fn = torch_kernel(kind, kernel, ctx)
    assert fn is TORCH_KERNELS[kernel]
    got = drive(fn(kind, [torch.from_numpy(x.copy()) for x in xs], attrs, ctx), red)
    assert [(q.op, q.axes) for q in red.seen] == [(q.op, q.axes) for q in ref.seen]
    tol = TOLERANCE[dtype]
    for g, w in zip([q.data for q in red.seen], [q.data for q in ref.seen], strict=True):
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        g, w = g.numpy(), np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype
        if w.dtype.kind != "f":
            np.testing.assert_array_equal(g, w)
        else:
            scale = max(1.0, float(np.abs(w).max())) if w.size else 1.0
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol * scale)


def assert_on_every_rank(
    kernel: str,
    kind: str,
    xs: Sequence[Array],
    specs: Sequence[str],
    out_types: Sequence[TensorType],
    out_specs: Sequence[str],
    attrs: dict[str, Any],
    mesh: Mesh,
    dtype: type,
    fixed: bool = False,
) -> None:
    """`assert_torch_kernel_matches` on every rank's blocks of the global inputs `xs`."""
    types = [TensorType(x.shape, x.dtype.name if x.dtype.kind != "f" else "float32") for x in xs]
    for r in mesh.ranks:
        ctx = _ctx(mesh, r, types, specs, out_types, out_specs)
        local = [to_local(x, s, r) for x, s in zip(xs, ctx.input_specs, strict=True)]
        assert_torch_kernel_matches(kernel, kind, local, attrs, ctx, dtype, fixed)


rng = np.random.default_rng(5)
DTYPES = pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])


@DTYPES
@pytest.mark.parametrize("vocab", [16, 14, 6])  # 14 rows: 4, 4, 4, 2; 6 rows: 2, 2, 2, 0
@pytest.mark.parametrize("ids_dtype", [np.int64, np.int32])
def test_embedding_kernels(dtype: type, vocab: int, ids_dtype: type) -> None:
    ids = np.array([[0, 3, 4, 7], [8, 11, 12, vocab - 1], [vocab - 1, 0, 5, 5]], ids_dtype) % vocab
    table, dy = rng.standard_normal((vocab, 4)), rng.standard_normal((3, 4, 4))
    assert_on_every_rank(
        "embedding_vocab_parallel",
        "embedding",
        [ids, table],
        ["R", "S(0)"],
        [TensorType((3, 4, 4))],
        ["P(sum)"],
        {},
        LINE,
        dtype,
    )
    assert_on_every_rank(
        "embedding_grad_vocab_parallel",
        "embedding_grad",
        [ids, dy],
        ["R", "R"],
        [TensorType((vocab, 4))],
        ["S(0)"],
        {"vocab": vocab},
        LINE,
        dtype,
    )


@DTYPES
@pytest.mark.parametrize("fixed", [False, True])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize(
    ("specs", "batch", "vocab"),
    [
        (["S(0)S(1)", "S(0)R"], 4, 8),
        (["RS(1)", "RR"], 4, 8),
        (["S(0)S(1)", "S(0)R"], 5, 8),
        (["S(0)S(1)", "S(0)R"], 5, 1),  # the vocab's blocks: 1, 0 (empty)
        (["S(0)S(1)", "S(0)R"], 1, 8),  # the batch's blocks: 1, 0 (empty)
    ],
)
def test_cross_entropy_kernels(
    dtype: type, fixed: bool, reduction: str, specs: list[str], batch: int, vocab: int
) -> None:
    logits = rng.standard_normal((batch, vocab)) * 4
    labels = np.array([0, 3, 4, 7, 5][:batch]) % vocab
    dloss = np.asarray(rng.standard_normal())
    lse = np.log(np.sum(np.exp(logits), axis=-1))
    attrs = {"reduction": reduction}
    # The loss is whole over the vocab axis (the kernel all-reduces the target logit too).
    mean = reduction == "mean" and not batch % 2
    out = ("R" if specs[1] == "RR" else "P(avg)" if mean else "P(sum)") + "R"
    kernel = "cross_entropy_vocab_parallel" + ("+global_mean" if batch % 2 else "")
    for lse_out in (False, True):  # the training graph's forward also outputs the lse
        assert_on_every_rank(
            kernel,
            "cross_entropy",
            [logits, labels],
            specs,
            [TensorType(()), *[TensorType((batch,))] * lse_out],
            [out, *[specs[1]] * lse_out],
            {**attrs, "lse": lse_out},
            MESH,
            dtype,
            fixed,
        )
    for logits_spec in (specs[0], specs[0].replace("S(1)", "R")):  # vocab sharded, or not
        assert_on_every_rank(
            "cross_entropy_grad_sharded",
            "cross_entropy_grad",
            [logits, labels, dloss, lse],
            [logits_spec, specs[1], "RR", specs[1]],
            [TensorType(logits.shape)],
            [logits_spec],
            attrs,
            MESH,
            dtype,
            fixed,
        )


@DTYPES
@pytest.mark.parametrize("scale", [None, 0.5])
@pytest.mark.parametrize(("hkv", "q_spec"), [(4, "S(0)S(1)"), (2, "RS(1)"), (1, "S(1)S(1)")])
def test_attention_query_offset(dtype: type, scale: float | None, hkv: int, q_spec: str) -> None:
    q, k, v = (rng.standard_normal((2, 8, h, 4)) for h in (4, hkv, hkv))
    kv_spec = q_spec.replace("S(1)", "R")
    assert_on_every_rank(
        "attention_query_offset",
        "scaled_dot_product_attention",
        [q, k, v],
        [q_spec, kv_spec, kv_spec],
        [TensorType(q.shape)],
        [q_spec],
        {"causal": True, "scale": scale},
        MESH,
        dtype,
    )


@DTYPES
@pytest.mark.parametrize("causal", [True, False])
def test_masked_softmax_query_offset(dtype: type, causal: bool) -> None:
    x = rng.standard_normal((2, 4, 8, 8))
    for x_spec in ["S(1)S(2)", "RS(2)", "S(0)S(1)"]:
        assert_on_every_rank(
            "masked_softmax_query_offset",
            "masked_softmax",
            [x],
            [x_spec],
            [TensorType(x.shape)],
            [x_spec],
            {"scale": 0.3, "causal": causal},
            MESH,
            dtype,
        )


@DTYPES
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(
    ("mesh", "q_spec", "kv_spec"), [(LINE, "S(2)", "R"), (MESH, "S(1)S(2)", "RR")]
)
def test_attention_head_offset_kernels(
    dtype: type, causal: bool, mesh: Mesh, q_spec: str, kv_spec: str
) -> None:
    q, k, v, dy = (rng.standard_normal((2, 8, h, 4)) for h in (4, 2, 2, 4))
    attrs = {"causal": causal, "scale": None if causal else 0.4}
    assert_on_every_rank(
        "attention_head_offset",
        "scaled_dot_product_attention",
        [q, k, v],
        [q_spec, kv_spec, kv_spec],
        [TensorType(q.shape)],
        [q_spec],
        attrs,
        mesh,
        dtype,
    )
    if q_spec == "S(2)":  # the grad's rule shards the heads only
        partial = "P(sum)"
        assert_on_every_rank(
            "attention_grad_head_offset",
            "attention_grad",
            [q, k, v, dy],
            [q_spec, kv_spec, kv_spec, q_spec],
            [TensorType(q.shape), TensorType(k.shape), TensorType(v.shape)],
            [q_spec, partial, partial],
            attrs,
            mesh,
            dtype,
        )


@DTYPES
@pytest.mark.parametrize("rows", [5, 6, 3])  # on 4 ranks: 2, 2, 1, 0; 2, 2, 2, 0; 1, 1, 1, 0
def test_global_mean_kernels(dtype: type, rows: int) -> None:
    x, y = rng.standard_normal((rows, 4)), rng.standard_normal((rows, 4))
    assert_on_every_rank(
        "global_mean",
        "mean",
        [x],
        ["S(0)"],
        [TensorType((4,))],
        ["P(sum)"],
        {"dims": [0]},
        LINE,
        dtype,
    )
    assert_on_every_rank(
        "global_mean",
        "mse_loss",
        [x, y],
        ["S(0)", "S(0)"],
        [TensorType(())],
        ["P(sum)"],
        {},
        LINE,
        dtype,
    )


@DTYPES
@pytest.mark.parametrize("x_spec", ["S(0)S(1)", "S(1)S(0)", "S(2)S(2)", "RS(1)"])
@pytest.mark.parametrize(("p", "offset"), [(0.4, 0), (0.0, 3), (0.9, 1000)])
def test_dropout_global_index(dtype: type, x_spec: str, p: float, offset: int) -> None:
    x = rng.standard_normal((2, 6, 8))
    attrs = {"p": p, "seed": 77, "offset": offset}
    t = TensorType(x.shape)
    assert_on_every_rank(
        "dropout_global_index",
        "dropout",
        [x],
        [x_spec],
        [t, TensorType(x.shape, "bool")],
        [x_spec, x_spec],
        attrs,
        MESH,
        dtype,
    )


@pytest.mark.parametrize("seed", [0, 1, 77, -5, 2**40 + 3, 2**70])
@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.9])
@pytest.mark.parametrize(("shape", "offset"), [((1000,), 0), ((7, 9, 11), 12345), ((), 2**40)])
def test_dropout_mask_is_bit_identical(
    seed: int, p: float, shape: tuple[int, ...], offset: int
) -> None:
    torch_ops.load_torch()
    index = np.arange(int(np.prod(shape)), dtype=np.uint64).reshape(shape) + np.uint64(offset)
    want = keep_mask(index, seed, p)
    ranges = [(0, n) for n in shape]
    got = torch_dropout.keep_mask(torch_dropout.block_index(shape, ranges, "cpu") + offset, seed, p)
    assert got.dtype == torch.bool
    np.testing.assert_array_equal(got.numpy(), want)
    if p == 0.0:
        assert want.all()


@pytest.mark.parametrize("out_spec", ["RR", "S(0)R", "RS(1)", "S(0)S(0)"])
def test_replicated_kernel(out_spec: str) -> None:
    table = TensorType((8, 4))
    for r in MESH.ranks:
        ctx = _ctx(MESH, r, [], [], [table, table], [out_spec, out_spec])
        assert_torch_kernel_matches(
            "replicated", "rope_cache", [], {"seq": 8, "head_dim": 8}, ctx, np.float64
        )
        assert_torch_kernel_matches(
            "replicated",
            "fill",
            [],
            {"shape": [8, 4], "value": 2.5},
            _ctx(MESH, r, [], [], [table], [out_spec]),
            np.float64,
        )
    a, b = rng.standard_normal((4, 6)), rng.standard_normal((6, 4))
    for r in MESH.ranks:
        assert_torch_kernel_matches(
            "replicated",
            "matmul",
            [a, b],
            {},
            _ctx(
                MESH,
                r,
                [TensorType(a.shape), TensorType(b.shape)],
                ["RR", "RR"],
                [TensorType((4, 4))],
                [out_spec],
            ),
            np.float32,
        )


def test_which_ops_keep_their_numpy_kernel() -> None:
    t = TensorType((4, 4))
    partial = _ctx(MESH, 1, [t], ["RR"], [t], ["P(sum)R"])
    whole = _ctx(MESH, 1, [t], ["RR"], [t], ["RR"])
    assert torch_kernel("neg", "replicated", partial) is None  # to_local zeroes partial blocks
    assert torch_kernel("neg", "replicated", whole) is TORCH_KERNELS["replicated"]
    assert torch_kernel("opaque", "replicated", whole) is None
    assert torch_kernel("opaque", "default", whole) is None
    assert torch_kernel("opaque", "global_mean", whole) is None
    assert torch_kernel("neg", "no_such_kernel", whole) is None
    assert set(TORCH_KERNELS) <= set(KERNELS)
    assert set(KERNELS) - set(TORCH_KERNELS) == {"reshape_local", "shape_attr_local"}


LLAMA = {
    "layers": 2,
    "hidden": 64,
    "heads": 4,
    "kv_heads": 2,
    "ffn": 128,
    "vocab": 64,
    "seq": 8,
    "batch": 8,
    "dtype": "float32",
}
COVERED = {
    "cross_entropy/cross_entropy_vocab_parallel",
    "cross_entropy/cross_entropy_vocab_parallel+global_mean",
    "cross_entropy_grad/cross_entropy_grad_sharded",
    "embedding/embedding_vocab_parallel",
    "embedding_grad/embedding_grad_vocab_parallel",
    "fill/replicated",
    "rope_cache/replicated",
    "pack",
    "unpack",
    "dropout",
    "dropout/dropout_global_index",
    "scaled_dot_product_attention/attention_query_offset",
    "scaled_dot_product_attention/attention_head_offset",
    "attention_grad/attention_grad_head_offset",
}


@pytest.mark.parametrize(
    ("mesh", "templates"),
    [("tp=2", ["megatron_tp"]), ("dp=2,tp=2", ["dp", "megatron_tp", "sequence_parallel"])],
)
def test_llama_runs_the_rank_aware_kernels_as_torch_ops(mesh: str, templates: list[str]) -> None:
    pytest.importorskip("torch.distributed")
    from shardlab.models import build_model
    from shardlab.plan import build_plan
    from shardlab.runtime.verify import verify
    from shardlab.strategy import Strategy

    plan = build_plan(
        build_model("llama3-8b", LLAMA), Strategy.build(mesh, templates), optimizer="adamw"
    )
    kernels = {f"{op.kind}/{op.kernel}" for op in plan.program.ops}
    assert "embedding/embedding_vocab_parallel" in kernels  # the kernels are in the program
    report = verify(plan, backend="torch")
    assert report.ok, report.failed()[:3]
    counts = report.summary["torch_ops"]
    assert not COVERED & set(counts["numpy_kinds"]), counts["numpy_kinds"]
    assert counts["numpy"] == 0, counts["numpy_kinds"]
