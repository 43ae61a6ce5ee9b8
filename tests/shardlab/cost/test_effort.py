"""Large meshes cost in time linear in their devices (the roles of a dp=2^16 mesh took minutes
when each rank's groups were walked), roles are the same partition as before, and the
estimate of a plan's build (`cost.effort`) tells a minute from hours."""

from __future__ import annotations

import dataclasses
import pickle
import time
from collections import Counter
from collections.abc import Hashable

import pytest

from shardlab.cost.clusters import load_cluster
from shardlab.cost.effort import _axis_alike, plan_effort, same_role_everywhere
from shardlab.cost.model import _roles, distinct_roles
from shardlab.mesh import Mesh
from shardlab.models import build_model
from shardlab.plan import build_plan
from shardlab.strategy import Strategy

TINY = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 256, "seq": 16}
MESHES = [
    Mesh.parse("dp=4,tp=8"),
    Mesh.parse("pp=2,dp=3,tp=4"),
    Mesh.parse("pp=3,dp=4,cp=2,tp=2"),
    Mesh.parse("pp=3,dp=4,cp=2,tp=2").submesh("pp", 1),
    Mesh.parse("a=5,b=7").submesh("b", 3),
    Mesh((2, 3), ("x", "y"), (5, 0, 3, 1, 4, 2)),
    Mesh.parse("dp=6,tp=5"),
    Mesh.parse("dp=1"),
    Mesh.parse("pp=2").submesh("pp", 1),  # no axes left: one rank
]


def _walked_roles(mesh: Mesh, per_node: int) -> list[list[int]]:
    """The ranks grouped by role as the cost model used to find them: every rank's group on
    every axis, walked rank by rank."""
    by_role: dict[Hashable, list[int]] = {}
    for rank in mesh.ranks:
        role = []
        for k in range(mesh.ndim):
            coord = list(mesh.coord(rank))
            group = [mesh.rank_at((*coord[:k], c, *coord[k + 1 :])) for c in range(mesh.shape[k])]
            role.append(tuple(sorted(Counter(r // per_node for r in group).values())))
        by_role.setdefault(tuple(role), []).append(rank)
    return sorted(by_role.values())


@pytest.mark.parametrize("mesh", MESHES, ids=str)
@pytest.mark.parametrize("per_node", [1, 2, 3, 4, 8, 16])
def test_roles_group_the_ranks_as_before(mesh: Mesh, per_node: int) -> None:
    by_role: dict[Hashable, list[int]] = {}
    for rank, role in _roles(mesh, per_node):
        by_role.setdefault(role, []).append(rank)
    assert sorted(by_role.values()) == _walked_roles(mesh, per_node)
    for rank in mesh.ranks:
        for k in range(mesh.ndim):
            coord = list(mesh.coord(rank))
            walked = [mesh.rank_at((*coord[:k], c, *coord[k + 1 :])) for c in range(mesh.shape[k])]
            assert mesh.group_of(rank, k) == tuple(walked)


def test_a_mesh_hashes_once_and_alike_in_every_process() -> None:
    mesh = Mesh.parse("dp=4,tp=2")
    again = pickle.loads(pickle.dumps(mesh))
    assert again == mesh and hash(again) == hash(mesh) == hash(Mesh.parse("dp=4,tp=2"))
    assert {mesh: "x"}[Mesh((4, 2), ("dp", "tp"))] == "x"
    assert mesh != Mesh.parse("a=4,b=2"), "the axis names still tell meshes apart"


def test_a_dp_2_16_plan_is_costed_in_seconds() -> None:
    """One role for all 65536 ranks: roles, groups and collectives are found in time linear
    in the devices (this took minutes: every rank walked its whole group)."""
    cluster = dataclasses.replace(load_cluster("h100-sxm-8x8"), nodes=10**9)
    model = build_model("llama3-8b", {**TINY, "batch": 1 << 16})
    started = time.perf_counter()
    plan = build_plan(model, Strategy.build("dp=65536", ["dp"]), cluster=cluster)
    assert time.perf_counter() - started < 30
    assert plan.cost is not None and plan.cost.devices == 65536
    assert plan.cost.timeline.rank_of_role[65535] == 0 and len(plan.cost.timeline.events) == 1


@pytest.mark.parametrize("per_node", [1, 2, 3, 4, 6, 8, 16])
def test_the_layout_never_claims_one_role_wrongly(per_node: int) -> None:
    for shape in [(2,), (6,), (16,), (2, 4), (4, 2), (3, 4), (8, 8), (3, 8), (8, 3), (4, 4, 2)]:
        mesh = Mesh(shape, tuple(f"a{i}" for i in range(len(shape))))
        shown = all(_axis_alike(mesh, k, per_node) for k in range(mesh.ndim))
        assert not shown or distinct_roles(mesh, per_node) == 1, (shape, per_node)
        assert same_role_everywhere(mesh, per_node) == (distinct_roles(mesh, per_node) == 1)


def test_the_estimate_tells_a_minute_from_hours() -> None:
    # llama3-70b (6819 training ops) on dp=2^20, nodes of 8: one role, about a minute
    uniform = plan_effort(6819, Mesh.parse("dp=1048576"), 8)
    assert not uniform.mixed_roles and 30 < uniform.seconds < 120
    # tp=2 groups straddle nodes of 3: every one of 32768 ranks is simulated, hours
    mixed = plan_effort(190, Mesh.parse("dp=16384,tp=2"), 3)
    assert mixed.mixed_roles and mixed.seconds > 3600
    assert "32768 devices" in mixed.describe() and "every rank is simulated" in mixed.describe()
    # not costed (no cluster): nothing is simulated
    assert not plan_effort(190, Mesh.parse("dp=4096,tp=2"), None).mixed_roles
    # a large mesh the layout cannot show to be uniform is taken as mixed
    assert not same_role_everywhere(Mesh.parse("dp=65537,tp=2"), 3)
