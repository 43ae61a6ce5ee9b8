import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardlab.errors import PlacementError
from shardlab.mesh import Mesh
from shardlab.placement import (
    DistSpec,
    Partial,
    Placement,
    Replicate,
    Shard,
    check_placements,
    format_placements,
    group_sizes,
    index_ranges,
    is_even,
    local_shape,
    local_shape_on,
    local_slices,
    parse_placements,
    placements_from_dims,
    placements_to_dims,
    split_sizes,
)

MESH = Mesh((2, 4), ("dp", "tp"))
CUBE = Mesh((2, 2, 2), ("pp", "dp", "tp"))
R = Replicate()


def test_tokens() -> None:
    assert (str(Shard(0)), str(R), str(Partial()), str(Partial("max"))) == (
        "S(0)",
        "R",
        "P(sum)",
        "P(max)",
    )
    assert format_placements((Partial(), Shard(0))) == "P(sum)S(0)"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("S(0)R", (Shard(0), R)),
        ("RS(1)", (R, Shard(1))),
        ("P(sum)S(0)", (Partial("sum"), Shard(0))),
        ("PR", (Partial("sum"), R)),
        ("P(avg) , S(12)", (Partial("avg"), Shard(12))),
        (" S( 1 )\tS(1) ", (Shard(1), Shard(1))),
        ("P(min)P(max)", (Partial("min"), Partial("max"))),
    ],
)
def test_parse(text: str, expected: tuple[Placement, ...]) -> None:
    assert parse_placements(text) == expected
    assert parse_placements(text, MESH) == expected
    assert parse_placements(format_placements(expected), 2) == expected


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("S(0)X", ["'X'", "position 4"]),
        ("S(0)s(1)", ["'s(1)'", "position 4"]),
        ("RS(1", ["'S(1'", "position 1"]),
        ("S(-1)R", ["'S(-1)'", "position 0", "negative dims are not allowed"]),
        ("RS(a)", ["'S(a)'", "position 1"]),
        ("R P(prod)", ["'P(prod)'", "position 2", "'prod'"]),
        ("R?", ["'?'", "position 1"]),
        ("", ["empty"]),
    ],
)
def test_parse_errors(text: str, needles: list[str]) -> None:
    with pytest.raises(PlacementError) as err:
        parse_placements(text)
    assert err.value.code == "invalid_placement"
    for needle in needles:
        assert needle in err.value.message, err.value.message


def test_parse_counts() -> None:
    with pytest.raises(PlacementError) as err:
        parse_placements("S(0)", MESH)
    assert err.value.message == "'S(0)' has 1 placement but the mesh has 2 axes (dp, tp)"
    with pytest.raises(PlacementError, match="'S\\(0\\)RR' has 3 placements but the mesh has 2"):
        parse_placements("S(0)RR", 2)
    with pytest.raises(PlacementError, match="'' has 0 placements"):
        parse_placements("", MESH)
    assert parse_placements("", 0) == ()


def test_placement_construction_errors() -> None:
    with pytest.raises(PlacementError, match="negative dims are not allowed"):
        Shard(-1)
    with pytest.raises(PlacementError, match="'prod'"):
        Partial("prod")


def test_dims_form() -> None:
    assert placements_from_dims(("dp", None, "tp"), MESH, 3) == (Shard(0), Shard(2))
    assert placements_from_dims((("dp", "tp"), None), MESH, 2) == (Shard(0), Shard(0))
    assert placements_from_dims((None, ["tp"]), MESH, 2) == (R, Shard(1))
    assert placements_from_dims((None, None), MESH, 2) == (R, R)
    assert placements_from_dims((("pp", "tp"), "dp"), CUBE, 2) == (Shard(0), Shard(1), Shard(0))
    assert placements_to_dims((Shard(0), Shard(2)), MESH, 3) == ("dp", None, "tp")
    assert placements_to_dims((Shard(0), Shard(0)), MESH, 2) == (("dp", "tp"), None)
    assert placements_to_dims((R, R), MESH, 1) == (None,)


