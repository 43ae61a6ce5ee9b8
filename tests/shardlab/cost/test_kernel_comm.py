"""A local kernel's own all-reduces: the table matches what the kernels ask for, and a
vocab-parallel cross entropy costs three all-reduces of one value per token over the ranks
holding a block of the vocabulary (max and sum of exp in float32, the target logit in the
logits' dtype) in forward, and none in backward (it reads the forward's log-sum-exp)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from shardlab.cost.clusters import Link, load_cluster
from shardlab.cost.compute import program_op_times
from shardlab.cost.kernel_comm import MIDOP_REDUCTIONS, midop_group, midop_seconds
from shardlab.ir import TensorType
from shardlab.mesh import Mesh
from shardlab.models import build_model
from shardlab.placement import DistSpec
from shardlab.plan import Plan, build_plan
from shardlab.program import DistOp
from shardlab.runtime.distribute import to_local
from shardlab.runtime.kernels import KERNELS, CollectiveRequest, LocalContext
from shardlab.strategy import Strategy

H100 = load_cluster("h100-sxm-8x8")
LAT, BW = 3e-6, 360e9  # h100-sxm NVLink ring: latency per step, bus bandwidth
LLAMA = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 256,
         "seq": 32, "batch": 8, "dtype": "float32"}  # fmt: skip
TOKENS = 8 * 32


def plan_on(mesh: str, templates: list[str]) -> Plan:
    graph = build_model("llama3-8b", LLAMA)
    return build_plan(graph, Strategy.build(mesh, templates, [], {}), cluster=H100)


def midop_ops(plan: Plan) -> list[DistOp]:
    return [op for op in plan.program.ops if op.kernel in MIDOP_REDUCTIONS]


def test_the_table_is_what_the_kernels_ask_for() -> None:
    """Each kernel of the table, driven on 4 ranks with its logits' vocab dim sharded,
    yields the all-reduces the table lists (its reductions, in order; one value per token,
    over the vocab axis), and none when the vocab is whole."""
    line = Mesh((4,), ("tp",))
    logits = np.random.default_rng(0).standard_normal((4, 8))
    labels = np.array([0, 3, 4, 7])
    for kernel, reductions in MIDOP_REDUCTIONS.items():
        kind = "cross_entropy_grad" if "grad" in kernel else "cross_entropy"
        requests = _requests(kernel, kind, line, "S(1)", logits, labels)
        assert [q.op for q in requests] == [op for op, _ in reductions], kernel
        assert all((q.axes, np.shape(q.data)) == (("tp",), (4,)) for q in requests), kernel
    assert [op for op, _ in MIDOP_REDUCTIONS["cross_entropy_vocab_parallel"]] == [
        "max", "sum", "sum"
    ]  # fmt: skip
    assert _requests("cross_entropy_grad_sharded", "cross_entropy_grad", line, "R",
                     logits, labels) == []  # fmt: skip


def _requests(
    kernel: str, kind: str, mesh: Mesh, logits_spec: str, logits: Any, labels: Any
) -> list[CollectiveRequest]:
    """Drive `kernel` on every rank of `mesh`, answering each request with its reduction;
    the first rank's requests."""
    specs = [DistSpec.parse(logits_spec, mesh), DistSpec.parse("R", mesh)]
    types = [TensorType(logits.shape), TensorType(labels.shape, "int64")]
    xs = [logits, labels]
    if kind == "cross_entropy_grad":  # dloss, and the log-sum-exp the forward kept
        specs += [DistSpec.parse("R", mesh)] * 2
        types += [TensorType(()), TensorType(labels.shape)]
        xs += [np.asarray(1.0), np.log(np.sum(np.exp(logits), axis=-1))]
    out_spec = DistSpec.parse("R" if kind == "cross_entropy" else logits_spec, mesh)
    out_type = TensorType(()) if kind == "cross_entropy" else types[0]
    gens: list[Iterator[Any]] = []
    for r in mesh.ranks:
        ctx = LocalContext(mesh, r, tuple(types), (out_type,), tuple(specs), (out_spec,))
        local = [to_local(np.asarray(x), s, r) for x, s in zip(xs, specs, strict=True)]
        out = KERNELS[kernel](kind, local, {"reduction": "mean"}, ctx)
        if isinstance(out, list):
            return []
        gens.append(out)
    seen: list[CollectiveRequest] = []
    answer: Any = None
    while True:
        try:
            asked = [g.send(answer) for g in gens]
        except StopIteration:
            return seen
        seen.append(asked[0])
        stack = np.stack([q.data for q in asked])
        answer = stack.max(axis=0) if asked[0].op == "max" else stack.sum(axis=0)


