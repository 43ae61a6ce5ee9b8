"""Communication time: flat rings match the latency-bandwidth formulas, the link follows where
the ranks sit, hierarchical collectives are the sum of their phases, and reshard steps cost
what their recovered message size costs."""

from __future__ import annotations

import pytest

from shardlab.cost.clusters import load_cluster
from shardlab.cost.comm import (
    FACTORS,
    STEPS,
    collective_time,
    comm_op_group,
    factor,
    link_for,
    ring_time,
    step_time,
    steps,
)
from shardlab.mesh import Mesh
from shardlab.placement import DistSpec
from shardlab.reshard import plan_transition

H100 = load_cluster("h100-sxm-8x8")
INTRA_BW, INTRA_LAT = 360e9, 3e-6  # h100-sxm NVLink4 ring busbw, latency per step
INTER_BW, INTER_LAT = 40e9, 6e-6  # h100-sxm NDR InfiniBand per GPU
S = 256 * 2**20  # a 256 MiB message
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


def expected_factor(kind: str, n: int) -> float:
    return {"all_reduce": 2 * (n - 1) / n, "send": 1.0, "recv": 1.0}.get(kind, (n - 1) / n)


def expected_steps(kind: str, n: int) -> int:
    return {"all_reduce": 2 * (n - 1), "send": 1, "recv": 1}.get(kind, n - 1)


def test_the_cluster_has_the_figures_these_tests_use() -> None:
    assert (H100.intra_node.bandwidth, H100.intra_node.latency) == (INTRA_BW, INTRA_LAT)
    assert (H100.inter_node.bandwidth, H100.inter_node.latency) == (INTER_BW, INTER_LAT)


@pytest.mark.parametrize("n", [2, 3, 4, 8, 64])
def test_factors_and_steps(n: int) -> None:
    for kind in (*KINDS, "send", "recv"):
        assert factor(kind, n) == FACTORS[kind](n) == expected_factor(kind, n)
        assert steps(kind, n) == STEPS[kind](n) == expected_steps(kind, n)
    for kind in ("local_slice", "local_partial"):
        assert factor(kind, n) == 0.0
        assert steps(kind, n) == 0
    assert factor("all_reduce", 4) == 1.5
    assert steps("all_reduce", 4) == 6


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("kind", KINDS)
def test_group_inside_one_node_is_a_flat_ring_on_nvlink(kind: str, n: int) -> None:
    group = tuple(range(8, 8 + n))  # ranks on node 1
    want = INTRA_LAT * expected_steps(kind, n) + expected_factor(kind, n) * S / INTRA_BW
    assert collective_time(kind, S, group, H100) == pytest.approx(want, rel=1e-12)


def test_all_reduce_on_one_full_node_in_numbers() -> None:
    # 14 steps of 3 us, and 2 * 7/8 * 256 MiB at 360 GB/s
    want = 14 * 3e-6 + 1.75 * 268435456 / 360e9
    assert collective_time("all_reduce", S, range(8), H100) == pytest.approx(want, rel=1e-12)
    assert want == pytest.approx(1.3469e-3, rel=1e-4)


@pytest.mark.parametrize("kind", [*KINDS, "send"])
def test_one_rank_per_node_is_a_flat_ring_on_infiniband(kind: str) -> None:
    for group in [(0, 8), (3, 11, 19, 27), tuple(range(5, 64, 8))]:
        n = len(group)
        want = INTER_LAT * expected_steps(kind, n) + expected_factor(kind, n) * S / INTER_BW
        assert collective_time(kind, S, group, H100) == pytest.approx(want, rel=1e-12)


def test_link_follows_where_the_ranks_sit() -> None:
    assert link_for(range(8), H100) is H100.intra_node
    assert link_for((8, 15), H100) is H100.intra_node
    assert link_for((0,), H100) is H100.intra_node
    assert link_for((0, 8), H100) is H100.inter_node
    assert link_for((7, 8), H100) is H100.inter_node
    inside = collective_time("all_reduce", S, (0, 1), H100)
    across = collective_time("all_reduce", S, (0, 8), H100)
    assert inside == pytest.approx(2 * INTRA_LAT + S / INTRA_BW, rel=1e-12)
    assert across == pytest.approx(2 * INTER_LAT + S / INTER_BW, rel=1e-12)
    assert across > 8 * inside


