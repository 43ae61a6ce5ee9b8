"""Graph structure: lookups, topological order, counts."""

from __future__ import annotations

import pytest

from shardlab.errors import GraphError
from shardlab.ir import MAX_DIM, MAX_ELEMENTS, Graph, Op, OpRole, TensorType, Value, ValueKind


def _values() -> list[Value]:
    return [
        Value("x", TensorType((4, 8)), ValueKind.INPUT),
        Value("w", TensorType((8, 16)), ValueKind.PARAM),
        Value("y", TensorType((4, 16))),
        Value("z", TensorType((4, 16))),
        Value("s", TensorType((4, 16))),
    ]


def _ops() -> list[Op]:
    return [
        Op("mm", "matmul", ("x", "w"), ("y",), scope="proj"),
        Op("act", "relu", ("y",), ("z",), scope="proj"),
        Op("sum", "add", ("y", "z"), ("s",), role=OpRole.LOSS),
    ]


def test_tensor_type_sizes() -> None:
    t = TensorType((4, 8), "bfloat16")
    assert (t.rank, t.numel, t.nbytes, t.is_float) == (2, 32, 64, True)
    assert str(t) == "bfloat16[4,8]"
    assert TensorType((), "float32").numel == 1
    assert TensorType((3,), "int64").nbytes == 24


def test_lookups_and_counts() -> None:
    g = Graph(_values(), _ops(), name="tiny")
    assert [op.name for op in g.ops] == ["mm", "act", "sum"]
    assert g.producer("y") is g.op("mm")
    assert g.producer("x") is None
    assert [op.name for op in g.consumers("y")] == ["act", "sum"]
    assert g.outputs == ("s",)
    assert g.num_params() == 8 * 16
    assert g.flops() == 2 * 4 * 8 * 16 + 4 * 16 + 4 * 16
    assert g.ops_by_kind() == {"add": 1, "matmul": 1, "relu": 1}


def test_out_of_order_ops_are_sorted_stably() -> None:
    ops = _ops()
    g = Graph(_values(), [ops[2], ops[1], ops[0]])
    assert [op.name for op in g.ops] == ["mm", "act", "sum"]


def test_attrs_are_stored_json_native() -> None:
    op = Op("r", "reshape", ("y",), ("z",), {"shape": (4, 16)})
    assert op.attrs == {"shape": [4, 16]}
    with pytest.raises(GraphError, match=r"op 'r' attrs.shape has a value of type set"):
        Op("r", "reshape", ("y",), ("z",), {"shape": {4, 16}})
    with pytest.raises(GraphError, match=r"op 'r' attrs.factor is nan"):
        Op("r", "scale", ("y",), ("z",), {"factor": float("nan")})


def test_lookup_errors_name_the_missing_thing() -> None:
    g = Graph(_values(), _ops(), name="tiny")
    with pytest.raises(GraphError, match=r"graph 'tiny' has no value 'q'"):
        g.value("q")
    with pytest.raises(GraphError, match=r"graph 'tiny' has no op 'q'"):
        g.op("q")


def test_updated_params_do_not_count_twice() -> None:
    values = [*_values(), Value("w.new", TensorType((8, 16)), ValueKind.PARAM)]
    ops = [*_ops(), Op("sgd", "scale", ("w",), ("w.new",), {"factor": 0.5})]
    assert Graph(values, ops).num_params() == 8 * 16


def test_long_chain_topological_sort_is_fast_enough() -> None:
    n = 20000
    values = [Value("v0", TensorType((2,)), ValueKind.INPUT)]
    values += [Value(f"v{i}", TensorType((2,))) for i in range(1, n)]
    ops = [Op(f"op{i}", "neg", (f"v{i - 1}",), (f"v{i}",)) for i in range(1, n)]
    g = Graph(values, list(reversed(ops)))
    assert g.ops[0].name == "op1" and g.ops[-1].name == f"op{n - 1}"


def test_dims_and_sizes_are_limited_to_what_int64_arithmetic_holds() -> None:
    ops = [Op("n", "neg", ("x",), ("y",))]

    def graph(shape: tuple[int, ...]) -> Graph:
        values = [Value("x", TensorType(shape), ValueKind.INPUT), Value("y", TensorType(shape))]
        return Graph(values, ops)

    assert graph((MAX_DIM, 4)).type_of("x").numel == MAX_DIM * 4
    with pytest.raises(GraphError) as err:
        graph((4, 2**62))
    assert err.value.message == (
        "value 'x' has dim 1 of size 4611686018427387904; dims must be at most 2147483647 "
        "(2^31 - 1)"
    )
    assert err.value.detail == {"value": "x", "dim": 1, "size": 2**62, "limit": MAX_DIM}
    with pytest.raises(GraphError, match=r"value 'x' of shape \[2147483647, 2147483647\] has"):
        graph((MAX_DIM, MAX_DIM))
    assert MAX_ELEMENTS * 8 == 2**63 - 8  # the byte size of the largest value fits int64
