"""Loss rules: cross_entropy (incl. vocab parallel) and mse_loss, semantics and numerics."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import shardlab.spmd  # noqa: F401  (attaches the rules)
from shardlab.ir import TensorType
from shardlab.mesh import Mesh
from shardlab.placement import DistSpec
from shardlab.spmd import InnerComm, infer
from shardlab.spmd.check import check_rule, sweep_rule

MESHES = [
    Mesh((2,), ("x",)),
    Mesh((4,), ("x",)),
    Mesh((2, 2), ("dp", "tp")),
    Mesh((2, 2, 2), ("pp", "dp", "tp")),
]
SAMPLED = 200  # arriving specs drawn at random on the (2, 2, 2) mesh
TOL = 1e-9


def options(mesh: Mesh) -> dict[str, Any]:
    """`sweep_rule` options: a seed per mesh, None arriving on 1-D meshes only."""
    return {"sampled": SAMPLED, "seed": math.prod(mesh.shape), "free_max_ndim": 1}


def spec(text: str, mesh: Mesh) -> DistSpec:
    return DistSpec.parse(text, mesh)


MESH2 = MESHES[2]
CE = "cross_entropy"
REDUCTIONS = ["mean", "sum"]
CE_CASES = {
    "tokens": [TensorType((8, 16)), TensorType((8,), "int64")],
    "batch-seq": [TensorType((2, 4, 8)), TensorType((2, 4), "int32")],
    "single": [TensorType((16,)), TensorType((), "int64")],
}


@pytest.mark.parametrize("mesh", MESHES, ids=str)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("case", CE_CASES)
@pytest.mark.parametrize("lse", [False, True], ids=["loss", "loss+lse"])
def test_cross_entropy_every_arriving_spec_matches_one_device(
    lse: bool, case: str, reduction: str, mesh: Mesh
) -> None:
    """The loss, and the log-sum-exp per label the training graph's forward keeps."""
    attrs = {"reduction": reduction, "lse": lse}
    kernels = sweep_rule(CE, CE_CASES[case], attrs, [mesh], **options(mesh))
    assert kernels["cross_entropy_vocab_parallel"] > 0 and kernels["default"] > 0, kernels


@pytest.mark.parametrize("mesh", MESHES, ids=str)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", [(8,), (4, 8), (2, 4, 4)], ids=str)
def test_mse_every_arriving_spec_matches_one_device(
    shape: tuple[int, ...], reduction: str, mesh: Mesh
) -> None:
    t = TensorType(shape)
    kernels = sweep_rule("mse_loss", [t, t], {"reduction": reduction}, [mesh], **options(mesh))
    assert kernels["default"] > 0


def test_vocab_sharded_cross_entropy_is_whole_with_inner_comms() -> None:
    """As torch's loss_parallel(): the max and the sum of exponentials in float32, then the
    target logit in the logits' dtype, all-reduced over the vocab axis: the loss (and the
    kept log-sum-exp) come out whole there."""
    logits, labels = TensorType((2, 4, 1024), "bfloat16"), TensorType((2, 4), "int64")
    rule = infer(CE, [logits, labels], [spec("RS(2)", MESH2), None], {"lse": True}, MESH2)
    assert [str(s) for s in rule.input_specs] == ["RS(2)", "RR"]
    assert [str(s) for s in rule.output_specs] == ["RR", "RR"]
    assert rule.kernel == "cross_entropy_vocab_parallel"
    stats, target = TensorType((2, 4), "float32"), TensorType((2, 4), "bfloat16")
    assert [(c.kind, c.op, c.axes, c.type) for c in rule.inner_comms] == [
        ("all_reduce", "max", ("tp",), stats),
        ("all_reduce", "sum", ("tp",), stats),
        ("all_reduce", "sum", ("tp",), target),
    ]
    assert all(isinstance(c, InnerComm) and c.reason for c in rule.inner_comms)
    assert "vocab parallel over tp" in rule.reason


def test_batch_sharded_cross_entropy_is_partial_avg_or_sum() -> None:
    logits, labels = TensorType((8, 1024)), TensorType((8,), "int64")
    arriving_ = [spec("S(0)R", MESH2), spec("S(0)R", MESH2)]
    rule = infer(CE, [logits, labels], arriving_, {}, MESH2)
    assert str(rule.output_specs[0]) == "P(avg)R"
    assert rule.kernel == "default" and rule.inner_comms == ()
    summed = infer(CE, [logits, labels], arriving_, {"reduction": "sum"}, MESH2)
    assert str(summed.output_specs[0]) == "P(sum)R"


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_mixed_batch_and_vocab_sharding(reduction: str) -> None:
    logits, labels = TensorType((8, 1024)), TensorType((8,), "int64")
    rng = np.random.default_rng(3)
    arriving_ = [spec("S(0)S(1)", MESH2), spec("S(0)R", MESH2)]
    check = check_rule(CE, [logits, labels], arriving_, {"reduction": reduction}, MESH2, rng)
    batch = "avg" if reduction == "mean" else "sum"
    assert str(check.rule.output_specs[0]) == f"P({batch})R"  # whole over the vocab axis
    assert check.rule.kernel == "cross_entropy_vocab_parallel"
    assert [c.axes for c in check.rule.inner_comms] == [("tp",)] * 3
    assert max(check.max_abs_error) < TOL


def test_vocab_over_two_axes_lists_both() -> None:
    logits, labels = TensorType((4, 1024), "bfloat16"), TensorType((4,), "int64")
    rule = infer(CE, [logits, labels], [spec("S(1)S(1)", MESH2), None], {}, MESH2)
    assert str(rule.output_specs[0]) == "RR"  # the kernel's all-reduces make it whole
    assert [c.axes for c in rule.inner_comms] == [("dp", "tp")] * 3
    assert [c.type.dtype for c in rule.inner_comms] == ["float32", "float32", "bfloat16"]


def test_losses_are_not_linear() -> None:
    logits, labels = TensorType((8, 16)), TensorType((8,), "int64")
    rule = infer(CE, [logits, labels], [spec("P(sum)R", MESH2), None], {}, MESH2)
    assert [str(s) for s in rule.input_specs] == ["RR", "RR"]
    t = TensorType((4, 8))
    rule = infer("mse_loss", [t, t], [spec("P(sum)R", MESH2), None], {}, MESH2)
    assert [str(s) for s in rule.input_specs] == ["RR", "RR"]


def test_mse_contracts_every_sharded_dim() -> None:
    t = TensorType((4, 8))
    arriving_ = [spec("S(0)S(1)", MESH2), None]
    rule = infer("mse_loss", [t, t], arriving_, {}, MESH2)
    assert [str(s) for s in rule.input_specs] == ["S(0)S(1)", "S(0)S(1)"]
    assert str(rule.output_specs[0]) == "P(avg)P(avg)"
    summed = infer("mse_loss", [t, t], arriving_, {"reduction": "sum"}, MESH2)
    assert str(summed.output_specs[0]) == "P(sum)P(sum)"