@pytest.mark.parametrize(
    ("group", "m", "k"), [((0, 1, 8, 9), 2, 2), (tuple(range(16)), 2, 8), (tuple(range(64)), 8, 8)]
)
def test_hierarchical_all_reduce_is_the_sum_of_its_three_phases(
    group: tuple[int, ...], m: int, k: int
) -> None:
    intra, inter = H100.intra_node, H100.inter_node
    parts = (
        ring_time("reduce_scatter", S, k, intra),
        ring_time("all_reduce", S / k, m, inter),
        ring_time("all_gather", S, k, intra),
    )
    assert parts[0] == pytest.approx(INTRA_LAT * (k - 1) + (k - 1) / k * S / INTRA_BW, rel=1e-12)
    assert parts[1] == pytest.approx(
        INTER_LAT * 2 * (m - 1) + 2 * (m - 1) / m * (S / k) / INTER_BW, rel=1e-12
    )
    assert parts[2] == pytest.approx(INTRA_LAT * (k - 1) + (k - 1) / k * S / INTRA_BW, rel=1e-12)
    total = collective_time("all_reduce", S, group, H100)
    assert total == pytest.approx(sum(parts), rel=1e-12)
    assert total < ring_time("all_reduce", S, m * k, inter)  # beats a flat ring over IB


def test_hierarchical_all_gather_and_reduce_scatter() -> None:
    group, m, k = tuple(range(64)), 8, 8
    gather = INTER_LAT * (m - 1) + (m - 1) / m * (S / k) / INTER_BW
    gather += INTRA_LAT * (k - 1) + (k - 1) / k * S / INTRA_BW
    assert collective_time("all_gather", S, group, H100) == pytest.approx(gather, rel=1e-12)
    scatter = INTRA_LAT * (k - 1) + (k - 1) / k * S / INTRA_BW
    scatter += INTER_LAT * (m - 1) + (m - 1) / m * (S / k) / INTER_BW
    assert collective_time("reduce_scatter", S, group, H100) == pytest.approx(scatter, rel=1e-12)


def test_all_to_all_and_uneven_groups_across_nodes_are_flat_on_infiniband() -> None:
    group = tuple(range(16))
    want = INTER_LAT * 15 + 15 / 16 * S / INTER_BW
    assert collective_time("all_to_all", S, group, H100) == pytest.approx(want, rel=1e-12)
    uneven = (0, 1, 2, 8)
    want = INTER_LAT * 6 + 1.5 * S / INTER_BW
    assert collective_time("all_reduce", S, uneven, H100) == pytest.approx(want, rel=1e-12)


def test_trivial_cases_cost_nothing() -> None:
    for kind in (*KINDS, "send", "local_slice", "local_partial"):
        assert collective_time(kind, S, (5,), H100) == 0.0
    for kind in ("local_slice", "local_partial"):
        assert collective_time(kind, S, range(8), H100) == 0.0
        assert collective_time(kind, S, (0, 8), H100) == 0.0
    with pytest.raises(ValueError, match="unknown communication kind 'broadcast'"):
        collective_time("broadcast", S, range(8), H100)


def test_cpu_local_gloo_pair() -> None:
    cpu = load_cluster("cpu-local")
    want = 3e-5 * 2 + 1.0 * 1e6 / 2e9
    assert collective_time("all_reduce", 1e6, (0, 1), cpu) == pytest.approx(want, rel=1e-12)


MESH = Mesh((8, 8), ("dp", "tp"))  # tp inside a node, dp across the 8 nodes
TP = Mesh((8,), ("tp",))  # the 8 GPUs of node 0


def test_comm_op_group_is_the_mesh_group() -> None:
    assert comm_op_group(MESH, 9, "tp") == tuple(range(8, 16))
    assert comm_op_group(MESH, 9, "dp") == tuple(range(1, 64, 8))


