"""Rules for dropout and dropout_grad: every placement they produce matches one device (the
mask bit for bit), partial inputs pass through with the mask replicated."""

from __future__ import annotations

import numpy as np
import pytest

import shardlab.spmd  # noqa: F401  (attaches the rules)
from shardlab.ir import TensorType
from shardlab.mesh import Mesh
from shardlab.placement import DistSpec
from shardlab.spmd import infer
from shardlab.spmd.check import check_rule, sweep_rule

MESHES = [Mesh((2,), ("x",)), Mesh((4,), ("x",)), Mesh((2, 2), ("dp", "tp"))]
CUBE = Mesh((2, 2, 2), ("x", "y", "z"))
X = TensorType((4, 4, 8, 6))
MASK = TensorType((4, 4, 8, 6), "bool")
ATTRS = {"p": 0.3, "seed": 1234}


@pytest.mark.parametrize("mesh", [*MESHES, CUBE], ids=str)
def test_dropout_every_arriving_spec_matches_one_device(mesh: Mesh) -> None:
    """The mask and y assembled from the ranks' blocks equal one device's (y up to the
    rounding of summing a partial input's blocks after the op)."""
    kernels = sweep_rule("dropout", [X], ATTRS, [mesh], sampled=100, tol=1e-12)
    assert set(kernels) == {"dropout_global_index"}


@pytest.mark.parametrize("mesh", [*MESHES, CUBE], ids=str)
def test_dropout_grad_every_arriving_spec_matches_one_device(mesh: Mesh) -> None:
    assert sweep_rule("dropout_grad", [X, MASK], {"p": 0.3}, [mesh], sampled=100).total() > 30


def test_sharded_mask_equals_the_one_device_mask_exactly() -> None:
    mesh = MESHES[2]
    rng = np.random.default_rng(0)
    for text in ("S(0)S(1)", "S(2)S(3)", "S(3)S(2)", "RS(2)", "S(1)R"):
        check = check_rule("dropout", [X], [DistSpec.parse(text, mesh)], ATTRS, mesh, rng)
        assert [str(s) for s in check.rule.output_specs] == [text, text]
        assert check.max_abs_error[1] == 0.0 and check.max_abs_error[0] < 1e-12


def test_partial_input_passes_through_with_the_mask_replicated() -> None:
    mesh = MESHES[2]
    arriving = DistSpec.parse("S(0)P(sum)", mesh)
    rule = infer("dropout", [X], [arriving], ATTRS, mesh)
    assert [str(s) for s in rule.input_specs] == ["S(0)P(sum)"]
    assert [str(s) for s in rule.output_specs] == ["S(0)P(sum)", "S(0)R"]
    assert rule.kernel == "dropout_global_index" and "global index" in rule.reason
    hinted = infer("dropout", [X], [arriving], ATTRS, mesh, [DistSpec.parse("S(0)S(1)", mesh)])
    assert [str(s) for s in hinted.output_specs] == ["S(0)S(1)", "S(0)S(1)"]
    grad = infer("dropout_grad", [X, MASK], [arriving, DistSpec.parse("S(0)R", mesh)],
                 {"p": 0.3}, mesh)  # fmt: skip
    assert [str(s) for s in grad.input_specs] == ["S(0)P(sum)", "S(0)R"]
    assert str(grad.output_specs[0]) == "S(0)P(sum)"
