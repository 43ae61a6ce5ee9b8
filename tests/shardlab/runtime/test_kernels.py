"""Local kernels, each checked on every rank against an independent torch computation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from shardlab.errors import PlacementError
from shardlab.ir import TensorType
from shardlab.mesh import Mesh
from shardlab.ops import get_op
from shardlab.ops.base import Array
from shardlab.placement import DistSpec
from shardlab.runtime.distribute import assemble, distribute, to_local
from shardlab.runtime.kernels import (
    KERNELS,
    CollectiveRequest,
    LocalContext,
    cross_entropy_vocab_parallel,
)
from shardlab.runtime.sharded import run_sharded_op
from shardlab.spmd.result import RuleResult

MESH = Mesh((2, 2), ("dp", "tp"))
LINE = Mesh((4,), ("tp",))
rng = np.random.default_rng(11)


def spec(text: str, mesh: Mesh = MESH) -> DistSpec:
    return DistSpec.parse(text, mesh)


def run(
    kind: str,
    kernel: str,
    xs: Sequence[Array],
    types: Sequence[TensorType],
    in_specs: Sequence[str],
    out_types: Sequence[TensorType],
    out_specs: Sequence[str],
    attrs: dict[str, Any],
    mesh: Mesh = MESH,
) -> list[Array]:
    """Run `kernel` on every rank and assemble each output from its spec."""
    ins = tuple(spec(s, mesh) for s in in_specs)
    outs = tuple(spec(s, mesh) for s in out_specs)
    rule = RuleResult(ins, outs, "test", kernel=kernel)
    local = {r: [to_local(np.asarray(x), s, r) for x, s in zip(xs, ins, strict=True)]
             for r in mesh.ranks}  # fmt: skip
    blocks = run_sharded_op(kind, attrs, rule, types, out_types, local)
    return [
        assemble({r: np.asarray(blocks[r][j]) for r in mesh.ranks}, s, t.shape)
        for j, (t, s) in enumerate(zip(out_types, outs, strict=True))
    ]


def test_default_kernel_is_the_numpy_impl() -> None:
    a, b = rng.standard_normal((4, 6)), rng.standard_normal((6, 2))
    types = [TensorType((4, 6)), TensorType((6, 2))]
    (out,) = run("matmul", "default", [a, b], types, ["RR", "RR"], [TensorType((4, 2))],
                 ["RR"], {})  # fmt: skip
    np.testing.assert_allclose(out, a @ b, rtol=1e-13)


@pytest.mark.parametrize("out_spec", ["RR", "S(0)R", "RS(1)", "S(0)S(0)", "P(sum)S(0)"])
def test_replicated_kernel_keeps_each_ranks_block(out_spec: str) -> None:
    attrs = {"seq": 8, "head_dim": 8}
    table = TensorType((8, 4))
    angles = np.arange(8)[:, None] * 10000.0 ** (-2 * np.arange(4) / 8)
    cos, sin = run("rope_cache", "replicated", [], [], [], [table, table],
                   [out_spec, out_spec], attrs)  # fmt: skip
    np.testing.assert_allclose(cos, np.cos(angles), rtol=1e-13)
    np.testing.assert_allclose(sin, np.sin(angles), rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("table_spec", ["RS(0)", "S(0)S(0)", "S(0)S(1)", "S(1)S(0)", "P(sum)S(0)"])
@pytest.mark.parametrize("ids_dtype", [np.int64, np.int32])
def test_embedding_vocab_parallel_sums_to_the_lookup(table_spec: str, ids_dtype: type) -> None:
    table = rng.standard_normal((16, 4))
    # every block boundary of the table's rows, and the first and last row
    ids = np.array([[0, 3, 4, 7], [8, 11, 12, 15], [15, 0, 5, 5]], dtype=ids_dtype)
    to_out = {"R": "R", "S(0)": "P(sum)", "S(1)": "S(2)", "P(sum)": "P(sum)"}
    out = "".join(to_out[p] for p in _tokens(table_spec))
    types = [TensorType(ids.shape, np.dtype(ids_dtype).name), TensorType((16, 4))]
    (got,) = run("embedding", "embedding_vocab_parallel", [ids, table], types,
                 ["RR", table_spec], [TensorType((3, 4, 4))], [out], {})  # fmt: skip
    want = F.embedding(torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(table)).numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-15)


def test_embedding_vocab_parallel_block_with_no_ids_is_zero() -> None:
    ctx = LocalContext(LINE, 3, (TensorType((3,), "int64"), TensorType((8, 2))),
                       (TensorType((3, 2)),), (spec("R", LINE), spec("S(0)", LINE)),
                       (spec("P(sum)", LINE),))  # fmt: skip
    out = KERNELS["embedding_vocab_parallel"]("embedding", [np.array([0, 1, 5]),
                                              np.ones((2, 2))], {}, ctx)  # fmt: skip
    assert isinstance(out, list)
    np.testing.assert_array_equal(out[0], np.zeros((3, 2)))


def _torch_ce(logits: Array, labels: Array, reduction: str) -> float:
    x = torch.from_numpy(logits).reshape(-1, logits.shape[-1])
    y = torch.from_numpy(labels.astype(np.int64)).reshape(-1)
    return float(F.cross_entropy(x, y, reduction=reduction))


#: The loss is whole over the vocab axes: the kernel all-reduces the target logit too.
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize(
    ("logits_spec", "labels_spec", "out_spec"),
    [
        ("RS(1)", "RR", "RR"),
        ("S(1)S(1)", "RR", "RR"),
        ("S(0)S(1)", "S(0)R", "P({batch})R"),
        ("S(1)S(0)", "RS(0)", "RP({batch})"),
    ],
)
def test_cross_entropy_vocab_parallel_matches_torch(
    logits_spec: str, labels_spec: str, out_spec: str, reduction: str
) -> None:
    logits = rng.standard_normal((4, 8)) * 5
    labels = np.array([0, 1, 4, 7])  # both ends of every vocab block on two ranks
    types = [TensorType((4, 8)), TensorType((4,), "int64")]
    out = out_spec.format(batch="avg" if reduction == "mean" else "sum")
    (got,) = run("cross_entropy", "cross_entropy_vocab_parallel", [logits, labels], types,
                 [logits_spec, labels_spec], [TensorType(())], [out],
                 {"reduction": reduction})  # fmt: skip
    assert abs(float(got) - _torch_ce(logits, labels, reduction)) < 1e-12


def test_cross_entropy_vocab_parallel_requests_and_scalar_logits() -> None:
    """A rank-1 logits (one token) on 4 ranks; drive the generator by hand: the max, the
    sum of exponentials, the target logit (only the rank holding label 6 has it); every
    rank ends with the whole loss."""
    logits = rng.standard_normal(8) * 3
    label = np.array(6)
    specs = (spec("S(0)", LINE), spec("R", LINE))
    types = (TensorType((8,)), TensorType((), "int32"))
    gens = [
        cross_entropy_vocab_parallel(
            "cross_entropy",
            [to_local(logits, specs[0], r), label.astype(np.int32)],
            {},
            LocalContext(LINE, r, types, (TensorType(()),), specs, (spec("R", LINE),)),
        )
        for r in LINE.ranks
    ]
    first: list[CollectiveRequest] = [next(g) for g in gens]
    assert {(q.op, q.axes, np.shape(q.data)) for q in first} == {("max", ("tp",), ())}
    peak = np.max([q.data for q in first])
    second = [g.send(np.asarray(peak)) for g in gens]
    assert {(q.op, q.axes) for q in second} == {("sum", ("tp",))}
    total = np.sum([q.data for q in second])
    third = [g.send(np.asarray(total)) for g in gens]
    assert {(q.op, q.axes) for q in third} == {("sum", ("tp",))}
    assert [float(q.data) for q in third] == [0.0, 0.0, 0.0, logits[6]]  # blocks of 2
    target = np.sum([q.data for q in third])
    losses = []
    for g in gens:
        with pytest.raises(StopIteration) as stop:
            g.send(np.asarray(target))
        losses.append(float(stop.value.value[0]))
    want = _torch_ce(logits[None], label[None], "mean")
    assert max(abs(loss - want) for loss in losses) < 1e-12


def test_cross_entropy_vocab_parallel_keeps_float32() -> None:
    logits = rng.standard_normal((4, 8)).astype(np.float32)
    labels = np.array([1, 2, 5, 6])
    types = [TensorType((4, 8)), TensorType((4,), "int64")]
    ins, outs = (spec("S(1)", LINE), spec("R", LINE)), (spec("R", LINE),)
    rule = RuleResult(ins, outs, "test", kernel="cross_entropy_vocab_parallel")
    local = {r: [to_local(logits, ins[0], r), labels] for r in LINE.ranks}
    blocks = run_sharded_op("cross_entropy", {}, rule, types, [TensorType(())], local)
    assert {np.asarray(b[0]).dtype for b in blocks.values()} == {np.dtype(np.float32)}
    got = assemble({r: np.asarray(b[0]) for r, b in blocks.items()}, outs[0], ())
    assert abs(float(got) - _torch_ce(logits.astype(np.float64), labels, "mean")) < 1e-5


@pytest.mark.parametrize(
    ("hq", "hkv", "q_spec"),
    [
        (hq, hkv, q_spec)
        for hq, hkv in [(4, 4), (4, 2), (4, 1)]
        for q_spec in ["RS(1)", "S(1)S(1)", "S(0)S(1)", "S(1)S(2)"]
        if hkv > 1 or not q_spec.endswith("S(2)")  # one kv head cannot be split
    ],
)
def test_attention_query_offset_matches_torch_causal(hq: int, hkv: int, q_spec: str) -> None:
    b, s, d = 2, 8, 4
    q, k, v = (rng.standard_normal(shape) for shape in [(b, s, hq, d), (b, s, hkv, d),
                                                           (b, s, hkv, d)])  # fmt: skip
    kv_spec = "".join("S(2)" if p == "S(2)" else "S(0)" if p == "S(0)" else "R"
                      for p in _tokens(q_spec))  # fmt: skip
    types = [TensorType(x.shape) for x in (q, k, v)]
    for scale in (None, 0.5):
        attrs = {"causal": True, "scale": scale}
        (got,) = run("scaled_dot_product_attention", "attention_query_offset", [q, k, v], types,
                     [q_spec, kv_spec, kv_spec], [TensorType(q.shape)], [q_spec],
                     attrs)  # fmt: skip
        tq, tk, tv = (torch.from_numpy(x).transpose(1, 2) for x in (q, k, v))
        want = F.scaled_dot_product_attention(tq, tk, tv, is_causal=True, scale=scale,
                                              enable_gqa=True).transpose(1, 2)  # fmt: skip
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-12, atol=1e-12)


def _tokens(text: str) -> list[str]:
    return [str(p) for p in spec(text).placements]


def test_kernels_registry_names() -> None:
    assert set(KERNELS) >= {
        "default",
        "replicated",
        "embedding_vocab_parallel",
        "cross_entropy_vocab_parallel",
        "attention_query_offset",
    }


def test_distributed_partial_table_through_vocab_kernel_random_split() -> None:
    """A P(sum) table split at random on dp, vocab sharded on tp."""
    table, ids = rng.standard_normal((8, 2)), np.array([[0, 3, 4, 7]])
    ins = (spec("RR"), spec("P(sum)S(0)"))
    outs = (spec("P(sum)P(sum)"),)
    local: dict[int, list[Array]] = {r: [ids] for r in MESH.ranks}
    for r, block in distribute(table, ins[1], rng).items():
        local[r].append(block)
    rule = RuleResult(ins, outs, "test", kernel="embedding_vocab_parallel")
    types = [TensorType((1, 4), "int64"), TensorType((8, 2))]
    blocks = run_sharded_op("embedding", {}, rule, types, [TensorType((1, 4, 2))], local)
    got = assemble({r: np.asarray(b[0]) for r, b in blocks.items()}, outs[0], (1, 4, 2))
    np.testing.assert_allclose(got, table[ids], atol=1e-13)


@pytest.mark.parametrize("x_spec", ["S(0)S(1)", "S(1)S(0)", "S(2)S(2)", "RS(1)", "S(0)R"])
def test_dropout_global_index_builds_each_ranks_block_of_the_mask(x_spec: str) -> None:
    """Each rank computes exactly its part of the one-device mask, bit for bit."""
    x = rng.standard_normal((2, 6, 8))
    attrs = {"p": 0.4, "seed": 77}
    t = TensorType(x.shape)
    y, mask = run("dropout", "dropout_global_index", [x], [t], [x_spec],
                  [t, TensorType(x.shape, "bool")], [x_spec, x_spec], attrs)  # fmt: skip
    impl = get_op("dropout").numpy_impl
    assert impl is not None
    want_y, want_mask = impl([x], attrs)
    np.testing.assert_array_equal(mask, want_mask)
    np.testing.assert_array_equal(y, want_y)


def test_masked_softmax_query_offset_matches_torch_causal() -> None:
    x = rng.standard_normal((2, 4, 8, 8))
    t = TensorType(x.shape)
    for x_spec in ["RS(2)", "S(2)S(2)", "S(1)S(2)", "S(0)S(1)"]:
        (got,) = run("masked_softmax", "masked_softmax_query_offset", [x], [t], [x_spec], [t],
                     [x_spec], {"scale": 0.3, "causal": True})  # fmt: skip
        above = torch.ones(8, 8, dtype=torch.bool).triu(1)
        want = torch.softmax((torch.from_numpy(x) * 0.3).masked_fill(above, float("-inf")), -1)
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-12, atol=1e-12)


def test_a_max_over_an_empty_block_is_refused_naming_the_layout() -> None:
    """6 rows on 4 ranks are DTensor's 2, 2, 2, 0: the last rank has no row to take a max
    of. No rule splits a max that way; the kernel names the layout if asked anyway."""
    x = rng.standard_normal((6, 3))
    types, out = (TensorType((6, 3)),), (TensorType((3,)),)
    for r in LINE.ranks:
        ctx = LocalContext(LINE, r, types, out, (spec("S(0)", LINE),), (spec("P(max)", LINE),))
        block = to_local(x, ctx.input_specs[0], r)
        if r < 3:
            (got,) = KERNELS["default"]("max", [block], {"dims": [0]}, ctx)
            np.testing.assert_allclose(got, block.max(axis=0))
            continue
        with pytest.raises(PlacementError) as err:
            KERNELS["default"]("max", [block], {"dims": [0]}, ctx)
        assert err.value.message == (
            "cannot shard dim 0 of 'input 0 of max' (size 6) over mesh axes tp (4): DTensor's "
            "blocks (2 x3, 0) leave 1 rank(s) with an empty block, and a max over dims [0] "
            "has no value on an empty block"
        )
        # a max over the other dim of the empty block is fine: it has no rows to reduce
        rows = LocalContext(LINE, r, types, (TensorType((6,)),), ctx.input_specs,
                            (spec("S(0)", LINE),))  # fmt: skip
        (got,) = KERNELS["default"]("max", [block], {"dims": [1]}, rows)
        assert got.shape == (0,)
