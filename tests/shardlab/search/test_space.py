"""The search space: meshes kept and pruned with their reasons, schedules, leaner recipes."""

from __future__ import annotations

from shardlab.search.space import (
    HSDP,
    Candidate,
    Limits,
    Mesh3,
    ModelShape,
    base_candidates,
    every_candidate,
    hsdp_shard,
    leaner,
    meshes,
    schedules,
)

LLAMA_70B = ModelShape(layers=80, heads=64, kv_heads=8, batch=64)


def test_tensor_parallelism_stays_inside_a_node():
    space = meshes(LLAMA_70B, Limits(gpus=64, devices_per_node=8))
    assert space.meshes and all(m.tp <= 8 for m in space.meshes)
    assert all(m.pp * m.dp * m.tp == 64 for m in space.meshes)
    reasons = {p.what: p.reason for p in space.pruned}
    assert reasons["dp=4,tp=16"] == "tp=16 crosses nodes (8 GPUs per node)"
    assert Mesh3(64, 1, 1) in space.meshes  # 64 stages, 64 micro-batches of one sequence
    crossing = meshes(LLAMA_70B, Limits(gpus=64, devices_per_node=8, cross_node_tp=True))
    assert any(m.tp == 16 for m in crossing.meshes)


def test_limits_and_divisibility_name_their_reason():
    shape = ModelShape(layers=4, heads=6, kv_heads=6, batch=8)
    space = meshes(shape, Limits(gpus=16, devices_per_node=8, max_tp=2, min_dp=2))
    reasons = {p.what: p.reason for p in space.pruned}
    assert reasons["dp=4,tp=4"] == "tp=4 is above --max-tp 2"
    assert reasons["pp=8,tp=2"] == "dp=1 is below --min-dp 2"
    assert reasons["dp=16"] == "the global batch 8 does not split over dp=16"
    assert reasons["pp=16"] == "dp=1 is below --min-dp 2"
    shape = ModelShape(layers=4, heads=6, kv_heads=6, batch=8)
    space = meshes(shape, Limits(gpus=4, devices_per_node=8))
    assert {p.what: p.reason for p in space.pruned}["tp=4"] == (
        "tp=4 does not divide the 6 attention heads"
    )


def test_schedules_and_the_base_recipe():
    shape = ModelShape(layers=8, heads=8, kv_heads=8, batch=16)
    mesh = Mesh3(pp=2, dp=2, tp=2)
    plans = schedules(mesh, shape)
    assert ("1f1b", 2, None) in plans and ("interleaved", 2, 2) in plans
    assert all(m is not None and 8 % m == 0 for _, m, _ in plans)  # per replica batch 8
    first = base_candidates(mesh, ("1f1b", 4, None))
    assert [(c.dp_recipe, c.sequence_parallel) for c in first] == [
        ("dp", True), ("zero1", True), ("zero2", True), ("fsdp", True),
        ("dp", False), ("zero1", False), ("zero2", False), ("fsdp", False),
    ]  # fmt: skip
    base, without_sp = first[0], first[4]
    assert first[3].templates() == ["dp", "fsdp", "megatron_tp", "sequence_parallel"]
    assert base.templates() == ["dp", "megatron_tp", "sequence_parallel"]
    assert without_sp.templates() == ["dp", "megatron_tp"]
    assert base.options() == {"recompute": "none",
                              "pipeline": {"schedule": "1f1b", "microbatches": 4,
                                           "balance": "time"}}  # fmt: skip
    assert base.label() == "pp=2,dp=2,tp=2 dp+megatron_tp+sequence_parallel, 1f1b x4"
    assert schedules(Mesh3(1, 4, 2), shape) == [(None, None, None)]


def test_leaner_recipes_trade_time_for_memory_in_order():
    base = Candidate(Mesh3(1, 8, 1), "dp", False, "none")
    steps = [(c.recompute, c.microbatches) for c in leaner(base)]
    assert steps == [("selective", None)]
    shape = ModelShape(layers=8, heads=8, kv_heads=8, batch=32)  # 4 sequences per replica
    steps = [(c.recompute, c.microbatches) for c in leaner(base, shape)]
    assert steps == [("selective", None), ("none", 2)]
    accumulating = leaner(base, shape)[1]
    assert accumulating.strategy().mesh.axis_names == ("dp",)
    assert accumulating.strategy().accumulation == 2
    assert accumulating.label() == "dp=8 dp, 2 micro-batches accumulated"
    assert accumulating.to_json()["mesh"] == "dp=8"
    assert [c.microbatches for c in leaner(accumulating, shape)] == [2, 4]
    assert [c.microbatches for c in leaner(leaner(accumulating, shape)[1], shape)] == [4]
    assert leaner(Candidate(Mesh3(1, 1, 8), None, True, "full")) == []
    # with flash attention selective recomputation saves nothing: none goes straight to full
    fused = ModelShape(layers=8, heads=8, kv_heads=8, batch=32, fused_attention=True)
    assert [c.recompute for c in leaner(base, fused)] == ["full", "none"]


def test_hsdp_shards_within_a_node_and_replicates_across():
    """HSDP is tried where the data-parallel ranks span nodes: the states sharded over the
    ranks of one node (8 GPUs over tp), replicated across; as torchtitan's
    data_parallel_shard_degree / data_parallel_replicate_degree."""
    assert hsdp_shard(Mesh3(1, 64, 1), 8) == 8
    assert hsdp_shard(Mesh3(1, 16, 2), 8) == 4
    assert hsdp_shard(Mesh3(1, 4, 8), 8) is None  # one rank per node: that is dp
    assert hsdp_shard(Mesh3(2, 16, 1), 8) is None  # not tried with pipeline stages
    assert hsdp_shard(Mesh3(1, 8, 1), 8) is None  # all in one node: that is FSDP
    assert hsdp_shard(Mesh3(1, 12, 1), 8) is None  # 8 does not divide 12
    found = [c for c in base_candidates(Mesh3(1, 16, 2), (None, None, None), 8)
             if c.dp_recipe == HSDP]  # fmt: skip
    assert [c.sequence_parallel for c in found] == [True, False]
    c = found[0]
    assert c.mesh_text() == "dpr=4,dps=4,tp=2" and c.state_shards == 4
    assert c.templates() == ["dp:dpr", "fsdp:dps", "megatron_tp", "sequence_parallel"]
    assert c.label() == "dpr=4,dps=4,tp=2 dp:dpr+fsdp:dps+megatron_tp+sequence_parallel"
    strategy = c.strategy()
    assert strategy.mesh.axis_names == ("dpr", "dps", "tp")
    assert not [x for x in base_candidates(Mesh3(1, 16, 2), (None, None, None)) if x.shard]
    every = every_candidate(ModelShape(layers=4, heads=8, kv_heads=8, batch=32),
                            Limits(gpus=16, devices_per_node=8))  # fmt: skip
    assert {x.mesh_text() for x in every if x.dp_recipe == HSDP} == {
        "dpr=2,dps=8",
        "dpr=2,dps=4,tp=2",
        "dpr=2,dps=2,tp=4",
    }
