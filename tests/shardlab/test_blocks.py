"""`shardlab.blocks` against the engine's own execution.

Every claim the sharding diagram draws is checked on data the engine itself sharded or
computed: the blocks `runtime.distribute` cuts for the simulated mesh (partial values split
at random), and every value of real training steps run on the simulated mesh, compared with
the single-device reference.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np
import pytest

from shardlab.blocks import RankBlock, blocks_json, rank_blocks
from shardlab.errors import PlacementError
from shardlab.mesh import Mesh
from shardlab.models import build_model
from shardlab.ops.base import Array
from shardlab.placement import DistSpec, Shard
from shardlab.plan import build_plan
from shardlab.runtime.distribute import assemble, distribute
from shardlab.runtime.reference import run_reference, source_values
from shardlab.runtime.simulated import run_simulated
from shardlab.strategy import Strategy

LINE = Mesh((4,), ("x",))
SQUARE = Mesh((2, 2), ("dp", "tp"))
CUBE = Mesh((2, 2, 2), ("dp", "tp", "sp"))
SHUFFLED = Mesh((2, 2), ("dp", "tp"), (3, 1, 2, 0))  # ranks laid out in another order
SHAPE = (8, 12, 4)
REDUCE = {"sum": np.sum, "avg": np.mean, "max": np.max, "min": np.min}

CASES = [
    (LINE, "S(0)"),
    (LINE, "S(1)"),
    (LINE, "S(2)"),
    (LINE, "R"),
    (LINE, "P(sum)"),
    (LINE, "P(max)"),
    (SQUARE, "S(0)S(1)"),
    (SQUARE, "S(1)S(0)"),
    (SQUARE, "S(0)S(0)"),
    (SQUARE, "RS(1)"),
    (SQUARE, "S(0)R"),
    (SQUARE, "RR"),
    (SQUARE, "P(sum)S(0)"),
    (SQUARE, "S(1)P(sum)"),
    (SQUARE, "P(avg)R"),
    (SQUARE, "P(sum)P(sum)"),
    (SQUARE, "P(avg)P(sum)"),
    (SHUFFLED, "S(0)S(1)"),
    (SHUFFLED, "P(sum)S(1)"),
    (CUBE, "S(0)S(1)R"),
    (CUBE, "RS(1)S(1)"),
    (CUBE, "S(0)S(0)S(0)"),
    (CUBE, "P(sum)S(1)R"),
    (CUBE, "RP(sum)S(0)"),
    (CUBE, "S(2)RP(max)"),
    (CUBE, "P(sum)P(sum)R"),
    (CUBE, "RRR"),
]


def reduced(data: Mapping[int, Array], spec: DistSpec, block: RankBlock) -> Array:
    """The block's value: its partial group's data reduced, the last partial axis innermost
    (as the engine reduces), or the rank's own data when nothing is partial."""
    mesh = spec.mesh
    group = {mesh.coord(r): data[r] for r in block.partial_group}
    axes = [mesh.axis_names.index(axis) for axis, _ in block.partial]
    for k, (_, op) in reversed(list(zip(axes, block.partial, strict=True))):
        merged: dict[tuple[int, ...], list[Array]] = {}
        for coord, value in group.items():
            merged.setdefault((*coord[:k], 0, *coord[k + 1 :]), []).append(value)
        group = {c: REDUCE[op](np.stack(vs), axis=0) for c, vs in merged.items()}
    (value,) = group.values()
    return value


def check_tiling(shape: Sequence[int], spec: DistSpec, blocks: list[RankBlock]) -> None:
    """Distinct ranges tile the tensor exactly (union is all of it, no overlap); each is held
    by exactly the ranks that differ only along Replicate and Partial axes."""
    cover = np.zeros(tuple(shape), dtype=int)
    holders: dict[tuple[tuple[int, int], ...], set[int]] = {}
    for b in blocks:
        holders.setdefault(b.ranges, set()).add(b.rank)
        assert tuple(stop - start for start, stop in b.ranges) == b.local_shape
    for ranges in holders:
        cover[tuple(slice(a, z) for a, z in ranges)] += 1
    assert (cover == 1).all()
    shards = [k for k, p in enumerate(spec.placements) if isinstance(p, Shard)]
    assert len(holders) == int(np.prod([spec.mesh.shape[k] for k in shards]))
    for b in blocks:
        assert holders[b.ranges] == {
            r for r in spec.mesh.ranks if all(spec.mesh.coord(r)[k] == b.coord[k] for k in shards)
        }
        assert len(holders[b.ranges]) == len(b.replica_group) * len(b.partial_group)
        assert b.rank in b.replica_group and b.rank in b.partial_group


