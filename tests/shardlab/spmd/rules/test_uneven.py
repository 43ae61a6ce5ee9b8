"""Rules on uneven shards: dims that do not divide their mesh axes, executed per rank.

Every op below is checked numerically (`sweep_rule`: every arriving spec combination on the
1-D meshes and on (2, 3), there only every pair of the first two inputs for ops of three)
with sizes such as 5, 6, 7 and 10 on 3 or 4 ranks, so ranks hold blocks of different sizes;
the rule must either compute with them (offsets from each rank's own range) or ask for
another layout.
"""

from __future__ import annotations

from typing import Any

import pytest

import shardlab.spmd  # noqa: F401  (attaches the rules)
from shardlab.ir import TensorType
from shardlab.mesh import Mesh
from shardlab.placement import DistSpec
from shardlab.spmd import infer
from shardlab.spmd.check import sweep_rule

MESHES = [Mesh((3,), ("x",)), Mesh((4,), ("x",)), Mesh((2, 3), ("dp", "tp"))]
X = TensorType((6, 5, 7))
IDS = TensorType((6, 5), "int64")
TABLE = TensorType((10, 7))
Q = TensorType((2, 5, 6, 4))
KV = TensorType((2, 5, 3, 4))

CASES: list[tuple[str, list[TensorType], dict[str, Any]]] = [
    ("add", [X, TensorType((7,))], {}),
    ("relu", [X], {}),
    ("matmul", [X, TensorType((7, 5))], {}),
    ("sum", [X], {"dims": [1]}),
    ("mean", [X], {"dims": [0, 1]}),
    ("mean", [X], {"dims": [2], "keepdim": True}),
    ("max", [X], {"dims": [0]}),
    ("softmax", [X], {"dim": -1}),
    ("layer_norm", [X, TensorType((7,)), TensorType((7,))], {"eps": 1e-5}),
    ("reshape", [TensorType((6, 5, 12))], {"shape": [6, 5, 4, 3]}),  # split heads: 4 on 3
    ("reshape", [TensorType((6, 5, 4, 3))], {"shape": [6, 5, 12]}),  # merge heads
    ("reshape", [X], {"shape": [30, 7]}),
    ("transpose", [X], {"dim0": 0, "dim1": 2}),
    ("slice", [X], {"dim": 1, "start": 1, "stop": 4}),
    ("concat", [X, TensorType((6, 5, 3))], {"dim": -1}),
    ("split", [X], {"dim": 2, "sizes": [3, 4]}),
    ("cross_entropy", [TensorType((6, 10)), TensorType((6,), "int64")], {}),
    ("cross_entropy", [TensorType((5, 3, 10)), TensorType((5, 3), "int64")], {"reduction": "sum"}),
    ("mse_loss", [X, X], {}),
    ("embedding", [IDS, TABLE], {}),
    ("embedding_grad", [IDS, TensorType((6, 5, 7))], {"vocab": 10}),
    ("broadcast_to", [TensorType((1, 7))], {"shape": [6, 7]}),
    ("scaled_dot_product_attention", [Q, Q, Q], {"causal": True}),
    ("scaled_dot_product_attention", [Q, KV, KV], {"causal": True}),  # 6 query, 3 kv heads
    ("rotary_embedding", [TensorType((3, 7, 5, 4)), TensorType((7, 2)), TensorType((7, 2))], {}),
    ("dropout", [X], {"p": 0.3, "seed": 1234}),
    (
        "cross_entropy_grad",
        [TensorType((5, 3, 10)), TensorType((5, 3), "int64"), TensorType(()), TensorType((5, 3))],
        {"reduction": "mean"},
    ),
]


@pytest.mark.parametrize(("kind", "types", "attrs"), CASES, ids=lambda v: str(v))
def test_rules_on_uneven_shards_match_one_device(
    kind: str, types: list[TensorType], attrs: dict[str, Any]
) -> None:
    pair = (0, 1) if len(types) >= 3 else None  # on (2, 3): every (a, b) pair, c drawn
    kernels = sweep_rule(kind, types, attrs, MESHES, sampled=60, free_max_ndim=1, pair=pair)
    assert kernels.total() > 15


def test_uneven_mean_of_a_loss_is_a_partial_sum_scaled_per_rank() -> None:
    mesh = Mesh((4,), ("dp",))
    logits, labels = TensorType((6, 10)), TensorType((6,), "int64")
    specs = [DistSpec.parse("S(0)", mesh), DistSpec.parse("S(0)", mesh)]
    result = infer("cross_entropy", [logits, labels], specs, {}, mesh)
    assert [str(s) for s in result.output_specs] == ["P(sum)"]
    assert result.kernel == "global_mean"
    even = infer("cross_entropy", [TensorType((8, 10)), TensorType((8,), "int64")], specs, {}, mesh)
    assert [str(s) for s in even.output_specs] == ["P(avg)"]


def test_splitting_uneven_hidden_into_heads_drops_the_sharding() -> None:
    mesh = Mesh((3,), ("tp",))
    x = TensorType((2, 12))  # 12 = 4 heads x 3: 3 ranks cut 12 evenly but 4 heads unevenly
    result = infer("reshape", [x], [DistSpec.parse("S(1)", mesh)], {"shape": [2, 4, 3]}, mesh)
    assert [str(s) for s in result.input_specs] == ["R"]
    assert "does not divide into 3 shards" in result.reason
    kept = infer("reshape", [TensorType((7, 12))], [DistSpec.parse("S(0)", mesh)],
                 {"shape": [7, 4, 3]}, mesh)  # fmt: skip
    assert [str(s) for s in kept.output_specs] == ["S(0)"]  # 7 rows: 3, 2, 2 kept as rows
