"""The embedding rule: semantics (vocab parallel, H sharded, partial table) and numerics."""

from __future__ import annotations

import math
from typing import Any

import pytest

import shardlab.spmd  # noqa: F401  (attaches the rules)
from shardlab.ir import TensorType
from shardlab.mesh import Mesh
from shardlab.placement import DistSpec
from shardlab.spmd import infer
from shardlab.spmd.check import all_specs, sweep_rule

MESHES = [
    Mesh((2,), ("x",)),
    Mesh((4,), ("x",)),
    Mesh((2, 2), ("dp", "tp")),
    Mesh((2, 2, 2), ("pp", "dp", "tp")),
]
SAMPLED = 200  # arriving specs drawn at random on the (2, 2, 2) mesh


def options(mesh: Mesh) -> dict[str, Any]:
    """`sweep_rule` options: a seed per mesh, None arriving on 1-D meshes only."""
    return {"sampled": SAMPLED, "seed": math.prod(mesh.shape), "free_max_ndim": 1}


def spec(text: str, mesh: Mesh) -> DistSpec:
    return DistSpec.parse(text, mesh)


IDS = TensorType((2, 4), "int64")
TABLE = TensorType((64, 8), "float32")
BIG_TABLE = TensorType((4096, 64), "float32")
MESH2 = MESHES[2]


@pytest.mark.parametrize("mesh", MESHES, ids=str)
@pytest.mark.parametrize(
    "ids", [TensorType((8,), "int64"), IDS, TensorType((2, 2, 4), "int32")], ids=str
)
def test_every_arriving_spec_matches_one_device(ids: TensorType, mesh: Mesh) -> None:
    kernels = sweep_rule("embedding", [ids, TABLE], {}, [mesh], **options(mesh))
    assert kernels["embedding_vocab_parallel"] > 0 and kernels["default"] > 0, kernels


def test_vocab_parallel_gives_partial_sum_and_names_the_kernel() -> None:
    rule = infer("embedding", [IDS, BIG_TABLE], [spec("RR", MESH2), spec("RS(0)", MESH2)],
                 {}, MESH2)  # fmt: skip
    assert [str(s) for s in rule.input_specs] == ["RR", "RS(0)"]
    assert str(rule.output_specs[0]) == "RP(sum)"
    assert rule.kernel == "embedding_vocab_parallel"
    assert "vocab parallel over tp" in rule.reason
    assert rule.inner_comms == ()


def test_vocab_over_two_axes() -> None:
    rule = infer("embedding", [IDS, BIG_TABLE], [None, spec("S(0)S(0)", MESH2)], {}, MESH2)
    assert str(rule.output_specs[0]) == "P(sum)P(sum)"
    assert rule.kernel == "embedding_vocab_parallel"


def test_hidden_sharded_table_shards_the_output() -> None:
    rule = infer("embedding", [IDS, TABLE], [spec("S(0)R", MESH2), spec("RS(1)", MESH2)],
                 {}, MESH2)  # fmt: skip
    assert [str(s) for s in rule.input_specs] == ["S(0)R", "RS(1)"]
    assert str(rule.output_specs[0]) == "S(0)S(2)"
    assert rule.kernel == "default"


def test_partial_table_passes_through_with_ids_replicated() -> None:
    rule = infer("embedding", [IDS, BIG_TABLE], [spec("RS(1)", MESH2), spec("P(sum)R", MESH2)],
                 {}, MESH2)  # fmt: skip
    assert [str(s) for s in rule.input_specs] == ["RS(1)", "P(sum)R"]
    assert str(rule.output_specs[0]) == "P(sum)S(1)"
    assert "linear" in rule.reason


def test_ids_are_never_partial() -> None:
    for mesh in MESHES[:3]:
        for ids_spec in all_specs(IDS, mesh):
            for table_spec in all_specs(TABLE, mesh):
                rule = infer("embedding", [IDS, TABLE], [ids_spec, table_spec], {}, mesh)
                assert not rule.input_specs[0].has_partial()
