"""Costing a lowered plan: timeline, memory, MFU and throughput from the parts."""

from __future__ import annotations

import pytest

from shardlab.cost.clusters import load_cluster
from shardlab.cost.comm import step_time
from shardlab.cost.compute import hardware_flops, model_flops, peak_for, program_op_times
from shardlab.cost.model import cost_program, role_of_ranks, tokens_per_step
from shardlab.errors import ClusterError
from shardlab.models import build_model
from shardlab.plan import build_plan
from shardlab.strategy import Strategy

SMALL = {"layers": 2}
TP = ["dp", "megatron_tp", "sequence_parallel"]


def test_step_time_mfu_and_tokens_follow_from_the_timeline() -> None:
    plan = build_plan(build_model("llama3-8b", SMALL), Strategy.build("dp=8,tp=8", TP),
                      cluster="h100-sxm-8x8")  # fmt: skip
    cost = plan.cost
    assert cost is not None
    cluster = load_cluster("h100-sxm-8x8")
    compute = program_op_times(plan.program, cluster)
    # the timeline never beats the sum of one rank's compute, nor its comm on one stream
    assert cost.step_time >= sum(compute.values()) - 1e-12
    # compute overlapped by comm is stretched by the cluster's overlap slowdown, no more
    busy = cost.timeline.compute_time(0)
    assert sum(compute.values()) <= busy <= sum(compute.values()) * (1 + cluster.overlap_slowdown)
    flops = model_flops(plan.training)
    assert cost.model_flops == flops
    assert cost.mfu == pytest.approx(flops / (cost.step_time * 64 * peak_for(cluster, "bfloat16")))
    # hardware FLOPs add what the backward recomputes (flash attention's scores): HFU > MFU
    assert cost.hardware_flops == hardware_flops(plan.training) > flops
    assert cost.hfu == pytest.approx(cost.mfu * cost.hardware_flops / flops)
    assert cost.tokens == tokens_per_step(plan.model) > 0
    assert cost.tokens_per_second == pytest.approx(cost.tokens / cost.step_time)
    # every comm op is timed with the link its group sits on
    mesh = plan.program.mesh
    for op in plan.program.ops:
        if op.comm is not None:
            want = step_time(op.comm, mesh.group_of(0, op.comm.axis), cluster)
            assert cost.op_times[op.name] == pytest.approx(want)


def test_tp_inside_a_node_and_dp_across_nodes_give_one_role() -> None:
    model = build_model("llama3-8b", {"layers": 1, "batch": 64})
    plan = build_plan(model, Strategy.build("dp=64,tp=8", TP))
    roles = role_of_ranks(plan.program, load_cluster("h100-sxm-64x8"))
    assert len(set(roles.values())) == 1
    # per axis, (ranks on a node, nodes holding that many): dp one rank on each of 64 nodes,
    # tp 8 ranks on one node
    assert roles[0] == (((1, 64),), ((8, 1),))


def test_a_mesh_larger_than_the_cluster_is_refused_by_name() -> None:
    plan = build_plan(build_model("llama3-8b", SMALL), Strategy.build("dp=2,tp=8", TP))
    with pytest.raises(ClusterError, match="16 devices but cluster 'h100-sxm-1x8' has 8"):
        cost_program(plan.program, plan.training, load_cluster("h100-sxm-1x8"))


def test_more_tensor_parallelism_costs_more_communication_per_token() -> None:
    model = build_model("llama3-8b", SMALL)
    dp = build_plan(model, Strategy.build("dp=8", ["dp"]), cluster="h100-sxm-1x8").cost
    tp = build_plan(model, Strategy.build("tp=8", TP[1:]), cluster="h100-sxm-1x8").cost
    assert dp is not None and tp is not None
    assert tp.timeline.comm_time(0) > 0 and dp.timeline.comm_time(0) > 0
    # tp=8 splits each layer's weights: model state per rank shrinks 8x for the layers
    assert tp.memory.model_state["parameters"] < dp.memory.model_state["parameters"]
