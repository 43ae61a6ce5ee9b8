"""Data-parallel passes (seed 002): scaling, fusion and overlap, checked numerically on the
simulated mesh against one device, structurally, and on the cost model."""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pytest

from shardlab.cost.clusters import load_cluster
from shardlab.cost.model import PlanCost, cost_program
from shardlab.ir import Graph, OpRole
from shardlab.models import build_model
from shardlab.ops import get_op
from shardlab.passes import data_parallel as dp
from shardlab.passes.data_parallel import (
    NO_SCALE_MESSAGE,
    PassOptionError,
    PassResult,
    dp_fuse_allreduce,
    dp_grad_scaling,
    dp_overlap,
    is_grad_all_reduce,
)
from shardlab.passes.dp_streams import is_local_step, waits_on_other_comm_stream
from shardlab.placement import Partial, Replicate, Shard
from shardlab.plan import Plan, build_plan
from shardlab.program import DistOp, DistProgram
from shardlab.runtime.verify import verify
from shardlab.strategy import Strategy

TINY = {"hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 64, "seq": 8, "batch": 8,
        "dtype": "float32"}  # fmt: skip
STRATEGIES = {"dp=4": ["dp"], "dp=2,tp=2": ["dp", "megatron_tp"]}
Pass = Callable[[DistProgram, Graph, Mapping[str, Any]], PassResult]


def _plan(mesh: str, layers: int, optimizer: str = "adamw") -> Plan:
    graph = build_model("llama3-8b", {**TINY, "layers": layers})
    return build_plan(
        graph, Strategy.build(mesh, STRATEGIES[mesh]), optimizer=optimizer, passes=False
    )


def _run(plan: Plan, *passes: tuple[Pass, dict[str, Any]]) -> tuple[DistProgram, list[PassResult]]:
    program, results = plan.program, []
    for fn, options in passes:
        results.append(fn(program, plan.training, options))
        program = results[-1].program
    return program, results


def _check_order(program: DistProgram) -> None:
    """Every dep and every input is made before its op (sources: values nobody makes)."""
    made = {v for op in program.ops for v in op.outputs}
    ready, seen = set(program.specs) - made, set[str]()
    for op in program.ops:
        assert set(op.deps) <= seen, (op.name, set(op.deps) - seen)
        assert set(op.inputs) <= ready, (op.name, set(op.inputs) - ready)
        seen.add(op.name)
        ready.update(op.outputs)
    assert len(seen) == len(program.ops)


def _snapshot(program: DistProgram) -> tuple[Any, ...]:
    return (list(program.ops), dict(program.types), dict(program.specs), dict(program.values))


# -- pack / unpack ------------------------------------------------------------------------


def test_pack_and_unpack_round_trip_whole_values_and_blocks() -> None:
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(s) for s in [(2, 3), (4,), (1, 2, 2)]]
    (buf,) = get_op("pack").numpy_impl([*xs], {})  # type: ignore[misc]
    expected = [float(v) for x in xs for v in x.flat]  # independent: element by element
    assert buf.shape == (14,) and buf.tolist() == expected
    attrs = {"shapes": [[4, 3], [8], [1, 2, 4]], "block_shapes": [[2, 3], [4], [1, 2, 2]]}
    back = get_op("unpack").numpy_impl([buf], attrs)  # type: ignore[misc]
    assert [b.tolist() for b in back] == [x.tolist() for x in xs]  # a block of a sharded bucket
    whole = get_op("unpack").numpy_impl([np.arange(28.0)], attrs)  # type: ignore[misc]
    assert [w.shape for w in whole] == [(4, 3), (8,), (1, 2, 4)]
    assert np.concatenate([w.ravel() for w in whole]).tolist() == list(range(28))


