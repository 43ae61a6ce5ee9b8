"""The op catalog as a whole: every kind is documented, runnable and independently tested."""

from __future__ import annotations

import pytest

from shardlab.errors import GraphError
from shardlab.ops import all_ops, get_op

#: Kinds whose numpy implementation a test module of this folder checks against an
#: independent computation (torch, or a plain-Python loop from the formula). A new kind
#: must get such a test, then be added here.
INDEPENDENTLY_CHECKED = {
    # test_linalg.py
    "matmul",
    "linear",
    # test_elementwise.py
    "add",
    "sub",
    "mul",
    "div",
    "neg",
    "relu",
    "gelu",
    "silu",
    "sigmoid",
    "tanh",
    "exp",
    "log",
    "square",
    "sqrt",
    "rsqrt",
    "scale",
    "cast",
    # test_reduce.py
    "sum",
    "mean",
    "max",
    # test_softmax.py
    "softmax",
    "log_softmax",
    "masked_softmax",
    "masked_softmax_grad",
    # test_dropout.py
    "dropout",
    "dropout_grad",
    # test_norm.py
    "layer_norm",
    "rms_norm",
    # test_embedding.py
    "embedding",
    # test_rope.py
    "rope_cache",
    "rotary_embedding",
    # test_attention.py
    "scaled_dot_product_attention",
    # test_loss.py
    "cross_entropy",
    "mse_loss",
    # test_shape.py
    "reshape",
    "transpose",
    "permute",
    "split",
    "concat",
    "slice",
    # test_opaque.py
    "opaque",
    # test_autodiff_ops.py
    "fill",
    "broadcast_to",
    "relu_grad",
    "gelu_grad",
    "silu_grad",
    "sigmoid_grad",
    "tanh_grad",
    "max_grad",
    "slice_grad",
    "layer_norm_grad",
    "rms_norm_grad",
    "attention_grad",
    "cross_entropy_grad",
    "embedding_grad",
    "main_grad",
    "sgd",
    "adamw",
    # tests/shardlab/passes/test_data_parallel.py (buffers the passes build)
    "pack",
    "unpack",
    # tests/shardlab/runtime/test_hazards.py (synchronisation; no data)
    "wait",
    "hold",
    "free",
}
#: Kinds the runtimes execute themselves (data moves between ranks): no numpy function.
RUNTIME_KINDS = {"send", "recv"}

KINDS = [d.kind for d in all_ops()]


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_is_documented_runnable_and_checked(kind: str) -> None:
    opdef = get_op(kind)
    assert opdef.doc.strip(), f"{kind} has no doc"
    if kind not in RUNTIME_KINDS:
        assert opdef.numpy_impl is not None, f"{kind} has no numpy implementation"
        assert kind in INDEPENDENTLY_CHECKED, f"{kind} has no independent-check test"
    assert opdef.family, f"{kind} has no family"
    assert opdef.min_inputs >= 0
    assert opdef.max_inputs is None or opdef.max_inputs >= opdef.min_inputs


def test_no_stale_entries() -> None:
    assert set(KINDS) >= INDEPENDENTLY_CHECKED


def test_families_are_the_modules() -> None:
    assert {d.family for d in all_ops()} == {
        "attention",
        "autodiff_ops",
        "buffer_ops",
        "dropout",
        "elementwise",
        "embedding",
        "linalg",
        "loss",
        "norm",
        "opaque",
        "reduce",
        "rope",
        "shape",
        "softmax",
        "sync_ops",
    }
    for opdef in all_ops():
        assert opdef.infer.__module__ == f"shardlab.ops.{opdef.family}", opdef.kind


def test_unknown_kind_points_at_opaque() -> None:
    with pytest.raises(GraphError, match=r"unknown op kind 'nope'.*'opaque'"):
        get_op("nope")
