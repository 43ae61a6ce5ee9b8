import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from shardlab.cli import app
from shardlab.errors import MeshError
from shardlab.mesh import MAX_MESH_AXES, MAX_MESH_DEVICES, Mesh, check_mesh_size


def test_default_layout_and_sizes() -> None:
    mesh = Mesh((2, 4), ("dp", "tp"))
    assert mesh.ranks == (0, 1, 2, 3, 4, 5, 6, 7)
    assert (mesh.ndim, mesh.size) == (2, 8)
    assert mesh.axis_index("tp") == 1
    assert mesh.axis_size("dp") == 2
    assert mesh.axis_size(1) == 4
    assert mesh == Mesh((2, 4), ("dp", "tp"), tuple(range(8)))
    assert hash(mesh) == hash(Mesh((2, 4), ("dp", "tp")))


def test_sequences_are_normalised_to_tuples() -> None:
    mesh = Mesh([2, 2], ["dp", "tp"], [3, 2, 1, 0])  # type: ignore[arg-type]
    assert mesh.shape == (2, 2)
    assert mesh.axis_names == ("dp", "tp")
    assert mesh.ranks == (3, 2, 1, 0)


def test_coords_2x4() -> None:
    mesh = Mesh((2, 4), ("dp", "tp"))
    assert [mesh.coord(r) for r in mesh.ranks] == [
        (0, 0),
        (0, 1),
        (0, 2),
        (0, 3),
        (1, 0),
        (1, 1),
        (1, 2),
        (1, 3),
    ]
    assert mesh.rank_at((1, 2)) == 6
    assert mesh.rank_at((0, 3)) == 3


def test_groups_2x4() -> None:
    mesh = Mesh((2, 4), ("dp", "tp"))
    assert mesh.groups("dp") == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert mesh.groups("tp") == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert mesh.groups(0) == mesh.groups("dp")
    assert mesh.group_of(6, "dp") == (2, 6)
    assert mesh.group_of(6, "tp") == (4, 5, 6, 7)


def test_groups_2x2x2() -> None:
    mesh = Mesh((2, 2, 2), ("pp", "dp", "tp"))
    assert mesh.coord(5) == (1, 0, 1)
    assert mesh.rank_at((0, 1, 1)) == 3
    assert mesh.groups("pp") == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert mesh.groups("dp") == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert mesh.groups("tp") == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert mesh.group_of(7, "dp") == (5, 7)


def test_explicit_ranks() -> None:
    mesh = Mesh((2, 2), ("dp", "tp"), (10, 11, 12, 13))
    assert mesh.coord(12) == (1, 0)
    assert mesh.rank_at((0, 1)) == 11
    assert mesh.groups("dp") == [(10, 12), (11, 13)]
    assert mesh.groups("tp") == [(10, 11), (12, 13)]


def test_submesh() -> None:
    mesh = Mesh((2, 4), ("dp", "tp"))
    stage = mesh.submesh("dp", 1)
    assert (stage.shape, stage.axis_names, stage.ranks) == ((4,), ("tp",), (4, 5, 6, 7))
    assert mesh.submesh("tp", 2).ranks == (2, 6)

    cube = Mesh((2, 2, 2), ("pp", "dp", "tp"))
    stage1 = cube.submesh("pp", 1)
    assert (stage1.shape, stage1.axis_names, stage1.ranks) == ((2, 2), ("dp", "tp"), (4, 5, 6, 7))
    assert stage1.groups("dp") == [(4, 6), (5, 7)]
    middle = cube.submesh("dp", 1)
    assert (middle.axis_names, middle.ranks) == (("pp", "tp"), (2, 3, 6, 7))
    assert cube.submesh("tp", 0).ranks == (0, 2, 4, 6)
    assert stage1.submesh("tp", 1).ranks == (5, 7)


def test_submesh_to_single_device() -> None:
    single = Mesh((4,), ("pp",)).submesh("pp", 2)
    assert (single.shape, single.axis_names, single.ranks) == ((), (), (2,))
    assert single.coord(2) == ()
    assert single.rank_at(()) == 2


def test_text_form() -> None:
    mesh = Mesh.parse("dp=2,tp=4")
    assert mesh == Mesh((2, 4), ("dp", "tp"))
    assert str(mesh) == "dp=2,tp=4"
    assert Mesh.parse(" dp = 2 , tp=4 ") == mesh
    assert str(Mesh((2, 2, 2), ("pp", "dp", "tp"))) == "pp=2,dp=2,tp=2"


def test_json_round_trip() -> None:
    mesh = Mesh((2, 2), ("dp", "tp"), (3, 1, 2, 0))
    data = mesh.to_json()
    assert data == {"shape": [2, 2], "axis_names": ["dp", "tp"], "ranks": [3, 1, 2, 0]}
    assert Mesh.from_json(data) == mesh
    assert Mesh.from_json({"shape": [2], "axis_names": ["dp"]}) == Mesh((2,), ("dp",))