def test_pack_and_unpack_types_are_global() -> None:
    from shardlab.errors import OpSignatureError
    from shardlab.ir import TensorType
    from shardlab.ops import infer_types

    ts = [TensorType((4, 3)), TensorType((8,))]
    assert infer_types("pack", ts, {}) == [TensorType((20,))]
    assert infer_types("unpack", [TensorType((20,))], {"shapes": [[4, 3], [8]]}) == ts
    with pytest.raises(OpSignatureError, match="one dtype"):
        infer_types("pack", [TensorType((2,)), TensorType((2,), "bfloat16")], {})
    with pytest.raises(OpSignatureError, match="as many elements"):
        infer_types("unpack", [TensorType((19,))], {"shapes": [[4, 3], [8]]})


# -- dp_grad_scaling ----------------------------------------------------------------------


@pytest.mark.parametrize("mesh", list(STRATEGIES))
def test_lowered_plans_have_no_gradient_scale_ops(mesh: str) -> None:
    plan = _plan(mesh, 2)
    result = dp_grad_scaling(plan.program, plan.training, {})
    assert result.program is plan.program
    assert result.summary == {"scale_ops_before": 0, "scale_ops_after": 0,
                              "message": NO_SCALE_MESSAGE}  # fmt: skip


def _with_scales(
    plan: Plan, factor: float, before: int = 3, skip: int = 0, loss_scale: float | None = None
) -> DistProgram:
    """The plan with a `scale` by `factor` after each gradient all-reduce (before it for the
    first `before` of them; the last `skip` gradients get none), as another framework writes
    it. Without `loss_scale`, each rank's loss gradient divides by its own token count
    (Paddle: dp times too large after the all-reduce, hence factor 1/dp; with the vocab
    sharded the vocab-parallel kernel is needed, so a seed d(loss) of dp stands in for it);
    with it, the seed d(loss) is `loss_scale` (static loss scaling: factor 1/loss_scale)."""
    program = plan.program
    reduces = [op for op in program.ops if is_grad_all_reduce(op)]
    scaled = {op.name: i for i, op in enumerate(reduces[: len(reduces) - skip])}
    renamed: dict[str, str] = {}  # all-reduced gradient -> its scaled version
    ops: list[DistOp] = []
    types, specs = dict(program.types), dict(program.specs)
    vocab = any(
        _vocab_sharded(program, op) for op in program.ops if op.kind == "cross_entropy_grad"
    )
    if loss_scale is None and vocab:
        loss_scale = 1 / factor
    for op in program.ops:
        if op.kernel == "cross_entropy_grad_sharded" and loss_scale is None and not vocab:
            op = dataclasses.replace(op, kernel="default")
        if op.name == "loss.grad_seed" and loss_scale is not None:
            op = dataclasses.replace(op, attrs={**op.attrs, "value": loss_scale})
        op = dataclasses.replace(op, inputs=tuple(renamed.get(v, v) for v in op.inputs))
        i = scaled.get(op.name)
        if i is None:
            ops.append(op)
            continue
        x = op.inputs[0] if i < before else op.outputs[0]
        y = f"{x}*{factor:g}"
        types[y], specs[y] = types[x], specs[x]
        scale = DistOp(f"scale:{y}", "scale", (x,), (y,), "compute", OpRole.BACKWARD,
                       attrs={"factor": factor})  # fmt: skip
        if i < before:
            ops += [scale, dataclasses.replace(op, inputs=(y,))]
        else:
            ops += [op, scale]
            renamed[x] = y
    return DistProgram(program.mesh, _fix_deps(ops), types, specs, dict(program.values))


def _vocab_sharded(program: DistProgram, op: DistOp) -> bool:
    """Whether the logits `op` reads are sharded along the vocab (their last dim)."""
    logits = op.inputs[0]
    last = program.types[logits].rank - 1
    return any(isinstance(p, Shard) and p.dim == last for p in program.specs[logits].placements)


def _fix_deps(ops: list[DistOp]) -> list[DistOp]:
    """Deps = the producers of the inputs (how lowering sets them)."""
    made = {v: op.name for op in ops for v in op.outputs}
    return [
        dataclasses.replace(op, deps=tuple(sorted({made[v] for v in op.inputs if v in made})))
        for op in ops
    ]


