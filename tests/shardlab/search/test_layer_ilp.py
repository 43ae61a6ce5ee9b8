"""The layer's integer program: it rediscovers Megatron tensor parallelism (with sequence
parallelism) where memory forces the weights apart, keeps what fits replicated where memory
allows, honours its memory limit, and says clearly when nothing fits."""

from __future__ import annotations

import pytest

from shardlab.cost.clusters import load_cluster
from shardlab.models import build_model
from shardlab.placement import Partial, Replicate, Shard
from shardlab.search.layer_ilp import LayerILPError, solve_layer

GIB = float(1 << 30)
COLUMN = ("attn.q_proj", "attn.k_proj", "attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
ROW = ("attn.o_proj", "mlp.down_proj")


def _layer(seq: int = 4096, batch: int = 1):
    """One Llama-3-8B layer at one sequence per replica (the batch cannot split over tp)."""
    return build_model("llama3-8b", {"layers": 1, "batch": batch, "seq": seq})


def test_memory_that_forces_sharding_rediscovers_megatron_with_sequence_parallelism():
    solution = solve_layer(_layer(), load_cluster("h100-sxm-1x8"), 8, 24 * GIB, layers=32)
    p = solution.placements
    for name in COLUMN:
        assert p[f"layers.0.{name}.weight"] == Shard(1), name
    for name in ROW:
        assert p[f"layers.0.{name}.weight"] == Shard(0), name
    assert p["layers.0.attn.sdpa"] == Shard(2)  # attention split by heads
    assert isinstance(p["layers.0.mlp.down_proj"], Partial)  # the row-parallel partial sum ...
    assert p["layers.0.mlp_residual"] == Shard(1)  # ... reduce-scattered onto the sequence
    assert p["layers.0.attn_norm.weight"] == Replicate()
    assert solution.memory_bytes * 32 <= 24 * GIB
    annotations = solution.annotations(_layer())
    assert "layers.*.attn.q_proj.weight=tp:S(1)" in annotations
    assert "layers.*.mlp.down_proj.weight=tp:S(0)" in annotations


def test_more_memory_lets_it_keep_weights_whole_and_it_gets_no_slower():
    cluster = load_cluster("h100-sxm-1x8")
    tight = solve_layer(_layer(seq=8192), cluster, 8, 24 * GIB, layers=32)
    loose = solve_layer(_layer(seq=8192), cluster, 8, 60 * GIB, layers=32)
    assert loose.seconds <= tight.seconds
    assert loose.memory_bytes > tight.memory_bytes
    assert any(p == Replicate() for n, p in loose.placements.items()
               if n.endswith("proj.weight"))  # fmt: skip


def test_a_limit_nothing_fits_in_names_the_least_memory():
    with pytest.raises(LayerILPError, match=r"no placement of 32 layers on tp=8 fits in 1\.0 GiB"):
        solve_layer(_layer(), load_cluster("h100-sxm-1x8"), 8, 1 * GIB, layers=32)


def test_a_graph_without_layers_is_refused():
    from shardlab.models import build_model as build

    graph = build("mlp_demo")
    with pytest.raises(LayerILPError, match=r"no ops in 'layers\.0'"):
        solve_layer(graph, load_cluster("h100-sxm-1x8"), 2, 80 * GIB)