@pytest.mark.parametrize(("mesh", "text"), CASES, ids=lambda v: str(v))
def test_blocks_are_what_the_simulated_mesh_holds(mesh: Mesh, text: str) -> None:
    spec = DistSpec.parse(text, mesh)
    full = np.random.default_rng(1).standard_normal(SHAPE)
    data = distribute(full, spec, np.random.default_rng(2))  # partials split at random
    blocks = rank_blocks(SHAPE, spec)
    assert [b.rank for b in blocks] == list(mesh.ranks)
    check_tiling(SHAPE, spec, blocks)
    for b in blocks:
        assert b.coord == mesh.coord(b.rank)
        where = tuple(slice(a, z) for a, z in b.ranges)
        assert data[b.rank].shape == b.local_shape
        np.testing.assert_allclose(reduced(data, spec, b), full[where], rtol=1e-12, atol=1e-12)
        if b.partial:
            # a partial block is not the value: the pieces differ (random split)
            assert len(b.partial_group) > 1
            assert not all(np.allclose(data[r], full[where]) for r in b.partial_group)
        else:
            assert b.partial_group == (b.rank,)
            np.testing.assert_array_equal(data[b.rank], full[where])
            for r in b.replica_group:  # replicas hold identical data
                np.testing.assert_array_equal(data[r], data[b.rank])
    np.testing.assert_allclose(assemble(data, spec, SHAPE), full, rtol=1e-12, atol=1e-12)


def test_groups_follow_the_placements() -> None:
    spec = DistSpec.parse("P(sum)S(1)R", CUBE)
    by_rank = {b.rank: b for b in rank_blocks(SHAPE, spec)}
    # rank 5 = (dp 1, tp 0, sp 1): replicas differ in sp only, partial sums in dp only
    five = by_rank[5]
    assert five.coord == (1, 0, 1)
    assert five.replica_group == (4, 5) and five.partial_group == (1, 5)
    assert five.partial == (("dp", "sum"),)
    assert five.ranges == ((0, 8), (0, 6), (0, 4)) and five.local_shape == (8, 6, 4)
    assert by_rank[7].ranges == ((0, 8), (6, 12), (0, 4))


def test_an_empty_shard_is_drawn_as_the_engine_holds_it() -> None:
    """3 rows on 4 ranks: DTensor's blocks 1, 1, 1, 0; the last rank holds an empty block."""
    spec = DistSpec.parse("S(0)", LINE)
    blocks = rank_blocks((3, 2), spec)
    assert [b.ranges for b in blocks] == [((0, 1), (0, 2)), ((1, 2), (0, 2)), ((2, 3), (0, 2)),
                                          ((3, 3), (0, 2))]  # fmt: skip
    data = distribute(np.arange(6.0).reshape(3, 2), spec)
    assert [data[b.rank].shape for b in blocks] == [b.local_shape for b in blocks]
    assert blocks[3].local_shape == (0, 2)
    with pytest.raises(PlacementError) as ours:
        rank_blocks((3, 2), DistSpec.parse("S(2)", LINE))
    with pytest.raises(PlacementError) as engine:
        distribute(np.zeros((3, 2)), DistSpec.parse("S(2)", LINE))
    assert str(ours.value) == str(engine.value)