@pytest.mark.parametrize("loss_scale", [None, 8.0])
@pytest.mark.parametrize("mesh", list(STRATEGIES))
def test_scale_ops_fold_into_the_loss_gradient_and_verify(
    mesh: str, loss_scale: float | None
) -> None:
    plan = _plan(mesh, 2)
    factor = 1 / (4 if mesh == "dp=4" else 2) if loss_scale is None else 1 / loss_scale
    handmade = _with_scales(plan, factor, loss_scale=loss_scale)
    _check_order(handmade)
    reduces = sum(is_grad_all_reduce(op) for op in handmade.ops)
    assert sum(op.kind == "scale" for op in handmade.ops) == reduces
    raw = verify(dataclasses.replace(plan, program=handmade))
    assert not raw.ok  # the loss or activation gradients are scaled before the fold ...
    assert all(c.ok for c in raw.checks if c.kind == "param")  # ... parameter updates are right
    before = _snapshot(handmade)
    result = dp_grad_scaling(handmade, plan.training, {})
    assert _snapshot(handmade) == before
    s = result.summary
    assert s["scale_ops_before"] == reduces and s["scale_ops_after"] == 0
    assert s["factors"] == [factor] and len(s["values"]) == reduces
    assert not any(op.kind == "scale" for op in result.program.ops)
    ops = {op.name: op for op in result.program.ops}
    if loss_scale is None and mesh == "dp=4":  # the per-rank mean becomes a global one
        assert s["folded_into"] == "loss.bwd0"
        assert ops["loss.bwd0"].kernel == "cross_entropy_grad_sharded"
    else:
        assert s["folded_into"] == "loss.grad_seed" and ops["loss.grad_seed"].attrs["value"] == 1
    assert s["message"].startswith(f"{reduces} scale ops folded into the loss gradient")
    print(f"\n{mesh}: {s['message']}")
    _check_order(result.program)
    report = verify(dataclasses.replace(plan, program=result.program))
    assert report.ok, report.failed()[:3]


def test_scale_ops_that_do_not_cover_every_gradient_are_kept() -> None:
    plan = _plan("dp=4", 1)
    partial = _with_scales(plan, 0.25, skip=1)
    result = dp_grad_scaling(partial, plan.training, {})
    assert result.program is partial and result.summary["scale_ops_after"] > 0
    assert "has 0 scale ops, not 1" in result.summary["message"]
    mixed = _with_scales(plan, 0.25)
    first = next(op for op in mixed.ops if op.kind == "scale")
    ops = [
        dataclasses.replace(op, attrs={"factor": 0.5}) if op is first else op for op in mixed.ops
    ]
    result = dp_grad_scaling(dataclasses.replace(mixed, ops=ops), plan.training, {})
    assert result.summary["message"].endswith("kept: the factors differ (0.25, 0.5)")


# -- dp_fuse_allreduce --------------------------------------------------------------------


def test_fusion_counts_on_a_four_layer_llama() -> None:
    plan = _plan("dp=4", 4)
    n = sum(op.kind == "adamw" for op in plan.program.ops)  # one gradient per parameter
    assert n == 4 * 9 + 3 == sum(is_grad_all_reduce(op) for op in plan.program.ops)
    before = _snapshot(plan.program)
    result = dp_fuse_allreduce(plan.program, plan.training, {})
    assert _snapshot(plan.program) == before
    s = result.summary
    cap = 25 * 2**20
    assert s["bucket_bytes"] == cap and s["all_reduces_before"] == n
    assert s["buckets"] == s["all_reduces_after"] <= math.ceil(s["gradient_bytes"] / cap) == 1
    assert s["message"].startswith(f"{n} all-reduces fused into 1")
    program = result.program
    _check_order(program)
    assert sum(is_grad_all_reduce(op) for op in program.ops) == 1
    assert [op.kind for op in program.ops].count("pack") == 1
    tiny = dp_fuse_allreduce(plan.program, plan.training, {"bucket_mb": 0.001}).summary
    assert tiny["buckets"] == n and tiny["message"].startswith(f"{n} all-reduces fused into {n}")
    print(f"\n4-layer llama, dp=4: {s['message']}; bucket_mb=0.001: {tiny['message']}")


