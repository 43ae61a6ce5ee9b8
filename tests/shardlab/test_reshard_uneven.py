"""Reshards of uneven shards: every placement pair of a (6, 10) tensor on meshes (4,),
(2, 2), (2, 3) and (2, 4), planned and executed block by block, equals the global value.

Blocks are DTensor's (`torch.chunk`: ceil-sized, the tail ones short or empty), so 6 rows
on 4 ranks are 2, 2, 2, 0 and some ranks hold empty blocks: gathers, reduce-scatters,
all_to_alls and slices move zero-size pieces. Under the first rule (every sharded dim
divisible by its axes) 853 of the first three meshes' 4,851 pairs were refused
(`_old_even` counts them); under the array_split layout, pairs whose blocks would be empty
(a dim shorter than its shards, `_shorter`) were refused too. Now every pair plans and runs.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from shardlab.errors import PlacementError
from shardlab.mesh import Mesh
from shardlab.placement import (
    DistSpec,
    Partial,
    Placement,
    Replicate,
    Shard,
    empty_blocks,
    local_shape,
    local_shape_on,
)
from shardlab.reshard import plan_transition, total_bytes
from shardlab.runtime.distribute import assemble, distribute
from shardlab.runtime.reshard_exec import apply_transition

SHAPE = (6, 10)
MESHES = {
    "4": Mesh((4,), ("tp",)),
    "2x2": Mesh((2, 2), ("dp", "tp")),
    "2x3": Mesh((2, 3), ("dp", "tp")),
    "2x4": Mesh((2, 4), ("dp", "tp")),
}
CHOICES: list[Placement] = [
    Replicate(),
    Shard(0),
    Shard(1),
    *(Partial(op) for op in ("sum", "avg", "max", "min")),
]


def _specs(mesh: Mesh) -> list[DistSpec]:
    return [DistSpec(mesh, p) for p in itertools.product(CHOICES, repeat=mesh.ndim)]


def _old_even(spec: DistSpec) -> bool:
    """The old rule: each sharded dim divisible by the product of its axes."""
    return all(
        SHAPE[d] % math.prod(spec.mesh.axis_size(a) for a in axes) == 0
        for d, axes in spec.sharded_dims().items()
    )


def _shorter(spec: DistSpec) -> bool:
    """Some sharded dim is shorter than its number of blocks (refused before DTensor's
    layout was adopted: a rank's block would be empty)."""
    return any(
        SHAPE[d] < math.prod(spec.mesh.axis_size(a) for a in axes)
        for d, axes in spec.sharded_dims().items()
    )


def _has_empty(spec: DistSpec) -> bool:
    return bool(empty_blocks(SHAPE, spec.mesh, spec.placements))


def _run_pairs(mesh: Mesh) -> tuple[int, int, int, int, int]:
    """(pairs, refused now, refused by the old rule, refused for empty blocks under the
    array_split layout, pairs with an empty block); every planned pair is checked."""
    x = np.random.default_rng(7).standard_normal(SHAPE)
    pairs = refused = old = shorter = empty = 0
    for i, (src, dst) in enumerate(itertools.product(_specs(mesh), repeat=2)):
        pairs += 1
        old += not (_old_even(src) and _old_even(dst))
        shorter += _shorter(src) or _shorter(dst)
        empty += _has_empty(src) or _has_empty(dst)
        try:
            steps = plan_transition(SHAPE, "float32", mesh, src, dst)
        except PlacementError:
            refused += 1
            continue
        blocks = distribute(x, src, np.random.default_rng(i))
        out = apply_transition(blocks, SHAPE, mesh, src, dst, steps)
        for r, block in out.items():
            assert block.shape == local_shape_on(SHAPE, mesh, dst.placements, r), (src, dst, r)
        got = assemble(out, dst, SHAPE)
        np.testing.assert_allclose(got, x, rtol=1e-9, atol=1e-9, err_msg=f"{src} -> {dst}")
    return pairs, refused, old, shorter, empty


def test_every_pair_of_uneven_placements_reshards_correctly() -> None:
    counts = {name: _run_pairs(mesh) for name, mesh in MESHES.items()}
    assert counts == {
        "4": (49, 0, 24, 0, 13),
        "2x2": (2401, 0, 192, 0, 0),
        "2x3": (2401, 0, 637, 0, 0),
        "2x4": (2401, 0, 1176, 97, 720),
    }


def test_gather_of_uneven_shards_is_charged_the_padded_message() -> None:
    mesh = MESHES["4"]
    src, dst = DistSpec.parse("S(0)", mesh), DistSpec.parse("R", mesh)
    (step,) = plan_transition(SHAPE, "float32", mesh, src, dst)
    # blocks of 2, 2, 2, 0 rows: padded to 2 rows of 10 float32 = 80 bytes, times 4 ranks
    assert local_shape(SHAPE, mesh, src.placements) == (2, 10)
    assert step.kind == "all_gather"
    assert total_bytes((step,)) == pytest.approx(3 / 4 * 4 * 80)


def test_empty_blocks_are_gathered_and_sliced_like_any_other() -> None:
    mesh = MESHES["2x4"]
    src = DistSpec.parse("S(0)S(0)", mesh)
    # dp cuts 6 rows into 3 + 3, tp chunks each 3 into 1, 1, 1, 0 (as DTensor does)
    rows = [local_shape_on(SHAPE, mesh, src.placements, r)[0] for r in mesh.ranks]
    assert rows == [1, 1, 1, 0, 1, 1, 1, 0]
    steps = plan_transition(SHAPE, "float32", mesh, src, DistSpec.replicated(mesh))
    assert [s.kind for s in steps] == ["all_gather", "all_gather"]
    back = plan_transition(SHAPE, "float32", mesh, DistSpec.replicated(mesh), src)
    assert [s.kind for s in back] == ["local_slice", "local_slice"]
    x = np.arange(60.0).reshape(SHAPE)
    blocks = distribute(x, src)
    assert blocks[3].shape == (0, 10)
    out = apply_transition(blocks, SHAPE, mesh, src, DistSpec.replicated(mesh), steps)
    assert all((block == x).all() for block in out.values())


def test_a_bad_placement_is_still_refused() -> None:
    mesh = MESHES["2x4"]
    with pytest.raises(PlacementError, match="out of range for 'reshard source'"):
        plan_transition(SHAPE, "float32", mesh, DistSpec.parse("S(2)R", mesh),
                        DistSpec.replicated(mesh))  # fmt: skip
