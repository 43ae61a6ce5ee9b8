"""Lowering: one pass, reshards inserted once per (value, spec), every comm op explained."""

from __future__ import annotations

from shardlab.ir import Graph, Op, TensorType, Value, ValueKind
from shardlab.lower import lower
from shardlab.models import build_model
from shardlab.spmd.complete import complete
from shardlab.strategy import Strategy

LLAMA = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 64,
         "seq": 8, "batch": 4, "dtype": "float32"}  # fmt: skip


def test_megatron_block_gets_one_all_reduce_per_row_parallel_projection() -> None:
    graph = build_model("llama3-8b", LLAMA)
    program = lower(complete(graph, Strategy.build("dp=2,tp=2", ["dp", "megatron_tp"])))
    reduces = [op for op in program.collectives() if op.comm and op.comm.kind == "all_reduce"]
    sources = sorted(op.inputs[0].split("~")[0] for op in reduces)
    assert "layers.0.attn_residual" in sources and "layers.0.mlp_residual" in sources
    for op in program.collectives():
        assert "needs it as" in op.reason or "completion places" in op.reason
        assert "bytes per rank" in op.reason


def test_a_value_needed_twice_in_one_spec_is_resharded_once() -> None:
    values = [Value("x", TensorType((4, 8)), ValueKind.INPUT)]
    values += [Value(n, TensorType((4, 8))) for n in ("a", "b", "c")]
    ops = [
        Op("sm1", "softmax", ("x",), ("a",), {"dim": 1}),
        Op("sm2", "log_softmax", ("x",), ("b",), {"dim": 1}),
        Op("sum", "add", ("a", "b"), ("c",)),
    ]
    program = lower(complete(Graph(values, ops), Strategy.build("tp=2", [], ["x=S(1)"])))
    moves = program.collectives()
    # the softmax dim must be whole: one all_to_all onto dim 0 serves both softmaxes
    assert [op.comm.kind for op in moves if op.comm] == ["all_to_all"]
    consumers = {op.name for op in program.ops if moves[0].outputs[0] in op.inputs}
    assert consumers == {"sm1", "sm2"}


def test_dependencies_point_backwards() -> None:
    graph = build_model("llama3-8b", LLAMA)
    program = lower(complete(graph, Strategy.build("dp=2,tp=2", ["dp", "megatron_tp"])))
    seen: set[str] = set()
    for op in program.ops:
        assert set(op.deps) <= seen
        seen.add(op.name)