@pytest.mark.parametrize(
    ("dims", "rank", "needles"),
    [
        (("pp", None), 2, ["'pp'", "dim 0", "(dp, tp)"]),
        (("dp", ("tp", "dp")), 2, ["'dp'", "twice", "dims 0 and 1"]),
        ((("tp", "dp"), None), 2, ["('tp', 'dp')", "dim 0", "mesh order"]),
        (("dp", None), 3, ["2 entries", "rank 3"]),
    ],
)
def test_dims_form_errors(dims: tuple[object, ...], rank: int, needles: list[str]) -> None:
    with pytest.raises(PlacementError) as err:
        placements_from_dims(dims, MESH, rank)  # type: ignore[arg-type]
    for needle in needles:
        assert needle in err.value.message, err.value.message


def test_to_dims_errors() -> None:
    with pytest.raises(PlacementError, match="P\\(sum\\) on mesh axis 'dp' has no per-dim form"):
        placements_to_dims((Partial(), Shard(0)), MESH, 2)
    with pytest.raises(PlacementError, match="S\\(2\\) on mesh axis 'tp' is out of range"):
        placements_to_dims((R, Shard(2)), MESH, 2)
    with pytest.raises(PlacementError, match="1 placement but the mesh has 2 axes"):
        placements_to_dims((R,), MESH, 2)


def test_dist_spec() -> None:
    spec = DistSpec.parse("S(1)RS(1)", CUBE)
    assert str(spec) == "S(1)RS(1)"
    assert spec.sharded_dims() == {1: ["pp", "tp"]}
    assert not spec.is_replicated() and not spec.has_partial()
    assert DistSpec(CUBE, (Shard(2), Partial(), Shard(0))).sharded_dims() == {
        0: ["tp"],
        2: ["pp"],
    }
    assert DistSpec(MESH, (Partial(), R)).has_partial()
    assert DistSpec.replicated(MESH) == DistSpec(MESH, (R, R))
    assert DistSpec.replicated(MESH).is_replicated()
    assert DistSpec(MESH, [R, R]).placements == (R, R)  # type: ignore[arg-type]
    with pytest.raises(PlacementError, match="'R' has 1 placement but the mesh has 2 axes"):
        DistSpec(MESH, (R,))
    with pytest.raises(PlacementError, match="not a placement"):
        DistSpec(MESH, (R, "R"))  # type: ignore[arg-type]


def test_check_placements_errors() -> None:
    # empty blocks are allowed where DTensor's torch.chunk makes them
    check_placements((8, 3), MESH, (R, Shard(1)), "w")  # 1, 1, 1, 0
    check_placements((8, 5), MESH, (Shard(1), Shard(1)), "w")  # 3 -> 1, 1, 1, 0; 2 -> 1, 1, 0, 0
    check_placements((8, 10), MESH, (R, Shard(1)), "w")  # uneven: 3, 3, 3, 1
    check_placements((8, 12), MESH, (Shard(1), Shard(1)), "w")
    with pytest.raises(PlacementError) as err:
        check_placements((8,), MESH, (R, Shard(1)), "bias")
    assert err.value.message == (
        "S(1) on mesh axis 'tp' is out of range for 'bias' of rank 1 (valid dims 0..0)"
    )
    with pytest.raises(PlacementError, match="no dims"):
        check_placements((), MESH, (Shard(0), R), "loss")
    with pytest.raises(PlacementError, match="has 1 placement but the mesh has 2 axes"):
        check_placements((8,), MESH, (R,))
    check_placements((8, 16), MESH, (Shard(1), Shard(1)))
    check_placements((0, 4), MESH, (Shard(0), Shard(1)))


def test_local_shape() -> None:
    assert local_shape((8, 12), MESH, (Shard(0), Shard(1))) == (4, 3)
    assert local_shape((8, 3), MESH, (Shard(0), Shard(0))) == (1, 3)
    assert local_shape((8, 12), MESH, (Partial(), Shard(1))) == (8, 3)
    assert local_shape((8, 12), MESH, (R, R)) == (8, 12)
    assert local_shape((), MESH, (Partial(), R)) == ()
    assert local_shape((4, 8, 6), CUBE, (Shard(1), R, Shard(1))) == (4, 2, 6)


