"""Rules for autodiff kinds: numerically exact on every arriving spec, no fallback."""

from __future__ import annotations

from typing import Any

import pytest

import shardlab.spmd  # noqa: F401  (attaches the rules)
from shardlab.autodiff import training_graph
from shardlab.ir import TensorType
from shardlab.mesh import Mesh
from shardlab.models import build_model
from shardlab.spmd.check import sweep_rule
from shardlab.spmd.complete import complete
from shardlab.strategy import Strategy

MESHES = [Mesh((2,), ("x",)), Mesh((2, 2), ("dp", "tp"))]
F = TensorType
X = F((4, 4, 8))
CASES: list[tuple[str, list[TensorType], dict[str, Any]]] = [
    ("fill", [], {"shape": [4, 8], "value": 1.0, "dtype": "float32"}),
    ("silu_grad", [X, X], {}),
    ("gelu_grad", [X, X], {"approximate": "tanh"}),
    ("sgd", [F((8, 4)), F((8, 4))], {"lr": 0.1}),
    ("rms_norm_grad", [X, F((8,)), X], {"eps": 1e-6}),
    ("layer_norm_grad", [X, F((8,)), X], {"eps": 1e-5}),
    (
        "cross_entropy_grad",
        [F((4, 4, 8)), F((4, 4), "int64"), F(()), F((4, 4))],
        {"reduction": "mean"},
    ),
    ("broadcast_to", [F((4, 1, 8))], {"shape": [2, 4, 4, 8]}),
    ("slice_grad", [F((4, 2, 8))], {"dim": 1, "start": 1, "stop": 3, "size": 4}),
    ("max_grad", [X, F((4, 8)), F((4, 8))], {"dims": [1]}),
    ("max_grad", [X, F((4, 4, 1)), F((4, 4, 1))], {"dims": [2], "keepdim": True}),
    ("embedding_grad", [F((4, 4), "int64"), F((4, 4, 8))], {"vocab": 16}),
]


@pytest.mark.parametrize(("kind", "types", "attrs"), CASES, ids=[c[0] for c in CASES])
def test_backward_rules_match_one_device(
    kind: str, types: list[TensorType], attrs: dict[str, Any]
) -> None:
    kernels = sweep_rule(kind, types, attrs, MESHES, sampled=50)
    assert kernels.total() > 0


def test_adamw_rule_matches_one_device_for_every_param_grad_pair() -> None:
    """Four inputs: every (param, grad) pair of specs, the moments drawn at random."""
    types = [F((8, 4))] * 4
    attrs = {"lr": 0.1, "step": 3, "weight_decay": 0.01}
    assert sweep_rule("adamw", types, attrs, MESHES, pair=(0, 1)).total() > 0


def test_dp_gradients_come_out_partial_and_are_all_reduced_for_the_optimizer() -> None:
    overrides = {"layers": 1, "hidden": 32, "heads": 4, "kv_heads": 2, "ffn": 64}
    overrides |= {"vocab": 32, "seq": 8, "batch": 4}
    tg = training_graph(build_model("llama3-8b", overrides))
    done = complete(tg, Strategy.build("dp=2", ["dp"]))
    assert done.fallback_ops() == []
    grad = "layers.0.mlp.up_proj.weight.grad"
    assert str(done.specs[grad]) == "P(sum)"
    update = done.graph.op("layers.0.mlp.up_proj.weight.adamw")
    assert str(done.rules[update.name].input_specs[1]) == "R"


def test_attention_grad_rule_matches_one_device_on_sampled_specs() -> None:
    """Four 4-D inputs make the exhaustive 2-D product too large: sample on a (2,2,1) mesh."""
    q, kv = F((2, 4, 4, 4)), F((2, 4, 2, 4))
    mesh = Mesh((2, 2, 1), ("dp", "tp", "sp"))
    kernels = sweep_rule("attention_grad", [q, kv, kv, q], {"causal": True}, [mesh], sampled=60)
    assert kernels.total() > 0


@pytest.mark.parametrize("preset", ["mlp_demo", "gpt2", "llama2-7b", "llama3-8b"])
@pytest.mark.parametrize(
    ("mesh", "templates"),
    [("dp=2,tp=2,sp=2", ["dp", "megatron_tp", "sequence_parallel"]), ("dp=8", ["fsdp"])],
)
def test_training_graphs_of_presets_complete_without_fallback(
    preset: str, mesh: str, templates: list[str]
) -> None:
    overrides: dict[str, Any] = {}
    if preset != "mlp_demo":
        overrides = {"layers": 2, "vocab": 50304} if preset == "gpt2" else {"layers": 2}
    if preset == "mlp_demo" and "megatron_tp" in templates:
        templates = ["dp"]
    done = complete(training_graph(build_model(preset, overrides)), Strategy.build(mesh, templates))
    assert done.fallback_ops() == []
