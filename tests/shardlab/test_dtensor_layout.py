"""Uneven shards are laid out exactly as PyTorch DTensor lays them out (torch.chunk).

The reference is torch itself, on CPU without a process group: DTensor's own split
(`torch.distributed.tensor.Shard._split_tensor`: `torch.chunk`, padded with empty tensors),
nested mesh axis by mesh axis from the left as DTensor nests its shards, applied to a tensor
of global indices; and DTensor's `_compute_local_shape_and_global_offset` (what it uses to
checkpoint and to build local tensors). Every rank's `index_ranges` / `local_shape_on` must
equal both, on 1-D, 2-D and 3-D meshes, for sizes that divide, do not divide, leave empty
blocks (6 over 4, 5 over 4, 7 over (2, 3)) or are smaller than the rank count.
The old layout (`numpy.array_split`: the first S % n blocks one longer) differs from
DTensor's on many of these blocks (`test_the_old_array_split_layout_differed`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence

import numpy as np
import pytest

from shardlab.errors import PlacementError
from shardlab.mesh import Mesh
from shardlab.placement import (
    Partial,
    Placement,
    Replicate,
    Shard,
    check_no_empty_blocks,
    check_placements,
    empty_blocks,
    group_sizes,
    index_ranges,
    local_shape,
    local_shape_on,
    nested_split_sizes,
    split_sizes,
)

torch = pytest.importorskip("torch")
dtensor = pytest.importorskip("torch.distributed.tensor")
if not hasattr(dtensor.Shard, "_split_tensor"):  # pragma: no cover - torch's private API
    pytest.skip("this torch has no Shard._split_tensor", allow_module_level=True)

Case = tuple[tuple[int, ...], tuple[int, ...], tuple[Placement, ...]]

R = Replicate()
SIZES_1D = [*range(0, 14), 17, 50257 % 1000, 4096]


def _mesh(shape: Sequence[int]) -> Mesh:
    return Mesh(tuple(shape), ("pp", "dp", "tp")[-len(shape) :])


def dtensor_block(shape: Sequence[int], mesh: Mesh, placements: Sequence[Placement], rank: int):
    """The block `rank` holds of a tensor of global indices, split as DTensor splits it."""
    block = torch.arange(math.prod(shape), dtype=torch.int64).reshape(tuple(shape))
    coord = mesh.coord(rank)
    for k, p in enumerate(placements):
        if isinstance(p, Shard):
            pieces, _ = dtensor.Shard(p.dim)._split_tensor(block, mesh.shape[k], with_padding=False)
            assert len(pieces) == mesh.shape[k]
            block = pieces[coord[k]]
    return block


def dtensor_shape_offset(
    shape: Sequence[int], mesh: Mesh, placements: Sequence[Placement], rank: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """DTensor's own local shape and global offset of `rank`'s block."""
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

    theirs = [dtensor.Shard(p.dim) if isinstance(p, Shard) else dtensor.Replicate()
              for p in placements]  # fmt: skip
    local, offset = _compute_local_shape_and_global_offset(
        tuple(shape), mesh.shape, list(mesh.coord(rank)), theirs
    )
    return tuple(int(s) for s in local), tuple(int(o) for o in offset)


def cases() -> Iterator[Case]:
    """(global shape, mesh shape, placements) on 1-D, 2-D and 3-D meshes."""
    for n in (2, 3, 4, 8, 48):
        for size in SIZES_1D:
            yield (size,), (n,), (Shard(0),)
    for mesh_shape in ((2, 2), (2, 3), (3, 2), (2, 4), (4, 2)):
        for size in range(0, 14):
            yield (size,), mesh_shape, (Shard(0), Shard(0))  # nested on the same dim
            yield (size,), mesh_shape, (R, Shard(0))
            yield (size,), mesh_shape, (Shard(0), Partial())
        for rows, cols in itertools.product((1, 3, 5, 6, 7), (2, 5, 10)):
            yield (rows, cols), mesh_shape, (Shard(0), Shard(1))
            yield (rows, cols), mesh_shape, (Shard(1), Shard(0))
            yield (rows, cols), mesh_shape, (Shard(1), Shard(1))
    for mesh_shape in ((2, 2, 2), (2, 3, 2), (3, 2, 2)):
        for size in (1, 3, 5, 7, 10, 11, 13, 25):
            yield (size,), mesh_shape, (Shard(0), Shard(0), Shard(0))
            yield (size, 3), mesh_shape, (Shard(0), Shard(1), Shard(0))
            yield (size, 6), mesh_shape, (Shard(1), R, Shard(0))
            yield (3, size), mesh_shape, (Partial(), Shard(1), Shard(1))
    yield (4096,), (48,), (Shard(0),)
    yield (7,), (2, 3), (Shard(0), Shard(0))
    yield (8, 4096), (4, 12), (R, Shard(1))


CASES = list(cases())


def _ours(shape: Sequence[int], mesh: Mesh, placements: Sequence[Placement], rank: int):
    ranges = index_ranges(shape, mesh, placements, rank)
    full = np.arange(math.prod(shape), dtype=np.int64).reshape(tuple(shape))
    return ranges, full[tuple(slice(a, b) for a, b in ranges)]


def test_every_rank_block_equals_dtensors() -> None:
    blocks = 0
    empty = 0
    for shape, mesh_shape, placements in CASES:
        mesh = _mesh(mesh_shape)
        check_placements(shape, mesh, placements)  # empty blocks are allowed
        for rank in mesh.ranks:
            ranges, mine = _ours(shape, mesh, placements, rank)
            theirs = dtensor_block(shape, mesh, placements, rank).numpy()
            where = (shape, mesh_shape, [str(p) for p in placements], rank)
            assert mine.shape == theirs.shape, where
            np.testing.assert_array_equal(mine, theirs, err_msg=str(where))
            assert local_shape_on(shape, mesh, placements, rank) == theirs.shape, where
            local, offset = dtensor_shape_offset(shape, mesh, placements, rank)
            assert local == theirs.shape, where
            for (start, stop), at in zip(ranges, offset, strict=True):
                if stop > start:  # DTensor puts an empty block's offset at the dim's end
                    assert start == at, where
            blocks += 1
            empty += 0 in theirs.shape and math.prod(shape) > 0
    assert blocks > 5000 and empty > 500


def _array_split_ranges(
    shape: Sequence[int], mesh: Mesh, placements: Sequence[Placement], rank: int
) -> tuple[tuple[int, int], ...]:
    """The old layout: each axis cut its block as `numpy.array_split` does."""
    coord = mesh.coord(rank)
    out = []
    for d, size in enumerate(shape):
        start, stop = 0, size
        for k, p in enumerate(placements):
            if isinstance(p, Shard) and p.dim == d:
                q, r = divmod(stop - start, mesh.shape[k])
                c = coord[k]
                start, stop = start + c * q + min(c, r), start + c * q + min(c, r) + q + (c < r)
        out.append((start, stop))
    return tuple(out)


def test_the_old_array_split_layout_differed() -> None:
    """On small 1-D and 2-D meshes the old layout put many blocks elsewhere than DTensor;
    each of those blocks now matches torch (the test above)."""
    small = [c for c in CASES if len(c[1]) <= 2 and math.prod(c[1]) <= 8 and max(c[0]) <= 13]
    differ = total = 0
    for shape, mesh_shape, placements in small:
        mesh = _mesh(mesh_shape)
        for rank in mesh.ranks:
            total += 1
            old = _array_split_ranges(shape, mesh, placements, rank)
            new = index_ranges(shape, mesh, placements, rank)
            theirs = dtensor_block(shape, mesh, placements, rank).shape
            assert tuple(b - a for a, b in new) == tuple(theirs)
            differ += old != new
    assert (differ, total) == (499, 3028)


@pytest.mark.parametrize(
    ("size", "parts", "sizes"),
    [
        (10, 4, (3, 3, 3, 1)),
        (6, 4, (2, 2, 2, 0)),
        (5, 4, (2, 2, 1, 0)),
        (3, 4, (1, 1, 1, 0)),
        (0, 3, (0, 0, 0)),
        (8, 8, (1,) * 8),
        (50257, 4, (12565, 12565, 12565, 12562)),
        (4096, 48, (86,) * 47 + (54,)),
    ],
)
def test_split_sizes_are_torch_chunks(size: int, parts: int, sizes: tuple[int, ...]) -> None:
    assert split_sizes(size, parts) == sizes
    chunks = [len(c) for c in torch.chunk(torch.arange(size), parts)] if size else []
    assert sizes == (*chunks, *[0] * (parts - len(chunks)))


def test_nested_axes_chunk_the_block_the_outer_axes_left() -> None:
    mesh = Mesh((2, 3), ("dp", "tp"))
    # dp cuts 7 into 4 + 3; tp chunks 4 into 2, 2, 0 and 3 into 1, 1, 1
    blocks = [index_ranges((7,), mesh, (Shard(0), Shard(0)), r)[0] for r in mesh.ranks]
    assert blocks == [(0, 2), (2, 4), (4, 4), (4, 5), (5, 6), (6, 7)]
    assert nested_split_sizes(7, (2, 3)) == (2, 2, 0, 1, 1, 1)
    assert group_sizes((7,), mesh, (Shard(0), Shard(0)), 1, 0) == (2, 2, 0)
    assert group_sizes((7,), mesh, (Shard(0), Shard(0)), 1, 4) == (1, 1, 1)
    assert local_shape((7,), mesh, (Shard(0), Shard(0))) == (2,)  # the largest, rank 0's


def test_empty_blocks_are_named_where_an_op_cannot_take_them() -> None:
    mesh = Mesh((2, 4), ("dp", "tp"))
    bias = (R, Shard(0))
    check_placements((3,), mesh, bias, "bias")  # allowed: 1, 1, 1, 0
    (found,) = empty_blocks((3,), mesh, bias)
    assert (found.dim, found.size, found.axes, found.sizes, found.empty) == (
        0, 3, ("tp",), (1, 1, 1, 0), 1,
    )  # fmt: skip
    assert empty_blocks((8,), mesh, bias) == ()
    assert empty_blocks((0,), mesh, bias) == ()  # a zero-size dim is empty everywhere anyway
    with pytest.raises(PlacementError) as err:
        check_no_empty_blocks((6,), mesh, (Shard(0), Shard(0)), "b", "a max needs one element")
    assert err.value.message == (
        "cannot shard dim 0 of 'b' (size 6) over mesh axes dp (2), tp (4): DTensor's blocks "
        "(1 x3, 0, 1 x3, 0) leave 2 rank(s) with an empty block, and a max needs one element"
    )
    assert err.value.detail == {"dim": 0, "size": 6, "axes": ["dp", "tp"]}
    check_no_empty_blocks((8,), mesh, (Shard(0), Shard(0)), "b", "unused")