def test_buckets_respect_the_cap_and_the_backward_order() -> None:
    plan = _plan("dp=4", 4)
    mb = 0.05
    result = dp_fuse_allreduce(plan.program, plan.training, {"bucket_mb": mb})
    s, cap = result.summary, int(0.05 * 2**20)
    buckets = s["bucket_list"]
    assert all(b["bytes"] <= cap or len(b["members"]) == 1 for b in buckets)
    # next-fit in a fixed order: two neighbouring buckets never fit into one
    assert len(buckets) <= 2 * s["gradient_bytes"] / cap + 1
    produced = [v for op in plan.program.ops for v in op.outputs]
    grads = [v for v in produced if v.endswith(".weight.grad")]
    assert [m for b in buckets for m in b["members"]] == grads  # backward order, all of them
    assert s["fused_buckets"] == sum(len(b["members"]) > 1 for b in buckets) > 0
    for op in result.program.ops:
        if op.kind == "all_reduce" and "bucket" in op.attrs:
            assert op.comm is not None and op.comm.axis == "dp" and op.stream == "comm:dp"
            bucket = next(b for b in buckets if b["name"] == op.attrs["bucket"])
            assert op.comm.bytes_per_rank == pytest.approx(2 * 3 / 4 * bucket["bytes"])
            assert op.attrs["members"] == bucket["members"] and op.attrs["consumer"] == "adamw"


def test_packed_buffers_follow_the_members_placements_off_the_reduced_axis() -> None:
    plan = _plan("dp=2,tp=2", 2)
    result = dp_fuse_allreduce(plan.program, plan.training, {})
    # embed / lm_head gradients are sliced on tp (a local step) right before their all-reduce;
    # the slice moves up to the gradient, so they join the other tp-sharded gradients
    assert result.summary["buckets"] == 2 and result.summary["all_reduces_before"] == 21
    program = result.program
    _check_order(program)
    packs = {op.outputs[0]: op for op in program.ops if op.kind == "pack"}
    seen = set()
    for buf, pack in packs.items():
        spec = program.specs[buf]
        tp = {program.specs[g].placements[1] for g in pack.inputs}
        assert spec.placements[0] == Partial("sum")
        assert spec.placements[1] == (
            Shard(0) if isinstance(next(iter(tp)), Shard) else Replicate()
        )
        assert all(isinstance(p, Shard) for p in tp) or tp == {Replicate()}
        assert program.types[buf].shape == (sum(program.types[g].numel for g in pack.inputs),)
        seen.add(spec.placements[1])
    assert seen == {Shard(0), Replicate()}  # column/row-parallel weights and the norms


@pytest.mark.parametrize("layers", [2, 4])
def test_realistic_bucket_counts_at_full_size(layers: int) -> None:
    plan = build_plan(
        build_model("llama3-8b", {"layers": layers}), Strategy.build("dp=8", ["dp"]), passes=False
    )
    s = dp_fuse_allreduce(plan.program, plan.training, {"bucket_mb": 40}).summary
    n = 9 * layers + 3  # every parameter gradient, the embedding's too (as DDP reduces it)
    assert s["all_reduces_before"] == n
    fused = [b["members"] for b in s["bucket_list"] if len(b["members"]) > 1]
    # float32 main gradients at 40 MiB: q/o (64 MiB), the MLP (224 MiB) and lm_head stand
    # alone; k and v (16 MiB each) share a bucket; a norm weight sits between two large ones
    assert s["buckets"] == n - layers and all(len(m) == 2 for m in fused)
    sizes = sorted({round(b["bytes"] / 2**20, 3) for b in s["bucket_list"]})
    print(f"\nllama3-8b, {layers} layers, dp=8: {s['message']}; bucket MiB {sizes}")


