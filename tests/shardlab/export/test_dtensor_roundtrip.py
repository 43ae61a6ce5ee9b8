"""The DTensor export applied for real: gloo ranks exec the generated module on a torch
model with the preset's FQNs; every parameter's DTensor placements equal the plan's (through
the layout rule) and one training step matches a single-process step.

Ranks are spawned as the torch backend spawns them (`runtime.torch_launch.spawn`: forkserver,
one BLAS thread per rank); the rank job lives in `dtensor_ranks.py`.
"""

from __future__ import annotations

import numpy as np
import pytest

from shardlab.export.dtensor import derive_export, render_dtensor
from shardlab.export.parameters import parameter_layouts
from shardlab.models import build_model
from shardlab.placement import Shard
from shardlab.plan import Plan, build_plan
from shardlab.strategy import Strategy

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

from shardlab.runtime.torch_launch import spawn  # noqa: E402
from tests.shardlab.export.dtensor_ranks import (  # noqa: E402
    TinyConfig,
    build,
    rank_job,
    reference,
)

CFG = TinyConfig()
TINY = {"layers": CFG.layers, "hidden": CFG.hidden, "heads": CFG.heads,
        "kv_heads": CFG.kv_heads, "ffn": CFG.ffn, "vocab": CFG.vocab, "seq": CFG.seq,
        "batch": CFG.batch}  # fmt: skip
#: (mesh, templates, optimizer, learning rate)
CASES = [
    ("tp=2", ["megatron_tp", "sequence_parallel"], "sgd", 0.5),
    ("dp=2", ["fsdp"], "adamw", 1e-3),
    ("dp=2,tp=2", ["dp", "megatron_tp"], "sgd", 0.5),
    ("dp=2,tp=2", ["fsdp", "megatron_tp", "sequence_parallel"], "sgd", 0.5),
]


def _expected(plan: Plan) -> dict[str, dict[str, str]]:
    """Every parameter's placement per mesh axis in torch's layout, as the plan says."""
    return {
        p.name: {
            axis: (f"S({x.dim})" if isinstance(x, Shard) else "R")
            for axis, x in p.torch_placements().items()
        }
        for p in parameter_layouts(plan)
    }


@pytest.mark.parametrize(("mesh", "templates", "optimizer", "lr"), CASES,
                         ids=[f"{m}:{'+'.join(t)}" for m, t, _, _ in CASES])  # fmt: skip
def test_exported_module_places_and_steps_like_the_plan(
    mesh: str, templates: list[str], optimizer: str, lr: float
) -> None:
    plan = build_plan(build_model("llama3-8b", TINY), Strategy.build(mesh, templates),
                      optimizer=optimizer, lr=lr, passes=False)  # fmt: skip
    export = derive_export(plan)
    batch_axes = [a for a in export.mesh_axes if a in export.data_axes or a == export.fsdp_axis]
    common = {"source": render_dtensor(plan), "cfg": CFG, "optimizer": optimizer, "lr": lr,
              "batch_axes": batch_axes}  # fmt: skip
    ranks = spawn(rank_job, common, [None] * plan.strategy.mesh.size, timeout_s=120)

    want = _expected(plan)
    for rank, result in enumerate(ranks):
        got = result["placements"]
        assert set(got) == set(want), f"rank {rank}: parameters differ"
        for name, axes in want.items():
            have = {axis: got[name].get(axis, "R") for axis in axes}  # not on its mesh: R
            assert have == axes, f"rank {rank}, {name}: DTensor {got[name]}, plan {axes}"
            assert set(got[name]) <= set(axes), f"{name} on axes the plan lacks: {got[name]}"
    assert any(any(p != "R" for p in axes.values()) for axes in want.values())

    loss, params = reference(CFG, optimizer, lr)
    mean_loss = sum(r["loss"] for r in ranks) / len(ranks)  # equal batch shards: the mean
    assert mean_loss == pytest.approx(loss, rel=1e-5)
    stepped = ranks[0]["params"]
    assert set(stepped) == set(params)
    # SGD: the update is lr x the gradient (tight); AdamW's first step is lr x about sign(g),
    # so an element whose gradient is near zero may move by a fraction of lr
    atol = 1e-5 if optimizer == "sgd" else 1e-4
    for name, value in params.items():
        np.testing.assert_allclose(stepped[name], value, rtol=1e-4, atol=atol, err_msg=name)
    initial = {n: p.detach().numpy() for n, p in build(CFG).named_parameters()}
    moved = [float(np.abs(params[n] - initial[n]).max()) for n in params]
    assert min(moved) > 10 * atol  # the step moved every parameter well beyond the tolerance
