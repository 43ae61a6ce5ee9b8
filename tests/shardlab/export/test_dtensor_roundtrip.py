"""The DTensor export applied for real: gloo ranks exec the generated module on a torch
model with the preset's FQNs; every parameter's DTensor placements equal the plan's (through
the layout rule) and one training step matches a single-process step.

Ranks are spawned as the torch backend spawns them (`runtime.torch_launch.spawn`: forkserver,
one BLAS thread per rank); the rank job lives in `dtensor_ranks.py`.
"""

from __future__ import annotations

import pytest

from shardlab.models import build_model
from shardlab.plan import build_plan
from shardlab.strategy import Strategy

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

from tests.shardlab.export.dtensor_ranks import TinyConfig, round_trip  # noqa: E402

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


@pytest.mark.parametrize(("mesh", "templates", "optimizer", "lr"), CASES,
                         ids=[f"{m}:{'+'.join(t)}" for m, t, _, _ in CASES])  # fmt: skip
def test_exported_module_places_and_steps_like_the_plan(
    mesh: str, templates: list[str], optimizer: str, lr: float
) -> None:
    plan = build_plan(build_model("llama3-8b", TINY), Strategy.build(mesh, templates),
                      optimizer=optimizer, lr=lr, passes=False)  # fmt: skip
    round_trip(plan, "tiny", CFG, optimizer, lr)
