"""opaque: declared output types, reference implementations against torch, errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from shardlab.errors import ExecutionError, GraphError, OpSignatureError
from shardlab.ir import Graph, Op, TensorType, Value, ValueKind
from shardlab.ops import get_op, infer_types
from shardlab.validate import validate_graph

TOL = {"rtol": 1e-12, "atol": 1e-12}
rng = np.random.default_rng(10)


def run(kind: str, *xs: np.ndarray, **attrs: Any) -> list[np.ndarray]:
    """The numpy impl's outputs, after checking they have the inferred shapes."""
    types = [TensorType(x.shape, "float32" if x.dtype.kind == "f" else x.dtype.name) for x in xs]
    want = infer_types(kind, types, attrs)
    impl = get_op(kind).numpy_impl
    assert impl is not None
    outs = impl(xs, attrs)
    assert [o.shape for o in outs] == [t.shape for t in want]
    return outs


def out_types(*shapes: tuple[int, ...], dtype: str = "float32") -> list[dict[str, Any]]:
    return [{"shape": list(s), "dtype": dtype} for s in shapes]


UNARY = {
    "identity": lambda x: x.clone(),
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "relu": F.relu,
    "square": torch.square,
}


@pytest.mark.parametrize("reference", sorted(UNARY))
@pytest.mark.parametrize("shape", [(5,), (2, 3, 4)])
def test_unary_references_match_torch(reference: str, shape: tuple[int, ...]) -> None:
    x = rng.standard_normal(shape) * 3
    (out,) = run("opaque", x, output_types=out_types(shape), reference=reference)
    np.testing.assert_allclose(out, UNARY[reference](torch.tensor(x)).numpy(), **TOL)
    assert out is not x


@pytest.mark.parametrize("shapes", [[(3, 4)], [(3, 4), (3, 4)], [(2, 1, 4), (3, 1), (4,)]])
def test_sum_inputs_matches_torch(shapes: list[tuple[int, ...]]) -> None:
    xs = [rng.standard_normal(s) for s in shapes]
    want = torch.zeros(())
    for x in xs:
        want = want + torch.tensor(x)
    (out,) = run("opaque", *xs, output_types=out_types(tuple(want.shape)), reference="sum_inputs")
    np.testing.assert_allclose(out, want.numpy(), **TOL)


def test_infer_returns_declared_types() -> None:
    attrs = {
        "output_types": [{"shape": [2, 3], "dtype": "bfloat16"}, {"shape": [], "dtype": "int64"}],
        "name": "custom::fused_thing",
        "flops": 1234,
    }
    ins = [TensorType((7,)), TensorType((1, 2), "int32")]
    assert infer_types("opaque", ins, attrs) == [
        TensorType((2, 3), "bfloat16"),
        TensorType((), "int64"),
    ]
    assert infer_types("opaque", [], attrs)[0] == TensorType((2, 3), "bfloat16")
    assert get_op("opaque").flops(ins, [], attrs) == 1234
    assert get_op("opaque").flops(ins, [], {"output_types": attrs["output_types"]}) == 0


@pytest.mark.parametrize(
    ("attrs", "match"),
    [
        ({}, "'output_types' must be a non-empty list"),
        ({"output_types": []}, "'output_types' must be a non-empty list"),
        ({"output_types": [[2, 3]]}, "'output_types' entry 0 must be an object"),
        ({"output_types": [{"shape": [2]}]}, "entry 0 must be an object with keys"),
        ({"output_types": out_types((2,)) + out_types((0,))}, r"entry 1 has shape \[0\]"),
        ({"output_types": [{"shape": [2.5], "dtype": "float32"}]}, "positive integers"),
        ({"output_types": [{"shape": [True], "dtype": "float32"}]}, "positive integers"),
        ({"output_types": [{"shape": 2, "dtype": "float32"}]}, "entry 0 has shape 2"),
        ({"output_types": out_types((2,), dtype="float64")}, "unknown dtype 'float64'"),
        ({"output_types": out_types((2,)), "name": 3}, "'name' must be a string"),
        ({"output_types": out_types((2,)), "flops": -1}, "'flops' must be >= 0"),
        ({"output_types": out_types((2,)), "flops": 1.5}, "'flops' must be an integer"),
        ({"output_types": out_types((2,)), "reference": "gelu"}, "'reference' must be one of"),
        (
            {"output_types": out_types((2,), (2,)), "reference": "tanh"},
            "'reference' supports one output, but 'output_types' has 2",
        ),
        ({"output_types": out_types((3,)), "reference": "relu"}, r"gives shape \[2\] but"),
    ],
)
def test_infer_errors(attrs: dict[str, Any], match: str) -> None:
    with pytest.raises(OpSignatureError, match=match):
        infer_types("opaque", [TensorType((2,))], attrs)


def test_reference_needs_an_input() -> None:
    with pytest.raises(OpSignatureError, match="reference 'identity' needs at least one input"):
        infer_types("opaque", [], {"output_types": out_types((2,)), "reference": "identity"})
    with pytest.raises(OpSignatureError, match="'sum_inputs': shapes"):
        infer_types(
            "opaque",
            [TensorType((2,)), TensorType((3,))],
            {"output_types": out_types((2,)), "reference": "sum_inputs"},
        )


def test_no_reference_raises_execution_error() -> None:
    impl = get_op("opaque").numpy_impl
    assert impl is not None
    attrs = {"output_types": out_types((2,)), "name": "aten::weird"}
    with pytest.raises(ExecutionError, match="'aten::weird' has no reference implementation"):
        impl([np.zeros(2)], attrs)
    with pytest.raises(ExecutionError, match="set its attribute 'reference' to one of"):
        impl([], {"output_types": out_types((2,))})


def test_reference_shape_is_checked_at_run_time() -> None:
    impl = get_op("opaque").numpy_impl
    assert impl is not None
    attrs = {"output_types": out_types((2,)), "reference": "tanh"}
    with pytest.raises(ExecutionError, match=r"gives shape \[3\] but 'output_types' declares"):
        impl([np.zeros(3)], attrs)


def test_validator_compares_declared_outputs() -> None:
    def graph(out_shape: tuple[int, ...]) -> Graph:
        values = [Value("x", TensorType((4,)), ValueKind.INPUT), Value("y", TensorType(out_shape))]
        attrs = {"output_types": out_types((4,)), "reference": "relu"}
        return Graph(values, [Op("foreign", "opaque", ("x",), ("y",), attrs)])

    validate_graph(graph((4,)))
    with pytest.raises(GraphError, match="output 'y' is declared float32\\[5\\]"):
        validate_graph(graph((5,)))