def test_index_ranges_left_axis_outermost() -> None:
    mesh = Mesh((2, 2), ("dp", "tp"))
    blocks = [index_ranges((8,), mesh, (Shard(0), Shard(0)), r) for r in mesh.ranks]
    assert blocks == [((0, 2),), ((2, 4),), ((4, 6),), ((6, 8),)]
    assert [index_ranges((8,), mesh, (R, Shard(0)), r) for r in mesh.ranks] == [
        ((0, 4),),
        ((4, 8),),
        ((0, 4),),
        ((4, 8),),
    ]
    permuted = Mesh((2, 2), ("dp", "tp"), (3, 2, 1, 0))
    assert index_ranges((8, 6), permuted, (Shard(0), Shard(1)), 3) == ((0, 4), (0, 3))
    assert index_ranges((8, 6), permuted, (Shard(0), Shard(1)), 1) == ((4, 8), (0, 3))
    assert index_ranges((8, 6), CUBE, (Shard(1), Partial(), Shard(0)), 5) == ((4, 8), (3, 6))


def test_uneven_blocks_follow_dtensor_torch_chunk() -> None:
    mesh = Mesh((4,), ("tp",))
    ranges = [index_ranges((6, 10), mesh, (Shard(0),), r) for r in mesh.ranks]
    assert [r[0] for r in ranges] == [(0, 2), (2, 4), (4, 6), (6, 6)]  # the last one empty
    assert [local_shape_on((6, 10), mesh, (Shard(0),), r) for r in mesh.ranks] == [
        (2, 10), (2, 10), (2, 10), (0, 10),
    ]  # fmt: skip
    assert local_shape((6, 10), mesh, (Shard(0),)) == (2, 10)  # the largest block
    assert [index_ranges((10,), mesh, (Shard(0),), r)[0] for r in mesh.ranks] == [
        (0, 3), (3, 6), (6, 9), (9, 10),
    ]  # fmt: skip
    assert split_sizes(50257, 4) == (12565, 12565, 12565, 12562)
    vocab = [index_ranges((50257, 8), mesh, (Shard(0),), r)[0] for r in mesh.ranks]
    assert vocab == [(0, 12565), (12565, 25130), (25130, 37695), (37695, 50257)]


def test_nested_uneven_blocks_split_the_outer_block() -> None:
    mesh = Mesh((2, 2), ("dp", "tp"))
    # dp cuts 6 into 3 + 3, then tp chunks each 3 into 2 + 1
    blocks = [index_ranges((6,), mesh, (Shard(0), Shard(0)), r)[0] for r in mesh.ranks]
    assert blocks == [(0, 2), (2, 3), (3, 5), (5, 6)]
    assert local_shape((6,), mesh, (Shard(0), Shard(0))) == (2,)
    assert group_sizes((6,), mesh, (Shard(0), Shard(0)), 1, 2) == (2, 1)
    assert group_sizes((7, 2), mesh, (Shard(0), R), 0, 3) == (4, 3)
    # 3 tokens: dp cuts 2 + 1, tp chunks 2 into 1 + 1 and 1 into 1 + 0 (allowed, as DTensor)
    check_placements((3,), mesh, (Shard(0), Shard(0)), "tokens")
    tokens = [index_ranges((3,), mesh, (Shard(0), Shard(0)), r)[0] for r in mesh.ranks]
    assert tokens == [(0, 1), (1, 2), (2, 3), (3, 3)]
    assert is_even((8,), mesh, (Shard(0), Shard(0)))
    assert not is_even((6,), mesh, (Shard(0), Shard(0)))


def test_local_slices() -> None:
    arr = np.arange(48).reshape(8, 6)
    slices = local_slices(arr.shape, MESH, (Shard(1), Shard(0)), 6)
    assert slices == (slice(4, 6), slice(3, 6))
    np.testing.assert_array_equal(arr[slices], [[27, 28, 29], [33, 34, 35]])


