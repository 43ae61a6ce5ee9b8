"""Folded completion (`spmd.folding`) gives exactly the unfolded results, with less work."""

from __future__ import annotations

import pytest

from shardlab.autodiff import training_graph
from shardlab.models import build_model
from shardlab.plan import build_plan
from shardlab.spmd.complete import complete
from shardlab.strategy import Strategy

LLAMA = {"layers": 5, "hidden": 128, "heads": 8, "kv_heads": 2, "ffn": 256, "vocab": 256,
         "seq": 32, "batch": 8}  # fmt: skip
GPT = {"layers": 5, "hidden": 64, "heads": 4, "vocab": 128, "seq": 16, "batch": 8}

CASES = [
    ("llama3-8b", LLAMA, "dp=2,tp=4", ["dp", "megatron_tp", "sequence_parallel"], {}),
    ("llama3-8b", LLAMA, "dp=2,tp=2", ["dp", "megatron_tp"], {"recompute": "selective"}),
    ("llama3-8b", LLAMA, "dp=2,tp=2", ["dp", "megatron_tp", "sequence_parallel"],
     {"recompute": "full"}),
    ("llama3-8b", LLAMA, "dp=8", ["fsdp"], {}),
    ("llama3-8b", LLAMA, "dp=4", ["zero1"], {}),
    ("gpt", GPT, "dp=2,tp=2", ["zero2", "megatron_tp", "sequence_parallel"], {}),
    ("gpt", GPT, "dp=4", ["zero3"], {}),
]  # fmt: skip


def _assert_same(graph, a, b):
    for v in graph.values:
        assert a.specs[v] == b.specs[v], v
        assert a.decisions[v] == b.decisions[v], v
    for op in graph.ops:
        assert a.rules[op.name] == b.rules[op.name], op.name
        assert a.arriving[op.name] == b.arriving[op.name], op.name
    assert a.reshards() == b.reshards()
    assert a.fallback_ops() == b.fallback_ops()
    assert a.notes() == b.notes()


@pytest.mark.parametrize(("preset", "config", "mesh", "templates", "options"), CASES)
def test_folded_completion_equals_unfolded(preset, config, mesh, templates, options):
    graph = training_graph(build_model(preset, config), recompute=options.get("recompute", "none"))
    strategy = Strategy.build(mesh, templates, options=options)
    folded = complete(graph, strategy)
    plain = complete(graph, strategy, fold=False)
    _assert_same(graph, folded, plain)
    # the middle layers' forward, backward and optimizer bodies fold onto a twin
    assert folded.folded_segments >= 3
    assert plain.folded_segments == 0


def test_an_annotation_on_one_layer_keeps_that_layer_apart():
    graph = training_graph(build_model("llama3-8b", LLAMA))
    strategy = Strategy.build(
        "dp=2,tp=2", ["dp", "megatron_tp"], ["layers.2.mlp.up_proj.weight=RR"]
    )
    folded = complete(graph, strategy)
    _assert_same(graph, folded, complete(graph, strategy, fold=False))
    assert str(folded.specs["layers.2.mlp.up_proj.weight"]) == "RR"
    assert str(folded.specs["layers.3.mlp.up_proj.weight"]) == "RS(1)"


def test_folded_decisions_name_their_own_layer():
    graph = training_graph(build_model("llama3-8b", LLAMA))
    done = complete(graph, Strategy.build("dp=2,tp=2", ["dp", "megatron_tp"]))
    assert done.folded_segments > 0
    for d in done.decisions["layers.3.mlp.gated"]:
        if d.op is not None:
            assert d.op.startswith("layers.3.")


@pytest.mark.parametrize(
    ("mesh", "templates", "options"),
    [
        ("dp=4", ["dp"], {}),
        ("dp=2,tp=2", ["dp", "megatron_tp", "sequence_parallel"], {}),
        ("dp=4", ["fsdp"], {}),
        ("pp=2,tp=2", ["megatron_tp"], {"pipeline": {"schedule": "gpipe", "microbatches": 4}}),
        ("pp=2,tp=2", ["megatron_tp"], {"pipeline": {"schedule": "1f1b", "microbatches": 4}}),
        ("pp=2,dp=2", ["dp"], {"pipeline": {"schedule": "interleaved", "microbatches": 4,
                                             "virtual_stages": 2, "balance": "even"}}),
    ],
)  # fmt: skip
def test_folded_plan_equals_unfolded_plan(mesh, templates, options):
    model = build_model("llama3-8b", {**LLAMA, "layers": 4})
    strategy = Strategy.build(mesh, templates, options=options)
    a = build_plan(model, strategy, cluster="h100-sxm-1x8")
    b = build_plan(model, strategy, cluster="h100-sxm-1x8", fold=False)
    rep = a.summary()["repetition"]
    assert rep["layers"] == 4 and rep["folded"] == a.completed.folded_segments > 0
    assert rep["distinct_bodies"] < rep["layer_segments"]
    assert b.summary()["repetition"]["folded"] == 0
    cost_a = a.cost or a.pipeline.cost
    cost_b = b.cost or b.pipeline.cost
    assert cost_a.step_time == cost_b.step_time
    assert cost_a.peak_memory_bytes == cost_b.peak_memory_bytes
    assert a.collectives_by_kind() == b.collectives_by_kind()
    assert a.program.comm_bytes_per_rank() == b.program.comm_bytes_per_rank()