@pytest.mark.parametrize(
    ("src", "dst", "kind", "size"),
    [
        ("P(sum)", "R", "all_reduce", 1024 * 4096 * 2),  # the whole bf16 buffer
        ("S(0)", "R", "all_gather", 1024 * 4096 * 2),  # the gathered output
        ("P(sum)", "S(0)", "reduce_scatter", 1024 * 4096 * 2),  # the input before scattering
        ("S(0)", "S(1)", "all_to_all", 128 * 4096 * 2),  # each rank's block
        ("R", "S(1)", "local_slice", 0),
        ("S(0)", "P(sum)", "local_partial", 0),
    ],
)
def test_step_time_recovers_the_nccl_message_size(src: str, dst: str, kind: str, size: int) -> None:
    (step,) = plan_transition(
        (1024, 4096), "bfloat16", TP, DistSpec.parse(src, TP), DistSpec.parse(dst, TP)
    )
    assert step.kind == kind
    group = comm_op_group(TP, 3, "tp")
    want = INTRA_LAT * expected_steps(kind, 8) + expected_factor(kind, 8) * size / INTRA_BW
    if size == 0:
        want = 0.0
    assert step_time(step, group, H100) == pytest.approx(want, rel=1e-12)
    if size:
        recovered = step.bytes_per_rank / factor(kind, 8)
        assert recovered == pytest.approx(size, rel=1e-12)
        assert step_time(step, group, H100) == collective_time(kind, recovered, group, H100)


@pytest.mark.parametrize(
    ("src", "dst"),
    [
        ("RP(sum)", "RR"),
        ("P(sum)R", "RR"),
        ("S(0)S(1)", "RR"),
        ("RP(sum)", "RS(0)"),
        ("S(0)R", "RR"),
        ("RS(0)", "RS(1)"),
        ("RR", "S(0)S(1)"),
    ],
)
def test_step_time_of_every_planned_step_on_a_2d_mesh(src: str, dst: str) -> None:
    plan = plan_transition(
        (1024, 4096), "bfloat16", MESH, DistSpec.parse(src, MESH), DistSpec.parse(dst, MESH)
    )
    assert plan
    for step in plan:
        group = comm_op_group(MESH, 9, step.axis)
        f = factor(step.kind, len(group))
        if f == 0.0:
            assert step_time(step, group, H100) == 0.0
            continue
        size = step.bytes_per_rank / f
        assert step_time(step, group, H100) == collective_time(step.kind, size, group, H100)
        link = H100.intra_node if step.axis == "tp" else H100.inter_node
        assert link_for(group, H100) is link
        assert step_time(step, group, H100) == pytest.approx(
            ring_time(step.kind, size, 8, link), rel=1e-12
        )


def test_all_gather_across_nodes_in_numbers() -> None:
    (gather,) = plan_transition(
        (1024, 4096), "bfloat16", MESH, DistSpec.parse("S(0)R", MESH), DistSpec.parse("RR", MESH)
    )
    assert (gather.kind, gather.axis) == ("all_gather", "dp")
    dp = comm_op_group(MESH, 0, "dp")  # one rank per node
    output = 1024 * 4096 * 2
    assert step_time(gather, dp, H100) == pytest.approx(
        INTER_LAT * 7 + 7 / 8 * output / INTER_BW, rel=1e-12
    )


def test_step_time_on_a_mesh_axis_spanning_all_nodes_is_hierarchical() -> None:
    mesh = Mesh((64,), ("dp",))
    (step,) = plan_transition(
        (4096, 4096), "float32", mesh, DistSpec.parse("P(sum)", mesh), DistSpec.parse("R", mesh)
    )
    group = comm_op_group(mesh, 0, "dp")
    size = 4096 * 4096 * 4
    assert step_time(step, group, H100) == pytest.approx(
        collective_time("all_reduce", size, group, H100), rel=1e-12
    )
    assert step_time(step, group, H100) == pytest.approx(
        ring_time("reduce_scatter", size, 8, H100.intra_node)
        + ring_time("all_reduce", size / 8, 8, H100.inter_node)
        + ring_time("all_gather", size, 8, H100.intra_node),
        rel=1e-12,
    )