@st.composite
def layouts(
    draw: st.DrawFn,
) -> tuple[tuple[int, ...], Mesh, tuple[Placement, ...]]:
    mesh_shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    ranks = draw(st.permutations(range(math.prod(mesh_shape))))
    mesh = Mesh(mesh_shape, ("pp", "dp", "tp")[: len(mesh_shape)], tuple(ranks))
    tensor_rank = draw(st.integers(0, 3))
    choice = st.just(R)
    if tensor_rank:
        choice = st.one_of(choice, st.builds(Shard, st.integers(0, tensor_rank - 1)))
    placements = tuple(draw(choice) for _ in range(mesh.ndim))
    shape = tuple(
        draw(st.integers(0, 3))
        * math.prod(n for n, p in zip(mesh.shape, placements, strict=True) if p == Shard(d))
        + draw(st.integers(0, 2))  # uneven and empty blocks too (DTensor's layout)
        for d in range(tensor_rank)
    )
    return shape, mesh, placements


def rank_of(mesh: Mesh, rank: int) -> int:
    """`rank`'s position in the mesh (row-major coordinate order)."""
    return mesh.ranks.index(rank)


@given(layouts())
def test_blocks_tile_the_tensor(layout: tuple[tuple[int, ...], Mesh, tuple[Placement, ...]]):
    shape, mesh, placements = layout
    sharded = math.prod(n for n, p in zip(mesh.shape, placements, strict=True) if p != R)
    replicas = mesh.size // sharded
    local = local_shape(shape, mesh, placements)
    counts = np.zeros(shape, dtype=np.int64)
    holders: Counter[tuple[tuple[int, int], ...]] = Counter()
    for rank in mesh.ranks:
        ranges = index_ranges(shape, mesh, placements, rank)
        mine = tuple(b - a for a, b in ranges)
        assert mine == local_shape_on(shape, mesh, placements, rank)
        assert all(0 <= m <= big for m, big in zip(mine, local, strict=True))
        if rank_of(mesh, rank) == 0:
            assert mine == local  # the first block is the largest
        counts[local_slices(shape, mesh, placements, rank)] += 1
        if math.prod(mine):  # empty blocks (DTensor's tail chunks) hold nothing
            holders[ranges] += 1
    assert (counts == replicas).all()
    assert set(holders.values()) <= {replicas}
    assert sum(math.prod(b - a for a, b in block) for block in holders) == math.prod(shape)


@given(layouts())
def test_reassemble_from_local_blocks(
    layout: tuple[tuple[int, ...], Mesh, tuple[Placement, ...]],
) -> None:
    shape, mesh, placements = layout
    arr = np.arange(math.prod(shape)).reshape(shape)
    locals_ = {r: arr[local_slices(shape, mesh, placements, r)].copy() for r in mesh.ranks}
    out = np.full(shape, -1)
    for rank, block in locals_.items():
        assert block.shape == local_shape_on(shape, mesh, placements, rank)
        out[local_slices(shape, mesh, placements, rank)] = block
    np.testing.assert_array_equal(out, arr)


@given(layouts())
def test_dims_form_round_trip(layout: tuple[tuple[int, ...], Mesh, tuple[Placement, ...]]):
    shape, mesh, placements = layout
    dims = placements_to_dims(placements, mesh, len(shape))
    assert placements_from_dims(dims, mesh, len(shape)) == placements


placement_values = st.one_of(
    st.just(R),
    st.builds(Shard, st.integers(0, 20)),
    st.builds(Partial, st.sampled_from(["sum", "avg", "max", "min"])),
)


@given(st.lists(placement_values, min_size=1, max_size=4))
def test_text_round_trip(placements: list[Placement]) -> None:
    text = format_placements(placements)
    assert parse_placements(text, len(placements)) == tuple(placements)
    assert parse_placements(", ".join(str(p) for p in placements)) == tuple(placements)