def test_bad_bucket_size_is_named() -> None:
    plan = _plan("dp=4", 1)
    for bad in (0, -1, "10", True):
        with pytest.raises(PassOptionError, match="bucket_mb must be a positive number"):
            dp_fuse_allreduce(plan.program, plan.training, {"bucket_mb": bad})


# -- dp_overlap ---------------------------------------------------------------------------


@pytest.mark.parametrize("fuse", [True, False])
def test_overlap_issues_all_reduces_right_after_their_last_gradient(
    fuse: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dp, "has_wait_kind", lambda: False)  # deps only (see the next test)
    plan = _plan("dp=2,tp=2", 2)
    start = dp_fuse_allreduce(plan.program, plan.training, {"bucket_mb": 0.05}).program
    start = start if fuse else plan.program
    before = _snapshot(start)
    result = dp_overlap(start, plan.training, {})
    assert _snapshot(start) == before
    program = result.program
    _check_order(program)
    assert sorted(op.name for op in program.ops) == sorted(op.name for op in start.ops)
    index = {op.name: i for i, op in enumerate(program.ops)}
    made_by = {v: op for op in start.ops for v in op.outputs}
    moved = {op.name for op in program.ops if dp._moves_up(op, plan.training)
             and not waits_on_other_comm_stream(op, made_by)}  # fmt: skip
    for op in program.ops:
        if op.name in moved:  # right after its last dep, give or take other moved ops
            last = max((index[d] for d in op.deps), default=-1)
            assert all(o.name in moved for o in program.ops[last + 1 : index[op.name]])
            on_compute = op.kind == "pack" or is_local_step(op)  # see passes.dp_streams
            assert op.stream == "compute" if on_compute else op.stream.startswith("comm:")
        if op.kind == "unpack":  # right before the first op that reads a member
            nxt = program.ops[index[op.name] + 1]
            assert set(nxt.inputs) & set(op.outputs) and op.name in nxt.deps
    s = result.summary
    assert s["moved"] > 0 and s["issued_during_backward_after"] > s["issued_during_backward_before"]
    assert s["wait"].startswith("deps") and "gradient comm ops moved up" in s["message"]


