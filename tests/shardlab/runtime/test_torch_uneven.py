"""Uneven shards on the torch backend (gloo ranks): padded all_gather / reduce_scatter,
all_to_all with split sizes, per-rank kernels, checked against one device.

Blocks are DTensor's (`torch.chunk`: ceil-sized, the tail ones short or empty). A batch of 6
annotated on dp=4 (blocks 2, 2, 2, 0: the last rank computes on empty blocks), an odd vocab
on tp=4 (Megatron's vocab-parallel embedding and loss over blocks of 65, 65, 65 and 62 rows)
and a sequence of 7 under sequence parallelism (reduce-scatter and all-gather of 4 + 3
tokens). Empty blocks: a vocab of 6 on tp=4 (2, 2, 2, 0 rows), mlp_demo with parameters
and labels annotated over more ranks than they have columns (all_gather, all_to_all and
local slices of zero-size pieces), and every reshard of small tensors on 4 gloo ranks
(`test_every_reshard_with_empty_blocks_runs_on_gloo_ranks`).
"""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest

from shardlab.mesh import Mesh
from shardlab.models import build_model
from shardlab.placement import (
    DistSpec,
    Partial,
    Placement,
    Replicate,
    Shard,
    empty_blocks,
    is_even,
    local_shape_on,
)
from shardlab.plan import build_plan
from shardlab.program import DistProgram
from shardlab.reshard import CommStep, plan_transition
from shardlab.runtime.distribute import distribute
from shardlab.runtime.reshard_exec import apply_transition
from shardlab.runtime.verify import verify
from shardlab.strategy import Strategy
from tests.shardlab.runtime.torch_reshard_ranks import reshard_job

pytest.importorskip("torch.distributed")

GPT2 = {"layers": 1, "hidden": 32, "heads": 4, "seq": 8, "batch": 6, "vocab": 257}


def uneven_steps(program: DistProgram) -> Counter[str]:
    """Comm steps whose source or target leaves ranks blocks of different sizes, by kind."""
    out: Counter[str] = Counter()
    for op in program.ops:
        if op.comm is None:
            continue
        for v in (*op.inputs, *op.outputs):
            if not is_even(program.types[v].shape, program.mesh, program.specs[v].placements):
                out[op.comm.kind] += 1
                break
    return out


#: The dp template's annotations, written out: the template refuses a batch its axis does
#: not divide, an annotation may still split one (as DTensor cuts it).
BATCH = ["tokens=dp:S(0)", "labels=dp:S(0)"]
#: mlp_demo with w0's 6 columns on tp=4 (2, 2, 2, 0), w1's and the labels' 3 classes on
#: tp=4 (1, 1, 1, 0: fewer than the ranks, so no rule computes on them split).
MLP = {"batch": 6, "hidden": 6, "classes": 3}
MLP_ANNOTATIONS = ["w0=S(1)", "w1=S(1)", "label=S(1)"]


def empty_steps(program: DistProgram) -> Counter[str]:
    """Comm steps whose source or target leaves some rank an empty block, by kind."""
    out: Counter[str] = Counter()
    for op in program.ops:
        if op.comm is None:
            continue
        for v in (*op.inputs, *op.outputs):
            if empty_blocks(program.types[v].shape, program.mesh, program.specs[v].placements):
                out[op.comm.kind] += 1
                break
    return out


@pytest.mark.parametrize(
    ("mesh", "templates", "annotations", "config", "kinds"),
    [
        ("dp=4", [], BATCH, GPT2, {"all_gather"}),
        ("tp=4", ["megatron_tp"], [], {**GPT2, "batch": 2}, {"local_slice"}),
        (
            "dp=2,tp=2",
            ["dp", "megatron_tp", "sequence_parallel"],
            [],
            {**GPT2, "seq": 7},
            {"all_gather", "reduce_scatter", "all_to_all", "local_slice"},
        ),
    ],
    ids=["dp4-batch6", "tp4-vocab257", "dp2-tp2-sp-seq7"],
)
def test_uneven_shards_verify_on_torch_ranks(
    mesh: str,
    templates: list[str],
    annotations: list[str],
    config: dict[str, object],
    kinds: set[str],
) -> None:
    plan = build_plan(build_model("gpt2", config), Strategy.build(mesh, templates, annotations))
    assert set(uneven_steps(plan.program)) == kinds
    report = verify(plan, backend="torch")
    assert report.ok, (report.first_divergence, report.failed()[:3])
    assert report.summary["compared"] > 20


