"""Completion: templates make data/tensor/sequence/FSDP parallelism emerge from rules."""

from __future__ import annotations

import pytest

from shardlab.errors import PlacementError
from shardlab.ir import Graph, Op, OpRole, TensorType, Value, ValueKind
from shardlab.models import build_model
from shardlab.spmd.check import check_completed
from shardlab.spmd.complete import complete
from shardlab.strategy import Strategy, StrategyError

SMALL_LLAMA = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 64,
               "seq": 8, "batch": 4, "dtype": "float32"}  # fmt: skip
COLUMN = ("attn.q_proj", "attn.k_proj", "attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
BETWEEN = ("attn.q_proj", "attn.q_heads", "attn.q_rotary", "attn.k_rotary", "attn.sdpa",
           "attn.merge_heads", "mlp.gate_proj", "mlp.up_proj", "mlp.act", "mlp.gated")  # fmt: skip


@pytest.fixture(scope="module")
def llama_dp_tp():  # type: ignore[no-untyped-def]
    graph = build_model("llama3-8b")
    return complete(graph, Strategy.build("dp=8,tp=8", ["dp", "megatron_tp"]))


def test_megatron_placements_emerge_on_llama3_8b(llama_dp_tp) -> None:  # type: ignore[no-untyped-def]
    done = llama_dp_tp
    spec = {name: str(s) for name, s in done.specs.items()}
    assert spec["tokens"] == "S(0)R" and spec["labels"] == "S(0)R"
    assert spec["embed.weight"] == "RS(0)" and spec["lm_head.weight"] == "RS(1)"
    for i in range(32):
        p = f"layers.{i}."
        for module in COLUMN:
            assert spec[f"{p}{module}.weight"] == "RS(1)", module
        assert spec[f"{p}attn.o_proj.weight"] == "RS(0)"
        assert spec[f"{p}mlp.down_proj.weight"] == "RS(0)"
        for act in BETWEEN:
            assert spec[p + act] == "S(0)S(2)", (p + act, spec[p + act])
        assert spec[f"{p}attn.o_proj"] == "S(0)P(sum)"  # row-parallel partial sums
        assert spec[f"{p}mlp.down_proj"] == "S(0)P(sum)"
        assert spec[f"{p}attn_residual"] == "S(0)R"  # all-reduced, as in Megatron-LM
        block = [op for op in done.graph.ops if op.scope.startswith(p)]
        assert block and not any(done.rules[op.name].fallback for op in block)
    assert spec["lm_head"] == "S(0)S(2)"  # vocab-parallel logits
    assert spec["loss"] == "P(avg)R"  # the vocab-parallel kernel all-reduces the target logit
    assert done.fallback_ops() == []


def test_no_reshard_between_the_two_matmuls_of_a_block(llama_dp_tp) -> None:  # type: ignore[no-untyped-def]
    resharded = {op for op, *_ in llama_dp_tp.reshards()}
    for i in range(32):
        for act in ("attn.q_heads", "attn.sdpa", "attn.merge_heads", "attn.o_proj", "mlp.gated",
                    "mlp.down_proj"):  # fmt: skip
            assert f"layers.{i}.{act}" not in resharded


@pytest.mark.parametrize(
    ("mesh", "templates"),
    [
        ("dp=2", ["dp"]),
        ("tp=2", ["megatron_tp"]),
        ("dp=2,tp=2", ["dp", "megatron_tp"]),
        ("dp=2,tp=2", ["dp", "megatron_tp", "sequence_parallel"]),
        ("dp=2,tp=2,cp=2", ["dp", "megatron_tp", "sequence_parallel"]),
        ("dp=4", ["dp", "fsdp"]),
        ("dp=2,tp=2", ["dp", "fsdp", "megatron_tp"]),
    ],
)
def test_every_op_of_a_completed_small_llama_is_numerically_exact(
    mesh: str, templates: list[str]
) -> None:
    graph = build_model("llama3-8b", SMALL_LLAMA)
    done = complete(graph, Strategy.build(mesh, templates))
    errors = check_completed(done)
    assert max(errors.values()) < 1e-9, {k: v for k, v in errors.items() if v >= 1e-9}


def test_sequence_parallel_shards_the_residual_stream_on_seq() -> None:
    graph = build_model("llama3-8b", SMALL_LLAMA)
    done = complete(graph, Strategy.build("dp=2,tp=2", ["dp", "megatron_tp", "sequence_parallel"]))
    spec = {name: str(s) for name, s in done.specs.items()}
    assert spec["layers.0.attn_residual"] == "S(0)S(1)"
    # the norm output stays sequence-sharded; the column projection all-gathers its input
    assert spec["layers.0.mlp_norm"] == "S(0)S(1)"
    assert spec["layers.0.mlp.up_proj"] == "S(0)S(2)"


def test_fsdp_shards_every_parameter_and_composes_with_tp() -> None:
    graph = build_model("llama3-8b", SMALL_LLAMA)
    done = complete(graph, Strategy.build("dp=2,tp=2", ["dp", "fsdp", "megatron_tp"]))
    spec = {name: str(s) for name, s in done.specs.items()}
    assert spec["layers.0.attn.q_proj.weight"] == "S(0)S(1)"
    # row-parallel o_proj is S(0) on tp: dp takes dim 1, so gathering dp is one all-gather
    assert spec["layers.0.attn.o_proj.weight"] == "S(1)S(0)"
    assert spec["layers.0.attn_norm.weight"] == "S(0)R"
    # the batch stays sharded: consumers gather the parameter, not the activations
    assert spec["layers.0.attn.q_proj"] == "S(0)S(2)"


def _graph_with_opaque() -> Graph:
    t = TensorType
    values = [
        Value("x", t((8, 16)), ValueKind.INPUT),
        Value("label", t((8, 16)), ValueKind.INPUT),
        Value("w0", t((16, 16)), ValueKind.PARAM),
        Value("w1", t((16, 16)), ValueKind.PARAM),
        Value("y", t((8, 16))),
        Value("h", t((8, 16))),
        Value("z", t((8, 16))),
        Value("loss", t(())),
    ]
    opaque_attrs = {"output_types": [{"shape": [8, 16], "dtype": "float32"}], "reference": "tanh",
                    "name": "my.custom_tanh"}  # fmt: skip
    ops = [
        Op("mm0", "matmul", ("x", "w0"), ("y",)),
        Op("custom", "opaque", ("y",), ("h",), opaque_attrs),
        Op("mm1", "matmul", ("h", "w1"), ("z",)),
        Op("loss", "mse_loss", ("z", "label"), ("loss",), role=OpRole.LOSS),
    ]
    return Graph(values, ops, name="opaque_demo")


def test_opaque_op_falls_back_and_neighbours_stay_sharded() -> None:
    graph = _graph_with_opaque()
    done = complete(graph, Strategy.build("dp=2,tp=2", ["dp"], ["w0=dp:R,tp:S(1)", "w1=tp:S(1)"]))
    assert done.fallback_ops() == ["custom"]
    assert "fallback" in done.rules["custom"].reason
    spec = {name: str(s) for name, s in done.specs.items()}
    assert spec["y"] == "S(0)S(1)"  # the op before is sharded
    assert spec["h"] == "RR"  # the fallback computes everything replicated
    assert spec["z"] == "RS(1)"  # the op after is sharded again (column parallel)
    assert spec["loss"] == "P(avg)P(avg)"
    assert done.summary()["fallback_ops"] == ["custom"]
    assert max(check_completed(done).values()) < 1e-9


def test_user_annotations_win_over_templates() -> None:
    graph = build_model("llama3-8b", SMALL_LLAMA)
    done = complete(
        graph,
        Strategy.build("dp=2,tp=2", ["dp", "megatron_tp"], ["layers.0.mlp.up_proj.weight=RR"]),
    )
    assert str(done.specs["layers.0.mlp.up_proj.weight"]) == "RR"
    assert str(done.specs["layers.1.mlp.up_proj.weight"]) == "RS(1)"


def test_bad_annotations_are_named() -> None:
    graph = build_model("mlp_demo")
    with pytest.raises(StrategyError, match=r"annotation 'nothing\*=dp:S\(0\)' matches no value"):
        complete(graph, Strategy.build("dp=2", [], ["nothing*=S(0)"]))
    with pytest.raises(PlacementError, match=r"S\(2\) on mesh axis 'dp' is out of range for "
                       r"'w1'.*asked by annotation 'w1=dp:S\(2\)'"):  # fmt: skip
        complete(graph, Strategy.build("dp=16", [], ["w1=S(2)"]))
    # 8 columns over 16 ranks: DTensor's blocks 1 x8, 0 x8 (empty blocks are allowed)
    done = complete(graph, Strategy.build("dp=16", [], ["w1=S(1)"]))
    assert str(done.specs["w1"]) == "S(1)"


def test_completion_is_deterministic() -> None:
    graph = build_model("llama3-8b", SMALL_LLAMA)
    strategy = Strategy.build("dp=2,tp=2", ["dp", "megatron_tp", "sequence_parallel"])
    a, b = complete(graph, strategy), complete(graph, strategy)
    assert a.specs == b.specs
    assert [r.reason for r in a.rules.values()] == [r.reason for r in b.rules.values()]
