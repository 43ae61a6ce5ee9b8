"""Uneven shards on the torch backend (gloo ranks): padded all_gather / reduce_scatter,
all_to_all with split sizes, per-rank kernels, checked against one device.

A batch of 6 on dp=4 (blocks 2, 2, 1, 1), an odd vocab on tp=4 (Megatron's vocab-parallel
embedding and loss over blocks of 65 and 64 rows) and a sequence of 7 under sequence
parallelism (reduce-scatter and all-gather of 4 + 3 tokens).
"""

from __future__ import annotations

from collections import Counter

import pytest

from shardlab.models import build_model
from shardlab.placement import is_even
from shardlab.plan import build_plan
from shardlab.program import DistProgram
from shardlab.runtime.verify import verify
from shardlab.strategy import Strategy

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


@pytest.mark.parametrize(
    ("mesh", "templates", "config", "kinds"),
    [
        ("dp=4", ["dp"], GPT2, {"all_gather"}),
        ("tp=4", ["megatron_tp"], {**GPT2, "batch": 2}, {"local_slice"}),
        (
            "dp=2,tp=2",
            ["dp", "megatron_tp", "sequence_parallel"],
            {**GPT2, "seq": 7},
            {"all_gather", "reduce_scatter", "all_to_all", "local_slice"},
        ),
    ],
    ids=["dp4-batch6", "tp4-vocab257", "dp2-tp2-sp-seq7"],
)
def test_uneven_shards_verify_on_torch_ranks(
    mesh: str, templates: list[str], config: dict[str, object], kinds: set[str]
) -> None:
    plan = build_plan(build_model("gpt2", config), Strategy.build(mesh, templates))
    assert set(uneven_steps(plan.program)) == kinds
    report = verify(plan, backend="torch")
    assert report.ok, (report.first_divergence, report.failed()[:3])
    assert report.summary["compared"] > 20