@pytest.mark.parametrize(
    ("preset", "config", "templates", "annotations", "kinds"),
    [
        ("gpt2", {**GPT2, "batch": 2, "vocab": 6}, ["megatron_tp"], [], {"local_slice"}),
        ("mlp_demo", MLP, [], MLP_ANNOTATIONS, {"all_gather", "all_to_all", "local_slice"}),
    ],
    ids=["tp4-vocab6", "mlp-empty-params"],
)
def test_empty_blocks_verify_on_torch_ranks(
    preset: str,
    config: dict[str, object],
    templates: list[str],
    annotations: list[str],
    kinds: set[str],
) -> None:
    plan = build_plan(build_model(preset, config), Strategy.build("tp=4", templates, annotations))
    assert set(empty_steps(plan.program)) == kinds
    if preset == "gpt2":  # the vocab-parallel kernels run on the last rank's empty rows
        kernels = {op.kind: op.kernel for op in plan.program.ops}
        assert kernels["embedding"] == "embedding_vocab_parallel"
        assert kernels["cross_entropy"] == "cross_entropy_vocab_parallel"
    report = verify(plan, backend="torch")
    assert report.ok, (report.first_divergence, report.failed()[:3])
    assert report.summary["compared"] > 5


CHOICES: list[Placement] = [Replicate(), Shard(0), Shard(1), Partial("sum"), Partial("max")]


def _reshard_cases(
    shape: tuple[int, int], mesh: Mesh
) -> list[tuple[tuple[int, int], DistSpec, DistSpec, tuple[CommStep, ...]]]:
    """Every pair of placements of `shape` on `mesh` where some rank holds an empty block."""
    specs = [DistSpec(mesh, p) for p in itertools.product(CHOICES, repeat=mesh.ndim)]
    out = []
    for src, dst in itertools.product(specs, repeat=2):
        if empty_blocks(shape, mesh, src.placements) or empty_blocks(shape, mesh, dst.placements):
            out.append((shape, src, dst, plan_transition(shape, "float32", mesh, src, dst)))
    return out


@pytest.mark.parametrize(
    ("mesh", "shapes", "count"),
    [
        (Mesh((4,), ("tp",)), [(6, 10), (3, 5)], 25),
        (Mesh((2, 2), ("dp", "tp")), [(3, 2)], 96),
    ],
    ids=["4", "2x2"],
)
def test_every_reshard_with_empty_blocks_runs_on_gloo_ranks(
    mesh: Mesh, shapes: list[tuple[int, int]], count: int
) -> None:
    """Gathers, reduce-scatters, all_to_alls and slices of zero-size pieces through the
    torch backend's collectives give every rank the block the simulated mesh gives it."""
    from shardlab.runtime.torch_launch import spawn

    cases = [case for shape in shapes for case in _reshard_cases(shape, mesh)]
    assert len(cases) == count
    rng = np.random.default_rng(3)
    sources = [distribute(rng.standard_normal(shape), src, rng) for shape, src, _, _ in cases]
    common = {"mesh": mesh, "cases": [(shape, src.placements, steps)
                                      for shape, src, _, steps in cases]}  # fmt: skip
    mine = [[blocks[r] for blocks in sources] for r in mesh.ranks]
    got = spawn(reshard_job, common, mine, timeout_s=120)
    kinds: Counter[str] = Counter()
    for (shape, src, dst, steps), blocks, i in zip(cases, sources, itertools.count(), strict=False):
        want = apply_transition(blocks, shape, mesh, src, dst, steps)
        kinds.update(s.kind for s in steps)
        for r in mesh.ranks:
            assert got[r][i].shape == local_shape_on(shape, mesh, dst.placements, r)
            np.testing.assert_allclose(got[r][i], want[r], err_msg=f"{src} -> {dst}, rank {r}")
    assert set(kinds) >= {"all_gather", "reduce_scatter", "all_to_all", "local_slice"}