def test_uneven_blocks_are_the_ones_the_engine_cuts() -> None:
    spec = DistSpec.parse("S(0)S(1)", SQUARE)
    blocks = rank_blocks((5, 7), spec)
    assert [b.ranges for b in blocks] == [
        ((0, 3), (0, 4)), ((0, 3), (4, 7)), ((3, 5), (0, 4)), ((3, 5), (4, 7)),
    ]  # fmt: skip
    assert [b.local_shape for b in blocks] == [(3, 4), (3, 3), (2, 4), (2, 3)]
    full = np.arange(35.0).reshape(5, 7)
    data = distribute(full, spec)
    for b in blocks:
        assert data[b.rank].shape == b.local_shape
        np.testing.assert_array_equal(data[b.rank], full[tuple(slice(*r) for r in b.ranges)])
    out = blocks_json((5, 7), spec)
    assert out["local_shape"] == [3, 4] and out["even"] is False
    assert blocks_json((4, 8), spec)["even"] is True


def test_json_form() -> None:
    out = blocks_json((8, 12), DistSpec.parse("S(0)P(sum)", SQUARE))
    assert out["spec"] == "S(0)P(sum)"
    assert out["mesh"] == {
        "text": "dp=2,tp=2",
        "axes": [{"name": "dp", "size": 2}, {"name": "tp", "size": 2}],
        "ranks": [0, 1, 2, 3],
    }
    assert out["placements"] == [
        {"axis": "dp", "placement": "S(0)", "kind": "shard", "dim": 0},
        {"axis": "tp", "placement": "P(sum)", "kind": "partial", "op": "sum"},
    ]
    assert out["dims"] == [
        {"dim": 0, "size": 8, "axes": ["dp"]},
        {"dim": 1, "size": 12, "axes": []},
    ]
    assert out["local_shape"] == [4, 12]
    assert out["ranks"][3] == {
        "rank": 3,
        "coord": [1, 1],
        "local_shape": [4, 12],
        "ranges": [[4, 8], [0, 12]],
        "partial": [{"axis": "tp", "op": "sum"}],
        "replica_group": [3],
        "partial_group": [2, 3],
    }


LLAMA = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 64,
         "seq": 8, "batch": 8, "dtype": "float32"}  # fmt: skip


@pytest.mark.parametrize(
    ("model", "overrides", "mesh", "templates", "annotations"),
    [
        ("mlp_demo", {}, "x=4", ["dp"], []),
        ("mlp_demo", {}, "dp=2,tp=2", ["dp:dp"], ["w0=tp:S(1)", "w1=tp:S(0)"]),
        ("llama3-8b", LLAMA, "dp=2,tp=2", ["dp", "megatron_tp"], []),
        ("llama3-8b", LLAMA, "dp=2,tp=2,sp=2", ["dp:dp", "megatron_tp:tp", "fsdp:sp"], []),
    ],
)
def test_every_value_of_a_training_step_matches_its_blocks(
    model: str,
    overrides: dict[str, object],
    mesh: str,
    templates: list[str],
    annotations: list[str],
) -> None:
    """Run one step on the simulated mesh: every serial value's data on every rank is the
    single-device value at the block's ranges (its partial group reduced), replicas of a
    value without partials are identical."""
    plan = build_plan(build_model(model, overrides), Strategy.build(mesh, templates, annotations))
    training, program = plan.training, plan.program
    env = run_reference(training, seed=0)
    data = run_simulated(program, {v.name: env[v.name] for v in source_values(training)}, 0)
    seen: Counter[str] = Counter()
    for name, held in program.values.items():
        spec, shape = program.specs[held], program.types[held].shape
        blocks = rank_blocks(shape, spec)
        check_tiling(shape, spec, blocks)
        for b in blocks:
            where = tuple(slice(a, z) for a, z in b.ranges)
            assert data[held][b.rank].shape == b.local_shape, name
            got = reduced(data[held], spec, b)
            np.testing.assert_allclose(got, env[name][where], rtol=1e-9, atol=1e-9, err_msg=name)
            if b.partial:
                seen["partial"] += 1
            elif len(b.replica_group) > 1:
                seen["replicated"] += 1
                for r in b.replica_group:
                    np.testing.assert_array_equal(data[held][r], data[held][b.rank], name)
            if b.local_shape != tuple(shape):
                seen["sharded"] += 1
    assert seen["partial"] and seen["replicated"] and seen["sharded"], seen
