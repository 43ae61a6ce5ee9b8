"""distribute / assemble: global view -> rank blocks -> global view, for any placements.

Random partial splits are how rule and program tests prove they work for *any* partial
decomposition, so the splits themselves are checked here: they must reduce to the value.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from shardlab.errors import ExecutionError, PlacementError
from shardlab.mesh import Mesh
from shardlab.placement import DistSpec, Partial, Placement, Replicate, Shard, check_placements
from shardlab.runtime.distribute import assemble, distribute, to_local

MESH = Mesh((2, 2), ("dp", "tp"))
CUBE = Mesh((2, 2, 2), ("pp", "dp", "tp"))
REDUCE = {"sum": np.sum, "avg": np.mean, "max": np.max, "min": np.min}


def spec(text: str, mesh: Mesh = MESH) -> DistSpec:
    return DistSpec.parse(text, mesh)


def test_to_local_cuts_blocks_and_puts_partial_sums_on_the_first_rank() -> None:
    x = np.arange(16.0).reshape(4, 4)
    np.testing.assert_array_equal(to_local(x, spec("S(0)S(1)"), 1), x[:2, 2:])
    np.testing.assert_array_equal(to_local(x, spec("S(1)S(1)"), 2), x[:, 2:3])
    s = spec("P(sum)S(0)")
    np.testing.assert_array_equal(to_local(x, s, 1), x[2:])
    np.testing.assert_array_equal(to_local(x, s, 3), np.zeros((2, 4)))
    for op in ("avg", "max", "min"):
        np.testing.assert_array_equal(to_local(x, spec(f"RP({op})"), 3), x)
    block = to_local(x, spec("RR"), 0)
    block[0, 0] = -1.0
    assert x[0, 0] == 0.0  # a copy, never a view of the global value


@pytest.mark.parametrize("op", ["sum", "avg", "max", "min"])
@pytest.mark.parametrize("text", ["P({op})R", "RP({op})", "P({op})S(1)", "S(0)P({op})"])
def test_random_split_on_one_axis_reduces_to_the_value(op: str, text: str) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 6))
    s = spec(text.format(op=op))
    blocks = distribute(x, s, rng)
    plain = distribute(x, s)
    assert any(not np.array_equal(blocks[r], plain[r]) for r in MESH.ranks)  # really split
    np.testing.assert_allclose(assemble(blocks, s, x.shape), x, atol=1e-12)
    k = next(k for k, p in enumerate(s.placements) if isinstance(p, Partial))
    for group in MESH.groups(k):
        pieces = np.stack([blocks[r] for r in group])
        whole = _block(x, s, group[0])
        np.testing.assert_allclose(REDUCE[op](pieces, axis=0), whole, atol=1e-12)
        if op in ("max", "min"):  # one rank holds the value, the others lie on the right side
            assert any(np.array_equal(p, whole) for p in pieces)


def _block(x: np.ndarray, s: DistSpec, rank: int) -> np.ndarray:
    """The global block a rank's partial group reduces to."""
    no_partial = tuple(Replicate() if isinstance(p, Partial) else p for p in s.placements)
    return to_local(x, DistSpec(s.mesh, no_partial), rank)


@pytest.mark.parametrize(
    "text", ["P(sum)P(sum)P(sum)", "P(sum)P(avg)S(0)", "P(avg)S(1)P(sum)", "P(avg)P(avg)R"]
)
def test_random_split_on_several_partial_axes(text: str) -> None:
    """Every rank gets its own piece, except replicas: ranks that differ only along a
    replicated axis hold the same piece, as in any SPMD program."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 4))
    s = spec(text, CUBE)
    blocks = distribute(x, s, rng)
    replicas = 2 if text.endswith("R") else 1
    assert len({blocks[r].tobytes() for r in CUBE.ranks}) == len(CUBE.ranks) // replicas
    if replicas > 1:
        assert all(np.array_equal(blocks[a], blocks[b]) for a, b in CUBE.groups(2))
    np.testing.assert_allclose(assemble(blocks, s, x.shape), x, atol=1e-12)


@pytest.mark.parametrize("text", ["P(max)P(sum)", "P(sum)P(max)", "P(max)P(min)", "P(avg)P(max)"])
def test_non_commuting_partial_axes_are_not_split(text: str) -> None:
    """Reductions that do not commute are distributed deterministically, still exactly."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 4))
    s = spec(text)
    blocks = distribute(x, s, rng)
    plain = distribute(x, s)
    assert all(np.array_equal(blocks[r], plain[r]) for r in MESH.ranks)
    np.testing.assert_array_equal(assemble(blocks, s, x.shape), x)


def test_integer_values_are_never_split() -> None:
    x = np.arange(8).reshape(2, 4)
    s = spec("P(sum)S(1)")
    blocks = distribute(x, s, np.random.default_rng(3))
    assert blocks[0].dtype == x.dtype and not blocks[2].any()
    np.testing.assert_array_equal(assemble(blocks, s, x.shape), x)


def test_mismatched_replicas_are_reported() -> None:
    x = np.ones((4, 2))
    s = spec("S(0)R")
    blocks = distribute(x, s)
    blocks[3] = blocks[3] + 1.0
    with pytest.raises(ExecutionError, match="ranks 2 and 3"):
        assemble(blocks, s, x.shape)
    np.testing.assert_array_equal(assemble(blocks, s, x.shape, check_replicas=False), x)


def test_scalars_round_trip() -> None:
    rng = np.random.default_rng(4)
    x = np.asarray(2.5)
    for text in ("RR", "P(avg)P(sum)", "P(sum)R"):
        s = spec(text)
        assert float(assemble(distribute(x, s, rng), s, ())) == pytest.approx(2.5, abs=1e-12)


MESHES = [Mesh((2,), ("x",)), Mesh((3,), ("x",)), MESH, Mesh((2, 3), ("a", "b")), CUBE]


@st.composite
def layouts(draw: st.DrawFn) -> tuple[np.ndarray, DistSpec]:
    mesh = draw(st.sampled_from(MESHES))
    rank = draw(st.integers(0, 3))
    shape = tuple(draw(st.lists(st.sampled_from([1, 2, 3, 4, 6, 12]), min_size=rank,
                                max_size=rank)))  # fmt: skip
    options: list[Placement] = [Replicate(), *(Shard(d) for d in range(rank))]
    options += [Partial(op) for op in ("sum", "avg", "max", "min")]
    placements = tuple(draw(st.sampled_from(options)) for _ in range(mesh.ndim))
    try:
        check_placements(shape, mesh, placements)
    except PlacementError:
        assume(False)
    seed = draw(st.integers(0, 2**32 - 1))
    x = np.random.default_rng(seed).standard_normal(shape)
    return x, DistSpec(mesh, placements)


@settings(max_examples=300, deadline=None)
@given(layouts(), st.booleans())
def test_distribute_then_assemble_is_the_identity(
    layout: tuple[np.ndarray, DistSpec], split: bool
) -> None:
    x, s = layout
    rng = np.random.default_rng(5) if split else None
    blocks = distribute(x, s, rng)
    assert set(blocks) == set(s.mesh.ranks)
    np.testing.assert_allclose(assemble(blocks, s, x.shape), x, atol=1e-12)