def ring(n: int, size: float) -> float:
    """An all-reduce of `size` bytes over a ring of `n` NVLink ranks."""
    return 2 * (n - 1) * LAT + 2 * (n - 1) / n * size / BW


def test_vocab_parallel_cross_entropy_costs_three_all_reduces_per_token_in_forward() -> None:
    plan = plan_on("tp=4", ["megatron_tp"])
    forward, backward = sorted(midop_ops(plan), key=lambda op: op.kind)
    assert (forward.kind, backward.kind) == ("cross_entropy", "cross_entropy_grad")
    size = TOKENS * 4  # one float32 per token (the model is float32: the target too)
    assert midop_seconds(plan.program, forward, H100) == pytest.approx(3 * ring(4, size))
    assert midop_seconds(plan.program, backward, H100) == 0.0


def test_the_target_logit_is_reduced_in_the_logits_dtype() -> None:
    """bf16 logits: max and sum of exp in float32 (4 bytes a token), the target 2 bytes."""
    graph = build_model("llama3-8b", {**LLAMA, "dtype": "bfloat16"})
    plan = build_plan(graph, Strategy.build("tp=4", ["megatron_tp"], [], {}), cluster=H100)
    (forward,) = [op for op in midop_ops(plan) if op.kind == "cross_entropy"]
    want = 2 * ring(4, TOKENS * 4) + ring(4, TOKENS * 2)
    assert midop_seconds(plan.program, forward, H100) == pytest.approx(want)


def test_the_op_time_carries_the_kernels_all_reduces() -> None:
    """A slower link's latency shows in the forward cross-entropy op's time, 3 x 2(n-1)
    steps of it, and in no other compute op (the backward issues none)."""
    plan = plan_on("tp=4", ["megatron_tp"])
    slow_link = Link(bandwidth=BW, latency=LAT + 1e-3)
    slow = dataclasses.replace(H100, intra_node=slow_link)
    before = program_op_times(plan.program, H100)
    after = program_op_times(plan.program, slow)
    grown = {name for name in before if after[name] != before[name]}
    assert grown == {op.name for op in midop_ops(plan) if op.kind == "cross_entropy"}
    for name in grown:
        assert after[name] - before[name] == pytest.approx(3 * 2 * 3 * 1e-3, rel=1e-9)


def test_the_group_is_the_vocab_axis_only() -> None:
    plan = plan_on("dp=2,tp=2", ["dp", "megatron_tp"])
    (op, *_) = midop_ops(plan)
    assert midop_group(plan.program, ("tp",), 0) == (0, 1)
    assert midop_group(plan.program, ("tp",), 2) == (2, 3)
    assert midop_group(plan.program, ("dp", "tp"), 0) == (0, 1, 2, 3)
    size = (TOKENS // 2) * 4  # the rank's half of the batch
    assert midop_seconds(plan.program, op, H100) == pytest.approx(3 * ring(2, size), rel=1e-12)


def test_plain_data_parallelism_has_no_kernel_all_reduces() -> None:
    plan = plan_on("dp=4", ["dp"])
    assert all(midop_seconds(plan.program, op, H100) == 0.0 for op in plan.program.ops)