def test_overlap_inserts_wait_ops_once_the_kind_exists(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = _plan("dp=4", 2)
    fused = dp_fuse_allreduce(plan.program, plan.training, {"bucket_mb": 0.02}).program
    monkeypatch.setattr(dp, "has_wait_kind", lambda: True)
    result = dp_overlap(fused, plan.training, {})
    program = result.program
    _check_order(program)
    waits = [i for i, op in enumerate(program.ops) if op.kind == "wait"]
    reduces = [op for op in program.ops if is_grad_all_reduce(op)]
    assert len(waits) == len(reduces) and result.summary["wait"] == "wait ops"
    for i in waits:
        wait, reader = program.ops[i], program.ops[i + 1]
        assert (
            wait.stream == "compute" and not wait.outputs and set(wait.inputs) <= set(reader.inputs)
        )
        assert all(d.startswith("all_reduce:") for d in wait.deps)


# -- all together: numerics, hazards, cost ------------------------------------------------

PIPELINES: dict[str, list[tuple[Pass, dict[str, Any]]]] = {
    "scaling": [(dp_grad_scaling, {})],
    "fuse": [(dp_fuse_allreduce, {})],
    "fuse_small": [(dp_fuse_allreduce, {"bucket_mb": 0.02})],
    "overlap": [(dp_overlap, {})],
    "fuse+overlap": [(dp_fuse_allreduce, {"bucket_mb": 0.02}), (dp_overlap, {})],
    "all": [(dp_grad_scaling, {}), (dp_fuse_allreduce, {}), (dp_overlap, {})],
}


@pytest.mark.parametrize("pipeline", list(PIPELINES))
@pytest.mark.parametrize("mesh", list(STRATEGIES))
@pytest.mark.parametrize(("compute_dtype", "optimizer"), [("float64", "adamw"), ("float32", "sgd")])
def test_passes_verify_against_one_device(
    pipeline: str, mesh: str, compute_dtype: str, optimizer: str
) -> None:
    """float32 runs SGD: one AdamW step of a float32 run is off by ~1e-4 already as lowered
    (its update is about lr * sign(grad), and tiny gradients flip)."""
    plan = _plan(mesh, 2, optimizer)
    program, _ = _run(plan, *PIPELINES[pipeline])
    _check_order(program)
    report = verify(dataclasses.replace(plan, program=program), compute_dtype=compute_dtype)
    assert report.ok, report.failed()[:3]


@pytest.mark.parametrize("mesh", list(STRATEGIES))
def test_fused_and_overlapped_programs_have_no_async_hazards(mesh: str) -> None:
    hazards = pytest.importorskip("shardlab.runtime.hazards")
    if not hasattr(hazards, "check_hazards"):
        pytest.skip("the hazard checker is not there yet")
    plan = _plan(mesh, 2)
    program, _ = _run(plan, *PIPELINES["fuse+overlap"])
    assert hazards.check_hazards(program) == []


def _cost(plan: Plan, program: DistProgram, cluster: str) -> tuple[PlanCost, float]:
    """The cost, and when the last gradient all-reduce ends on rank 0."""
    cost = cost_program(program, plan.training, load_cluster(cluster))
    names = {op.name for op in program.ops if is_grad_all_reduce(op)}
    return cost, max(e.end for e in cost.timeline.events_of(0) if e.name in names)


@pytest.mark.parametrize(
    ("cluster", "dp_ranks", "optimizer", "hidden_before"),
    [
        ("h100-sxm-1x8", 8, "adamw", True),  # AdamW steps already hide the all-reduces
        ("h100-sxm-1x8", 8, "sgd", False),
        ("h100-sxm-8x8", 16, "adamw", False),  # two nodes: slower links
    ],
)
def test_fuse_and_overlap_cut_exposed_communication(
    cluster: str, dp_ranks: int, optimizer: str, hidden_before: bool
) -> None:
    graph = build_model("llama3-8b", {"layers": 2, "batch": dp_ranks})
    plan = build_plan(
        graph, Strategy.build(f"dp={dp_ranks}", ["dp"]), optimizer=optimizer, passes=False
    )
    program, results = _run(plan, (dp_fuse_allreduce, {}), (dp_overlap, {}))
    before, done_before = _cost(plan, plan.program, cluster)
    after, done_after = _cost(plan, program, cluster)
    exposed = [c.timeline.exposed_comm(0) for c in (before, after)]
    print(
        f"\n{cluster} dp={dp_ranks} {optimizer}: {results[0].summary['message']}; step "
        f"{before.step_time * 1e3:.3f} -> {after.step_time * 1e3:.3f} ms, exposed comm "
        f"{exposed[0] * 1e3:.3f} -> {exposed[1] * 1e3:.3f} ms, gradient sync done at "
        f"{done_before * 1e3:.3f} -> {done_after * 1e3:.3f} ms"
    )
    assert after.step_time <= before.step_time and exposed[1] <= exposed[0]
    assert done_after < done_before
    if not hidden_before:
        assert after.step_time < before.step_time and exposed[1] < exposed[0]


def test_passes_copy_rather_than_share_the_tables() -> None:
    plan = _plan("dp=4", 1)
    program = copy.copy(plan.program)
    for fn in (dp_fuse_allreduce, dp_overlap):
        result = fn(program, plan.training, {})
        assert result.program.ops is not program.ops
        assert result.program.types is not program.types
        assert result.program.values is not program.values
