"""A calibrated cluster's optional figures: `comm_scale` (per collective kind, a factor on its
time), `op_overhead` (seconds added to every op) and `straggle` (a fraction every compute op's
kernel time grows by). Absent, they change nothing (the GPU
presets' predictions stay what they were); present, they change exactly the times the
cluster documents; bad values are ClusterErrors naming the field."""

from __future__ import annotations

import dataclasses

import pytest

from shardlab.cost.clusters import Cluster, load_cluster
from shardlab.cost.comm import collective_time, comm_op_group, ring_time, step_time
from shardlab.cost.compute import program_op_times
from shardlab.errors import ClusterError
from shardlab.mesh import Mesh
from shardlab.models import build_model
from shardlab.placement import DistSpec
from shardlab.plan import build_plan
from shardlab.reshard import plan_transition
from shardlab.strategy import Strategy

H100 = load_cluster("h100-sxm-8x8")
TP = Mesh((8,), ("tp",))
S = 64 * 2**20
TINY = {"layers": 1, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 64, "seq": 16,
        "batch": 2}  # fmt: skip


def with_fields(cluster: Cluster, **fields: object) -> Cluster:
    return Cluster.from_json({**cluster.to_json(), **fields})


def test_presets_have_neither_and_explicit_defaults_predict_the_same_plan() -> None:
    assert H100.comm_scale == {} and H100.op_overhead == 0.0 and H100.straggle == 0.0
    assert not {"comm_scale", "op_overhead", "straggle"} & set(H100.to_json())
    same = with_fields(H100, comm_scale={}, op_overhead=0.0, straggle=0.0)
    assert same == H100
    graph = build_model("llama3-8b", TINY)
    strategy = Strategy.build("dp=2,tp=2", ["dp", "megatron_tp"])
    a = build_plan(graph, strategy, cluster="h100-sxm-1x8")
    b = build_plan(graph, strategy, cluster=dataclasses.replace(load_cluster("h100-sxm-1x8")))
    assert a.cost is not None and b.cost is not None
    assert a.cost.step_time == b.cost.step_time and a.cost.op_times == b.cost.op_times


def test_comm_scale_multiplies_only_its_kinds() -> None:
    scaled = with_fields(H100, comm_scale={"reduce_scatter": 3.0, "all_reduce": 0.5})
    group = tuple(range(8))  # one node: a flat ring on intra_node
    rs = ring_time("reduce_scatter", S, 8, H100.intra_node)
    assert collective_time("reduce_scatter", S, group, scaled) == pytest.approx(3 * rs)
    spread = tuple(range(0, 64, 4))  # 8 nodes, 2 ranks on each: hierarchical
    assert collective_time("all_reduce", S, spread, scaled) == pytest.approx(
        0.5 * collective_time("all_reduce", S, spread, H100)
    )
    for kind in ("all_gather", "all_to_all"):
        assert collective_time(kind, S, group, scaled) == collective_time(kind, S, group, H100)


def test_op_overhead_is_added_to_every_step_and_every_compute_op() -> None:
    overhead = 25e-6
    busy = with_fields(H100, op_overhead=overhead)
    group = comm_op_group(TP, 3, "tp")
    for src, dst in (("R", "S(1)"), ("S(0)", "R"), ("P(sum)", "R")):
        (step,) = plan_transition(
            (1024, 4096), "bfloat16", TP, DistSpec.parse(src, TP), DistSpec.parse(dst, TP)
        )
        assert step_time(step, group, busy) == pytest.approx(
            step_time(step, group, H100) + overhead
        )
    plan = build_plan(build_model("llama3-8b", TINY), Strategy.build("tp=2", ["megatron_tp"]))
    base = program_op_times(plan.program, H100)
    got = program_op_times(plan.program, busy)
    assert got.keys() == base.keys()
    assert all(got[k] == pytest.approx(base[k] + overhead) for k in base)
    assert any(base[k] == 0.0 for k in base)  # views cost the overhead alone
    assert load_cluster("cpu-local").op_overhead == 0.0


def test_straggle_stretches_each_compute_ops_kernel_time_not_its_overhead() -> None:
    overhead = 25e-6
    busy = with_fields(H100, op_overhead=overhead)
    late = with_fields(H100, op_overhead=overhead, straggle=0.25)
    plan = build_plan(build_model("llama3-8b", TINY), Strategy.build("dp=2", ["dp"]))
    base = program_op_times(plan.program, busy)
    got = program_op_times(plan.program, late)
    assert all(got[k] == pytest.approx(overhead + 1.25 * (base[k] - overhead)) for k in base)
    assert any(got[k] == pytest.approx(overhead) for k in base)  # a view: no kernel time


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"comm_scale": {"all_reduce": -1.0}}, "comm_scale.all_reduce"),
        ({"comm_scale": {"all_gather": 0}}, "comm_scale.all_gather"),
        ({"comm_scale": {"broadcast": 2.0}}, "comm_scale.broadcast"),
        ({"comm_scale": [2.0]}, "comm_scale"),
        ({"op_overhead": -1e-6}, "op_overhead"),
        ({"op_overhead": "fast"}, "op_overhead"),
        ({"op_overhead": float("inf")}, "op_overhead"),
        ({"straggle": -0.1}, "straggle"),
        ({"straggle": "late"}, "straggle"),
    ],
)
def test_bad_values_name_the_field(fields: dict[str, object], named: str) -> None:
    with pytest.raises(ClusterError) as err:
        with_fields(H100, **fields)
    assert err.value.detail["field"] == named
    assert all(part in str(err.value) for part in named.split("."))


def test_the_fields_round_trip_through_json() -> None:
    c = with_fields(H100, comm_scale={"all_gather": 2.5}, op_overhead=4e-5, straggle=0.2)
    assert c.to_json()["comm_scale"] == {"all_gather": 2.5} and c.to_json()["op_overhead"] == 4e-5
    assert c.to_json()["straggle"] == 0.2
    assert Cluster.from_json(c.to_json()) == c
