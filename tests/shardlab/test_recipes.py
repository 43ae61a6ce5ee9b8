"""Every named recipe against its published form (`shardlab.recipes`), at test shapes and at
the shapes people train at: collectives per layer (kind, count, bytes), per-rank FLOPs,
activation bytes per layer, no tensor-parallel weight ever gathered, FSDP's per-layer
gathers and reduce-scatters, and one device's numbers for each recipe."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import pytest

from shardlab.cost.compute import local_types, op_flops
from shardlab.cost.memory import memory_profile
from shardlab.ir import Graph, OpRole, ValueKind
from shardlab.models import build_model
from shardlab.plan import Plan, build_plan
from shardlab.recipes import Layer, activation_bytes, layer_collectives
from shardlab.runtime.verify import verify
from shardlab.strategy import Strategy

MATMULS = ("linear", "matmul", "scaled_dot_product_attention")
GPT = {"layers": 3, "hidden": 256, "heads": 8, "ffn": 1024, "vocab": 512, "seq": 64, "batch": 4,
       "dropout": 0.1}  # fmt: skip
LLAMA = {"layers": 3, "hidden": 256, "heads": 8, "kv_heads": 4, "ffn": 512, "vocab": 512,
         "seq": 64, "batch": 4}  # fmt: skip


def _plan(model: str, overrides: dict[str, Any], mesh: str, templates: list[str],
          recompute: str = "none") -> Plan:  # fmt: skip
    strategy = Strategy.build(mesh, templates, options={"recompute": recompute})
    return build_plan(build_model(model, overrides), strategy, passes=False)


def _layer(model: str, overrides: dict[str, Any], t: int) -> Layer:
    cfg = build_model(model, overrides).meta["config"]
    return Layer(
        "gpt" if model == "gpt" else "llama", cfg["seq"], cfg["batch"], cfg["hidden"],
        cfg["heads"], cfg["kv_heads"], cfg["ffn"], t, cfg["dropout"] > 0, cfg["attention"],
    )  # fmt: skip


def tp_collectives(plan: Plan, layer: str = "layers.1") -> dict[str, tuple[int, float]]:
    """Collectives on the tp axis that the ops of one layer asked for: kind -> (count,
    bytes per rank)."""
    count: Counter[str] = Counter()
    size: Counter[str] = Counter()
    for op in plan.program.ops:
        comm = op.comm
        if comm is None or comm.axis != "tp" or comm.bytes_per_rank == 0:
            continue
        if op.scope == layer or op.scope.startswith(f"{layer}."):
            count[op.kind] += 1
            size[op.kind] += comm.bytes_per_rank
    return {k: (count[k], size[k]) for k in count}


def gathered_weights(plan: Plan, axis: str = "tp") -> list[str]:
    """Parameters (or their optimizer state) some collective moves on `axis` (a local slice
    or a zero-padded partial moves nothing)."""
    training = plan.training
    out = []
    for op in plan.program.ops:
        if op.comm is None or op.comm.axis != axis or op.comm.bytes_per_rank == 0:
            continue
        value = training.values.get(str(op.attrs.get("value")))
        state = value is not None and value.kind in (ValueKind.PARAM, ValueKind.STATE)
        if state and training.producer(value.name) is None:
            out.append(op.name)
    return out


def layer_matmul_flops(graph: Graph, plan: Plan | None, layer: str = "layers.1") -> int:
    """Forward matmul FLOPs of one layer (biases left out): serial (plan None) or on one rank
    (local blocks)."""
    total = 0
    ops = graph.ops if plan is None else plan.program.ops
    for op in ops:
        if op.kind not in MATMULS or op.role != OpRole.FORWARD:
            continue
        if not op.scope.startswith(f"{layer}."):
            continue
        if plan is None:
            ins = [graph.type_of(v) for v in op.inputs]
            outs = [graph.type_of(v) for v in op.outputs]
        else:
            ins = local_types(plan.program, op.inputs)
            outs = local_types(plan.program, op.outputs)
        # the matmul only: a row-parallel bias is added once, after the partial sums meet
        total += op_flops(op.kind, ins[:2] if op.kind == "linear" else ins, outs, op.attrs)
    return total


CASES = [
    (model, overrides, t, sp, recompute)
    for (model, overrides), t, sp, recompute in itertools.product(
        [("gpt", GPT), ("gpt", {**GPT, "attention": "eager"}), ("llama3-8b", LLAMA),
         ("llama3-8b", {**LLAMA, "attention": "eager"})],
        [2, 4], [False, True], ["none", "selective", "full"],
    )
]  # fmt: skip


@pytest.mark.parametrize(("model", "overrides", "t", "sp", "recompute"), CASES)
def test_megatron_layers_match_the_recipe(
    model: str, overrides: dict[str, Any], t: int, sp: bool, recompute: str
) -> None:
    """Per layer: 2 all-reduces forward and 2 backward (tensor parallel), or 6 all-gathers
    and 4 reduce-scatters of the same activation (sequence parallel: the backward gathers
    the norm outputs again for the weight gradients); full recomputation replays the
    forward's. Activation bytes as Korthikanti et al.'s Table 2 (and the same accounting for
    Llama). Per-rank matmul FLOPs 1/t of the layer's, no weight ever gathered, attention
    sharded by heads (kv heads too: 4 kv heads divide t = 2 and 4)."""
    templates = ["megatron_tp", "sequence_parallel"] if sp else ["megatron_tp"]
    plan = _plan(model, overrides, f"tp={t}", templates, recompute)
    layer = _layer(model, overrides, t)
    want = layer_collectives(layer, sp, recompute)
    got = tp_collectives(plan)
    assert {k: n for k, (n, _) in got.items()} == {k: n for k, (n, _) in want.items()}
    for kind, (_, size) in want.items():
        assert got[kind][1] == pytest.approx(size, rel=1e-12)
    kept = memory_profile(plan.program, plan.training).kept_for_backward_by_scope["layers.1"]
    assert kept == activation_bytes(layer, sp, recompute)
    forward = plan.model
    assert layer_matmul_flops(forward, None) % t == 0
    plain = _plan(model, overrides, f"tp={t}", templates)  # the forward ops, not replays
    assert layer_matmul_flops(forward, plain) * t == layer_matmul_flops(forward, None)
    assert gathered_weights(plan) == []
    heads = "layers.1.attn.sdpa" if layer.attention == "flash" else "layers.1.attn.scores"
    out = plan.program.specs[plan.program.values[heads]].placements[0]
    assert str(out) == ("S(2)" if layer.attention == "flash" else "S(1)")


@pytest.mark.parametrize("attention", ["flash", "eager"])
@pytest.mark.parametrize("sp", [False, True])
def test_kv_heads_that_do_not_divide_keep_the_kv_projections_replicated(
    attention: str, sp: bool
) -> None:
    """2 kv heads on tp = 4: k and v projections replicated (noted in the plan), query heads
    sharded, weights never gathered, activation bytes as the recipe, numerics exact."""
    overrides = {**LLAMA, "kv_heads": 2, "attention": attention}
    templates = ["dp", "megatron_tp", "sequence_parallel"] if sp else ["dp", "megatron_tp"]
    plan = _plan("llama3-8b", overrides, "dp=2,tp=4", templates)
    notes = plan.summary()["notes"]
    assert any("2 kv heads do not divide over the 4 ranks of mesh axis 'tp'" in n for n in notes)
    assert str(plan.completed.specs["layers.1.attn.k_proj.weight"]) == "RR"
    assert str(plan.completed.specs["layers.1.attn.q_proj.weight"]) == "RS(1)"
    assert gathered_weights(plan) == []
    layer = _layer("llama3-8b", {**overrides, "batch": 2}, 4)
    kept = memory_profile(plan.program, plan.training).kept_for_backward_by_scope["layers.1"]
    assert kept == activation_bytes(layer, sp)
    strategy = Strategy.build("dp=2,tp=4", templates)
    assert verify(build_model("llama3-8b", overrides), strategy).ok


REALISTIC = {"seq": 8192, "batch": 8, "layers": 4}  # llama3-8b's own sizes otherwise


@pytest.mark.parametrize(("sp", "recompute"), [(False, "none"), (True, "none"),
                                               (True, "selective"), (True, "full")])  # fmt: skip
def test_llama3_8b_at_seq_8192_follows_the_recipe(sp: bool, recompute: str) -> None:
    """The shapes people train at (the small shapes once hid a degenerate plan): hidden 4096,
    seq 8192, batch 8, 32 heads and 8 kv heads on tp = 8."""
    templates = ["megatron_tp", "sequence_parallel"] if sp else ["megatron_tp"]
    plan = _plan("llama3-8b", REALISTIC, "tp=8", templates, recompute)
    layer = _layer("llama3-8b", REALISTIC, 8)
    want = layer_collectives(layer, sp, recompute)
    got = tp_collectives(plan)
    assert {k: n for k, (n, _) in got.items()} == {k: n for k, (n, _) in want.items()}
    for kind, (_, size) in want.items():
        assert got[kind][1] == pytest.approx(size, rel=1e-12)
    kept = memory_profile(plan.program, plan.training).kept_for_backward_by_scope
    assert kept["layers.1"] == activation_bytes(layer, sp, recompute)
    assert gathered_weights(plan) == []
    assert plan.completed.fallback_ops() == []


@pytest.mark.parametrize("template", ["fsdp", "zero3"])
def test_fsdp_gathers_each_layer_before_use_and_reduce_scatters_its_gradients(
    template: str,
) -> None:
    """Per layer and parameter: one all-gather in the forward and one again in the backward
    (the recipe reshards after forward), one reduce-scatter of its gradient; a gather waits
    for the first op of the layer before (one layer of prefetch); at most two layers'
    gathered parameters are live."""
    plan = build_plan(build_model("llama3-8b", {**LLAMA, "layers": 4}),
                      Strategy.build("dp=4", ["dp", template]))  # fmt: skip
    program, training = plan.program, plan.training
    params = [p.name for p in training.values_of_kind(ValueKind.PARAM)
              if p.name.startswith("layers.1.") and training.producer(p.name) is None]  # fmt: skip
    for p in params:
        gathers = [op for op in program.ops if op.kind == "all_gather" and op.attrs["value"] == p]
        assert [op.role for op in gathers] == [OpRole.COMM, OpRole.COMM]
        scatter = [op for op in program.ops if op.kind == "reduce_scatter"
                   and op.attrs["value"] == f"{p}.grad"]  # fmt: skip
        assert len(scatter) == 1
    first_of_layer0 = next(
        op.name for op in program.ops if op.comm is None and op.scope.startswith("layers.0")
    )
    layer1 = [op for op in program.ops if op.kind == "all_gather"
              and str(op.attrs["value"]).startswith("layers.1.")]  # fmt: skip
    assert first_of_layer0 in layer1[0].deps
    # gathered parameters are comm buffers, freed after their last use in each phase
    gathered = memory_profile(program, training).max_by_category["comm_buffers"]
    layer_params = sum(training.type_of(p).nbytes for p in params)
    assert layer_params < gathered <= 2 * layer_params


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize(
    ("mesh", "templates"),
    [
        ("dp=2,tp=2", ["dp", "megatron_tp"]),
        ("dp=2,tp=2", ["dp", "megatron_tp", "sequence_parallel"]),
        ("dp=4", ["dp", "fsdp"]),
        ("dp=4", ["dp", "zero1"]),
        ("dp=4", ["dp", "zero2"]),
        ("dp=2,tp=2", ["dp", "zero3", "megatron_tp", "sequence_parallel"]),
    ],
)
def test_every_recipe_matches_one_device(mesh: str, templates: list[str], recompute: str) -> None:
    small = {**GPT, "layers": 2, "hidden": 64, "heads": 4, "ffn": 128, "vocab": 128, "seq": 16,
             "attention": "eager"}  # fmt: skip
    strategy = Strategy.build(mesh, templates, options={"recompute": recompute})
    report = verify(build_model("gpt", small), strategy)
    assert report.ok, report.failed()[:3]
