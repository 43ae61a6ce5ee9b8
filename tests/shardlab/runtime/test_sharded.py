"""The lockstep executor: rank groups along mesh axes, and collectives a kernel requests."""

from __future__ import annotations

from collections.abc import Generator, Sequence

import numpy as np
import pytest

from shardlab.errors import ExecutionError
from shardlab.ir import TensorType
from shardlab.mesh import Mesh
from shardlab.ops.base import Array, Attrs
from shardlab.placement import DistSpec
from shardlab.runtime.kernels import KERNELS, CollectiveRequest, Kernel, LocalContext
from shardlab.runtime.sharded import axes_group, run_sharded_op
from shardlab.spmd.result import RuleResult

CUBE = Mesh((2, 2, 2), ("pp", "dp", "tp"))  # rank = 4 pp + 2 dp + tp
T = TensorType((2,))


def test_axes_group() -> None:
    assert axes_group(CUBE, 0, ["tp"]) == (0, 1)
    assert axes_group(CUBE, 5, ["dp"]) == (5, 7)
    assert axes_group(CUBE, 5, ["pp", "tp"]) == (0, 1, 4, 5)
    assert axes_group(CUBE, 6, []) == (6,)
    assert axes_group(CUBE, 3, ["pp", "dp", "tp"]) == tuple(range(8))
    shuffled = Mesh((2, 2), ("dp", "tp"), (3, 0, 2, 1))
    assert axes_group(shuffled, 2, ["tp"]) == (2, 1)  # positions (1, 0) and (1, 1)


def _rule(kernel: str, text: str = "RRR") -> RuleResult:
    spec = DistSpec.parse(text, CUBE)
    return RuleResult((spec,), (spec,), "test", kernel=kernel)


def _stats_kernel(
    kind: str, xs: Sequence[Array], attrs: Attrs, ctx: LocalContext
) -> Generator[CollectiveRequest, Array, list[Array]]:
    """Two collectives in a row; the second depends on the first's reply."""
    (x,) = xs
    top = yield CollectiveRequest("max", tuple(attrs["axes"]), x)
    total = yield CollectiveRequest("sum", tuple(attrs["axes"]), x - top)
    return [np.asarray(total)]


def _install(monkeypatch: pytest.MonkeyPatch, name: str, kernel: Kernel) -> None:
    monkeypatch.setitem(KERNELS, name, kernel)


@pytest.mark.parametrize("axes", [["tp"], ["dp"], ["pp", "tp"], ["pp", "dp", "tp"]])
def test_generator_kernels_run_in_lockstep(
    monkeypatch: pytest.MonkeyPatch, axes: list[str]
) -> None:
    _install(monkeypatch, "stats", _stats_kernel)
    local = {r: [np.array([float(r), -float(r)])] for r in CUBE.ranks}
    out = run_sharded_op("neg", {"axes": axes}, _rule("stats"), [T], [T], local)
    for r in CUBE.ranks:
        group = axes_group(CUBE, r, axes)
        xs = np.array([local[g][0] for g in group])
        want = np.sum(xs - xs.max(axis=0), axis=0)
        np.testing.assert_array_equal(out[r][0], want)


def test_ranks_that_stop_early_are_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def uneven(
        kind: str, xs: Sequence[Array], attrs: Attrs, ctx: LocalContext
    ) -> Generator[CollectiveRequest, Array, list[Array]]:
        if ctx.rank % 2:
            yield CollectiveRequest("sum", ("tp",), xs[0])
        return [xs[0]]

    _install(monkeypatch, "uneven", uneven)
    local = {r: [np.zeros(2)] for r in CUBE.ranks}
    with pytest.raises(
        ExecutionError, match=r"ranks \[0, 2, 4, 6\] finished while ranks \[1, 3, 5, 7\] wait"
    ):
        run_sharded_op("neg", {}, _rule("uneven"), [T], [T], local)


def test_plain_kernels_and_ops_without_inputs() -> None:
    local = {r: [np.array([1.0, float(r)])] for r in CUBE.ranks}
    out = run_sharded_op("neg", {}, _rule("default"), [T], [T], local)
    assert all(np.array_equal(out[r][0], -local[r][0]) for r in CUBE.ranks)
    spec = DistSpec.parse("S(0)RR", CUBE)
    table = TensorType((4, 2))
    rule = RuleResult((), (spec, spec), "test", kernel="replicated")
    out = run_sharded_op("rope_cache", {"seq": 4, "head_dim": 4}, rule, [], [table, table],
                         {r: [] for r in CUBE.ranks})  # fmt: skip
    assert out[0][0].shape == (2, 2) and out[4][0][0, 0] == np.cos(2.0)
