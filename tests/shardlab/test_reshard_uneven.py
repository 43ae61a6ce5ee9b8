"""Reshards of uneven shards: every placement pair of a (6, 10) tensor on meshes (4,),
(2, 2) and (2, 3), planned and executed block by block, equals the global value.

Under the old rule (every sharded dim divisible by its axes) 853 of these 4,851 pairs were
refused (`_old_even` counts them); now none is, since no placement of (6, 10) on these
meshes leaves a rank empty. Empty shards are refused naming
the dim and the axes.
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


def _run_pairs(mesh: Mesh) -> tuple[int, int, int]:
    """(pairs, refused now, refused by the old rule); every planned pair is checked."""
    x = np.random.default_rng(7).standard_normal(SHAPE)
    pairs = refused = old = 0
    for i, (src, dst) in enumerate(itertools.product(_specs(mesh), repeat=2)):
        pairs += 1
        old += not (_old_even(src) and _old_even(dst))
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
    return pairs, refused, old


def test_every_pair_of_uneven_placements_reshards_correctly() -> None:
    counts = {name: _run_pairs(mesh) for name, mesh in MESHES.items()}
    assert counts == {"4": (49, 0, 24), "2x2": (2401, 0, 192), "2x3": (2401, 0, 637)}


def test_gather_of_uneven_shards_is_charged_the_padded_message() -> None:
    mesh = MESHES["4"]
    src, dst = DistSpec.parse("S(0)", mesh), DistSpec.parse("R", mesh)
    (step,) = plan_transition(SHAPE, "float32", mesh, src, dst)
    # blocks of 2, 2, 1, 1 rows: padded to 2 rows of 10 float32 = 80 bytes, times 4 ranks
    assert local_shape(SHAPE, mesh, src.placements) == (2, 10)
    assert step.kind == "all_gather"
    assert total_bytes((step,)) == pytest.approx(3 / 4 * 4 * 80)


def test_an_empty_shard_names_the_dim_and_the_axes() -> None:
    mesh = Mesh((2, 4), ("dp", "tp"))
    src = DistSpec.parse("S(0)S(0)", mesh)
    with pytest.raises(PlacementError, match=r"dim 0 of 'reshard source' \(size 6\) over mesh "
                       r"axes dp \(2\), tp \(4\)"):  # fmt: skip
        plan_transition(SHAPE, "float32", mesh, src, DistSpec.replicated(mesh))