@pytest.mark.parametrize(
    ("data", "needles"),
    [
        ({"axis_names": ["dp"]}, ["shape"]),
        ({"shape": [2], "axis_names": ["dp"], "devices": [0, 1]}, ["devices"]),
        ({"shape": 2, "axis_names": ["dp"]}, ["shape", "sequence"]),
    ],
)
def test_from_json_errors(data: dict[str, object], needles: list[str]) -> None:
    with pytest.raises(MeshError) as err:
        Mesh.from_json(data)
    for needle in needles:
        assert needle in err.value.message


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (((2, 0), ("dp", "tp")), ["'tp'", "size 0", "positive"]),
        (((2, -1), ("dp", "tp")), ["'tp'", "size -1"]),
        (((2, 2.5), ("dp", "tp")), ["'tp'", "2.5"]),
        (((2, True), ("dp", "tp")), ["'tp'", "True"]),
        (((2, 4), ("dp",)), ["2 axes", "1 axis names", "dp"]),
        (((2, 4), ("dp", "dp")), ["duplicate", "'dp'"]),
        (((2, 4), ("dp", "")), ["''", "identifier"]),
        (((2, 4), ("dp", "t-p")), ["'t-p'", "identifier"]),
        (((2, 2), ("dp", "tp"), (0, 1, 2)), ["4 positions", "3 ranks"]),
        (((2, 2), ("dp", "tp"), (0, 1, 1, 2)), ["rank 1", "twice"]),
        (((2, 2), ("dp", "tp"), (0, 1, -2, 3)), ["-2", "non-negative"]),
    ],
)
def test_construction_errors(args: tuple[object, ...], needles: list[str]) -> None:
    with pytest.raises(MeshError) as err:
        Mesh(*args)  # type: ignore[arg-type]
    assert err.value.code == "invalid_mesh"
    for needle in needles:
        assert needle in err.value.message, err.value.message


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("", ["empty"]),
        ("dp=2,,tp=4", ["''", "entry 1"]),
        ("dp2", ["'dp2'", "name=size"]),
        ("dp=x", ["'x'", "'dp=x'"]),
        ("dp=-2", ["'-2'"]),
        ("=2", ["'=2'"]),
        ("dp=2,dp=4", ["duplicate", "'dp'"]),
        ("dp=0", ["'dp'", "size 0"]),
    ],
)
def test_parse_errors(text: str, needles: list[str]) -> None:
    with pytest.raises(MeshError) as err:
        Mesh.parse(text)
    for needle in needles:
        assert needle in err.value.message, err.value.message


def test_lookup_errors() -> None:
    mesh = Mesh((2, 4), ("dp", "tp"))
    with pytest.raises(MeshError, match=r"unknown mesh axis 'pp'; the mesh has axes \(dp, tp\)"):
        mesh.axis_index("pp")
    with pytest.raises(MeshError, match="'pp'"):
        mesh.groups("pp")
    with pytest.raises(MeshError, match="index 2"):
        mesh.axis_size(2)
    with pytest.raises(MeshError, match="rank 8 is not in mesh dp=2,tp=4"):
        mesh.coord(8)
    with pytest.raises(MeshError, match="'tp'"):
        mesh.rank_at((0, 4))
    with pytest.raises(MeshError, match="length 1 but mesh dp=2,tp=4 has 2 axes"):
        mesh.rank_at((0,))
    with pytest.raises(MeshError, match="index 2 is out of range for mesh axis 'dp'"):
        mesh.submesh("dp", 2)


@st.composite
def meshes(draw: st.DrawFn) -> Mesh:
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    names = ("pp", "dp", "tp")[: len(shape)]
    ranks = draw(st.permutations(range(math.prod(shape))))
    return Mesh(shape, names, tuple(ranks))


@given(meshes())
def test_layout_properties(mesh: Mesh) -> None:
    for rank in mesh.ranks:
        assert mesh.rank_at(mesh.coord(rank)) == rank
    for k, name in enumerate(mesh.axis_names):
        groups = mesh.groups(name)
        assert sorted(r for g in groups for r in g) == sorted(mesh.ranks)
        assert all(len(g) == mesh.shape[k] for g in groups)
        for group in groups:
            coords = [mesh.coord(r) for r in group]
            assert [c[k] for c in coords] == list(range(mesh.shape[k]))
            assert len({c[:k] + c[k + 1 :] for c in coords}) == 1
            assert all(mesh.group_of(r, name) == group for r in group)
        stages = [mesh.submesh(name, i) for i in range(mesh.shape[k])]
        assert sorted(r for s in stages for r in s.ranks) == sorted(mesh.ranks)
        for i, stage in enumerate(stages):
            assert all(mesh.coord(r)[k] == i for r in stage.ranks)
    assert Mesh.parse(str(mesh)).shape == mesh.shape
    assert Mesh.from_json(mesh.to_json()) == mesh


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (",".join(f"a{i}=1" for i in range(9)), "has 9 axes, more than the limit of 8"),
        ("dp=1024,tp=1025", "has 1049600 devices, more than the limit of 1048576"),
        ("dp=" + "9" * 5000, "has over 10^18 devices, more than the limit of 1048576"),
        (",".join(f"a{i}=1" for i in range(150_000)), "has 150000 axes, more than the limit of 8"),
    ],
)
def test_absurd_meshes_are_refused_before_ranks_are_listed(text: str, message: str) -> None:
    with pytest.raises(MeshError, match=re.escape(message)) as err:
        Mesh.parse(text)
    assert err.value.detail["limit"] in (MAX_MESH_AXES, MAX_MESH_DEVICES)
    assert len(err.value.detail["mesh"]) <= 80  # a long mesh is shown cut short
    with pytest.raises(MeshError, match="2097152 devices"):
        Mesh((2, MAX_MESH_DEVICES), ("dp", "tp"))


def test_meshes_at_the_limits_pass() -> None:
    check_mesh_size("a=1,...", MAX_MESH_AXES, MAX_MESH_DEVICES)
    mesh = Mesh.parse(",".join(f"a{i}=2" for i in range(MAX_MESH_AXES)))
    assert (mesh.ndim, mesh.size) == (8, 256)
    assert Mesh.parse("dp=0004").shape == (4,)


def test_the_cli_refuses_the_same_meshes() -> None:
    nine = ",".join(f"a{i}=1" for i in range(9))
    out = CliRunner().invoke(app, ["plan", "mlp_demo", "--mesh", nine])
    assert out.exit_code != 0
    assert "has 9 axes, more than the limit of 8" in out.output
