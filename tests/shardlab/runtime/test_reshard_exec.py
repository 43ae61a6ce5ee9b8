"""apply_step / apply_transition: each simulated collective on hand-made per-rank blocks."""

from __future__ import annotations

import numpy as np
import pytest

from shardlab.errors import ExecutionError
from shardlab.mesh import Mesh
from shardlab.placement import DistSpec, Partial, Placement, Replicate, Shard
from shardlab.reshard import CommStep
from shardlab.runtime.reshard_exec import apply_step, apply_transition

LINE = Mesh((2,), ("tp",))
GRID = Mesh((2, 2), ("dp", "tp"))


def step(kind: str, src: Placement, dst: Placement, axis: str = "tp") -> CommStep:
    return CommStep(kind, axis, None, src, dst, 0.0, "test")  # type: ignore[arg-type]


def test_all_gather_concatenates_in_coordinate_order() -> None:
    blocks = {0: np.array([[1.0], [2.0]]), 1: np.array([[3.0], [4.0]])}
    out = apply_step(blocks, LINE, step("all_gather", Shard(0), Replicate()))
    for r in (0, 1):
        np.testing.assert_array_equal(out[r], [[1.0], [2.0], [3.0], [4.0]])


def test_all_gather_runs_per_group_on_a_grid() -> None:
    blocks = {r: np.array([float(r)]) for r in range(4)}
    out = apply_step(blocks, GRID, step("all_gather", Shard(0), Replicate(), "dp"))
    np.testing.assert_array_equal(out[0], [0.0, 2.0])
    np.testing.assert_array_equal(out[3], [1.0, 3.0])


@pytest.mark.parametrize(("op", "want"), [("sum", 4.0), ("avg", 2.0), ("max", 3.0), ("min", 1.0)])
def test_all_reduce_applies_the_partial_op(op: str, want: float) -> None:
    blocks = {0: np.array([1.0, 1.0]), 1: np.array([3.0, 3.0])}
    out = apply_step(blocks, LINE, step("all_reduce", Partial(op), Replicate()))
    for r in (0, 1):
        np.testing.assert_array_equal(out[r], [want, want])


def test_reduce_scatter_sums_then_keeps_each_ranks_chunk() -> None:
    blocks = {0: np.array([1.0, 2.0]), 1: np.array([10.0, 20.0])}
    out = apply_step(blocks, LINE, step("reduce_scatter", Partial("sum"), Shard(0)))
    np.testing.assert_array_equal(out[0], [11.0])
    np.testing.assert_array_equal(out[1], [22.0])


def test_all_to_all_moves_the_split_to_another_dim() -> None:
    x = np.arange(16.0).reshape(4, 4)
    blocks = {0: x[:2], 1: x[2:]}  # S(0)
    out = apply_step(blocks, LINE, step("all_to_all", Shard(0), Shard(1)))
    np.testing.assert_array_equal(out[0], x[:, :2])
    np.testing.assert_array_equal(out[1], x[:, 2:])


def test_local_slice_keeps_the_ranks_chunk() -> None:
    x = np.arange(6.0).reshape(2, 3)
    out = apply_step({0: x, 1: x}, LINE, step("local_slice", Replicate(), Shard(0)))
    np.testing.assert_array_equal(out[0], x[:1])
    np.testing.assert_array_equal(out[1], x[1:])


def test_local_partial_zeroes_all_but_coordinate_zero_for_sum_only() -> None:
    x = np.ones(3)
    out = apply_step({0: x, 1: x}, LINE, step("local_partial", Replicate(), Partial("sum")))
    np.testing.assert_array_equal(out[1], np.zeros(3))
    np.testing.assert_array_equal(out[0], x)
    out = apply_step({0: x, 1: x}, LINE, step("local_partial", Replicate(), Partial("max")))
    np.testing.assert_array_equal(out[1], x)


def test_blocks_are_never_shared_between_ranks() -> None:
    out = apply_step(
        {0: np.ones(2), 1: np.ones(2)}, LINE, step("all_reduce", Partial(), Replicate())
    )
    out[0][0] = 5.0
    assert out[1][0] == 2.0


def test_apply_transition_checks_the_chain_and_shapes() -> None:
    src, dst = DistSpec.parse("S(0)", LINE), DistSpec.parse("R", LINE)
    blocks = {0: np.zeros((2, 2)), 1: np.zeros((2, 2))}
    with pytest.raises(ExecutionError, match="expects"):
        apply_transition(
            blocks, (4, 2), LINE, src, dst, [step("all_reduce", Partial(), Replicate())]
        )
    with pytest.raises(ExecutionError, match="end at"):
        apply_transition(blocks, (4, 2), LINE, src, dst, [])
    with pytest.raises(ExecutionError, match="expected"):
        apply_transition({0: np.zeros(1), 1: np.zeros(1)}, (4, 2), LINE, src, dst, [])
    done = apply_transition(
        blocks, (4, 2), LINE, src, dst, [step("all_gather", Shard(0), Replicate())]
    )
    assert done[1].shape == (4, 2)


def test_local_partial_from_a_shard_zero_pads_it() -> None:
    blocks = {0: np.array([1.0]), 1: np.array([2.0])}
    out = apply_step(blocks, LINE, step("local_partial", Shard(0), Partial("sum")))
    np.testing.assert_array_equal(out[0], [1.0, 0.0])
    np.testing.assert_array_equal(out[1], [0.0, 2.0])
    out = apply_step(blocks, LINE, step("local_partial", Shard(0), Partial("avg")))
    np.testing.assert_array_equal(out[1], [0.0, 4.0])
