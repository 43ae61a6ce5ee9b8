"""The compute cost model: training FLOPs against 6ND, the roofline, calibration tables, and
per-rank op times of a lowered program."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from shardlab.autodiff import training_graph
from shardlab.cost.compute import (
    MATMUL_RAMP_SECONDS,
    VECTOR_EFFICIENCY,
    CalibrationTable,
    ComputeDevice,
    compute_time,
    flops_by_kind,
    hardware_flops,
    local_types,
    model_flops,
    op_bytes,
    op_flops,
    program_op_times,
    roofline_time,
    training_flops,
)
from shardlab.errors import ClusterError
from shardlab.ir import Graph, OpRole, TensorType, ValueKind
from shardlab.models import build_model
from shardlab.ops import op_cost
from shardlab.plan import Plan, build_plan
from shardlab.strategy import Strategy


@dataclass(frozen=True)
class Device:
    """A stand-in with the fields of `shardlab.cost.clusters.Cluster` the model reads; the
    defaults are the h100-sxm preset's figures (per GPU)."""

    peak_flops: dict[str, float] = field(
        default_factory=lambda: {"bfloat16": 989e12, "float16": 989e12, "float32": 67e12}
    )
    hbm_bandwidth: float = 3.35e12
    launch_overhead: float = 5e-6
    matmul_efficiency: float = 0.75
    memory_efficiency: float = 0.8


H100: ComputeDevice = Device()
BF16 = "bfloat16"

# llama3-8b with 2 layers: batch 8, seq 8192, hidden 4096, 32 heads of 128 (8 kv heads),
# ffn 14336, vocab 128256.
B, S, LAYERS = 8, 8192, 2
HID, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB = 4096, 32, 8, 128, 14336, 128256


@pytest.fixture(scope="module")
def llama_training() -> Graph:
    return training_graph(build_model("llama3-8b", {"layers": LAYERS}))


def test_training_flops_match_6nd_plus_attention(llama_training: Graph) -> None:
    """FLOPs of one training step of llama3-8b (2 layers) against 6 * N * T + 3 * A.

    N = matmul weight params = layers * (q, o: 2 * 4096 * 4096 + k, v: 2 * 4096 * 1024
    + gate, up, down: 3 * 4096 * 14336) + lm_head 4096 * 128256 = 2 * 218,103,808
    + 525,336,576 = 961,544,192 (the embedding table is a lookup, ~0 FLOPs; norm weights are
    elementwise). T = batch * seq = 8 * 8192 = 65,536 tokens. 6NT = 3.7809e14 (forward 2NT,
    backward dX and dW 4NT).
    A = forward attention matmuls, causal-aware as the catalog counts them: per layer
    2 * B * heads * S(S+1)/2 * (2 * head_dim) (~ 4 * B * S^2 * heads * head_dim / 2), both
    layers: 8.7972e12. The textbook fwd + bwd attention term is 3A = 2.6392e13, so
    6NT + 3A = 4.0449e14. Measured: 4.0903e14, +1.12%: the backward's flash-attention
    recomputation of S = q k^T adds 0.5A (attention_grad = 2.5A), and norms, activations,
    rotary, softmax-cross-entropy and AdamW (14 FLOPs per param) add 1.5e11 (0.04%).
    """
    n = LAYERS * (2 * HID * HID + 2 * HID * KV_HEADS * HEAD_DIM + 3 * HID * FFN) + HID * VOCAB
    t = B * S
    a = LAYERS * 2 * B * HEADS * (S * (S + 1) // 2) * 2 * HEAD_DIM
    assert n == 961_544_192 and 6 * n * t == 378_094_561_001_472
    assert a == 8_797_166_764_032

    total = training_flops(llama_training)
    # 3 FLOPs per logit less than 409_055_637_299_200 (3 * 65,536 * 128,256): the
    # cross-entropy backward takes its softmax from the forward's kept log-sum-exp, no
    # longer recomputing the max and the sum (`autodiff_ops._PER_ELEMENT`).
    assert total == 409_030_421_143_552
    assert total == pytest.approx(6 * n * t + 3 * a, rel=0.02)

    by_kind = flops_by_kind(llama_training)
    assert sum(by_kind.values()) == total == llama_training.flops()
    assert by_kind["linear"] + by_kind["matmul"] == 6 * n * t  # exactly: no other matmuls
    assert by_kind["scaled_dot_product_attention"] == a
    assert by_kind["attention_grad"] * 2 == 5 * a  # 2.5x: recomputed S + four matmuls
    assert by_kind["adamw"] == 14 * llama_training.num_params()
    rest = total - 6 * n * t - 7 * a // 2
    assert 0 < rest < 0.001 * total
    assert total == pytest.approx(6 * n * t + 3.5 * a, rel=0.001)


def test_model_flops_are_three_forwards_and_hardware_flops_add_recomputation() -> None:
    """MFU's model FLOPs: 3 x forward (PaLM, Megatron-LM). HFU's hardware FLOPs: what runs,
    so flash attention's recomputed scores (attention_grad = 2.5x its forward) and any
    recomputed layer count, the optimizer does not."""
    model = build_model("llama3-8b", {"layers": 2, "seq": 256, "batch": 2})
    plain = training_graph(model)
    forward = sum(
        op_flops(op.kind, [plain.type_of(v) for v in op.inputs],
                 [plain.type_of(v) for v in op.outputs], op.attrs)
        for op in plain.ops if op.role in (OpRole.FORWARD, OpRole.LOSS)
    )  # fmt: skip
    assert model_flops(plain) == 3 * forward
    by_kind = flops_by_kind(plain)
    assert hardware_flops(plain) == plain.flops() - by_kind["adamw"]
    # flash attention's backward recomputes the scores: half a forward attention more
    assert by_kind["attention_grad"] == 5 * by_kind["scaled_dot_product_attention"] // 2
    full = training_graph(model, recompute="full")
    layers_forward = sum(
        op_flops(op.kind, [full.type_of(v) for v in op.inputs],
                 [full.type_of(v) for v in op.outputs], op.attrs)
        for op in full.ops if op.name.endswith(".recompute")
    )  # fmt: skip
    assert model_flops(full) == model_flops(plain)
    assert hardware_flops(full) == hardware_flops(plain) + layers_forward > hardware_flops(plain)


def test_every_kind_in_the_training_graph_counts_flops(llama_training: Graph) -> None:
    """Only data movement (views, fills, lookups, the float32 main-gradient copy) has no
    FLOPs."""
    zero = {k for k, f in flops_by_kind(llama_training).items() if f == 0}
    assert zero == {"reshape", "fill", "embedding", "main_grad"}


def test_attention_grad_is_two_and_a_half_forwards() -> None:
    q = TensorType((2, 64, 8, 32))
    kv = TensorType((2, 64, 2, 32))
    for causal in (True, False):
        attrs = {"causal": causal}
        fwd = op_flops("scaled_dot_product_attention", [q, kv, kv], [q], attrs)
        bwd = op_flops("attention_grad", [q, kv, kv, q], [q, kv, kv], attrs)
        assert bwd * 2 == 5 * fwd
    pairs = 64 * 65 // 2
    assert op_flops("attention_grad", [q, kv, kv, q], [q, kv, kv], {}) == 2 * 2 * 8 * pairs * 5 * 32


def test_autodiff_kinds_count_per_element() -> None:
    x = TensorType((4, 16))
    w = TensorType((16,))
    assert op_flops("silu_grad", [x, x], [x], {}) == 8 * 64
    assert op_flops("rms_norm_grad", [x, w, x], [x, w], {}) == 12 * 64
    assert op_flops("layer_norm_grad", [x, w, x], [x, w, w], {}) == 16 * 64
    assert op_flops("sgd", [x, x], [x], {"lr": 0.1}) == 2 * 64
    assert op_flops("sgd", [x, x], [x], {"lr": 0.1, "weight_decay": 0.01}) == 4 * 64
    assert op_flops("adamw", [x] * 4, [x] * 3, {"lr": 0.1}) == 14 * 64
    ids = TensorType((4,), "int64")
    assert op_flops("embedding_grad", [ids, x], [TensorType((100, 16))], {"vocab": 100}) == 64
    assert op_flops("broadcast_to", [w], [x], {"shape": [4, 16]}) == 0
    assert op_bytes("broadcast_to", [w], [x], {"shape": [4, 16]}) == (16 + 64) * 4


# -- roofline -----------------------------------------------------------------------------


def _matmul(n: int, dtype: str = BF16) -> tuple[int, int]:
    a = TensorType((n, n), dtype)
    return op_flops("matmul", [a, a], [a], {}), op_bytes("matmul", [a, a], [a], {})


def test_large_matmul_is_compute_bound_near_matmul_efficiency() -> None:
    flops, bytes_ = _matmul(8192)  # 1.1 TFLOP, 402 MB
    t = compute_time("matmul", flops, bytes_, BF16, H100)
    achieved = flops / t
    assert 0.74 * 989e12 < achieved < 0.75 * 989e12
    assert bytes_ / (3.35e12 * 0.8) < 0.2 * t  # memory is far from binding


def test_tiny_matmul_is_dominated_by_the_launch_floor() -> None:
    flops, bytes_ = _matmul(16)
    t = compute_time("matmul", flops, bytes_, BF16, H100)
    assert 5e-6 < t < 5e-6 + MATMUL_RAMP_SECONDS * 1.01  # launch + the size ramp
    assert t < 5e-6 / 0.7  # the launch is most of it
    assert flops / t < 1e-5 * 989e12


def test_matmul_ramp_reaches_half_efficiency_at_f_half() -> None:
    f_half = 989e12 * 0.75 * MATMUL_RAMP_SECONDS  # ~1.5 GFLOP, a ~900^3 matmul
    t = roofline_time("matmul", int(f_half), 0, BF16, H100) - 5e-6
    assert f_half / t == pytest.approx(0.5 * 0.75 * 989e12, rel=1e-6)


def test_elementwise_op_is_memory_bound() -> None:
    x = TensorType((8, 8192, 4096), BF16)  # 256M elements
    flops, bytes_ = op_flops("add", [x, x], [x], {}), op_bytes("add", [x, x], [x], {})
    t = compute_time("add", flops, bytes_, BF16, H100)
    assert t == pytest.approx(bytes_ / (3.35e12 * 0.8) + 5e-6, rel=1e-12)
    assert flops / (989e12 * VECTOR_EFFICIENCY) < 0.01 * t


def test_time_is_monotonic_in_size() -> None:
    matmuls = [compute_time("matmul", *_matmul(2**k), BF16, H100) for k in range(2, 15)]
    assert matmuls == sorted(matmuls) and len(set(matmuls)) == len(matmuls)
    adds = []
    for k in range(4, 30, 2):
        x = TensorType((2**k,), BF16)
        adds.append(compute_time("add", 2**k, 3 * x.nbytes, BF16, H100))
    assert adds == sorted(adds) and len(set(adds)) == len(adds)


def test_dtype_peak_and_float32_fallback() -> None:
    flops, bytes_ = _matmul(8192)
    t16 = compute_time("matmul", flops, bytes_, BF16, H100)
    t32 = compute_time("matmul", flops, bytes_, "float32", H100)
    assert t32 / t16 == pytest.approx(989 / 67, rel=0.01)
    assert compute_time("matmul", flops, bytes_, "float64", H100) == t32  # not listed


def test_views_take_no_time() -> None:
    assert compute_time("reshape", 0, 0, BF16, H100) == 0.0


def test_the_cluster_presets_are_compute_devices() -> None:
    from shardlab.cost.clusters import load_cluster

    h100: ComputeDevice = load_cluster("h100-sxm-8x8")
    flops, bytes_ = _matmul(4096)
    assert compute_time("matmul", flops, bytes_, BF16, h100) == compute_time(
        "matmul", flops, bytes_, BF16, H100
    )
    cpu: ComputeDevice = load_cluster("cpu-local")
    small = compute_time("matmul", *_matmul(64, "float32"), "float32", cpu)
    assert small < 1e-3  # the ramp scales with the device: no GPU-sized floor on a CPU


# -- calibration --------------------------------------------------------------------------


def _table(*entries: tuple[str, int, int, float]) -> CalibrationTable:
    return CalibrationTable.from_json(
        {
            "device": "test-gpu",
            "entries": [
                {"kind": k, "flops": f, "bytes": b, "seconds": s} for k, f, b, s in entries
            ],
        }
    )


TABLE = _table(("matmul", 10**9, 10**6, 2e-3), ("matmul", 10**11, 10**8, 4e-2))


def test_calibration_exact_hit_wins() -> None:
    assert compute_time("matmul", 10**9, 10**6, BF16, H100, TABLE) == 2e-3
    assert compute_time("matmul", 10**11, 10**8, BF16, H100, TABLE) == 4e-2


def test_calibration_interpolates_log_log_between_entries() -> None:
    t = compute_time("matmul", 10**10, 10**7, BF16, H100, TABLE)
    assert 2e-3 < t < 4e-2
    assert t == pytest.approx(math.sqrt(2e-3 * 4e-2))  # the log-midpoint


def test_calibration_extrapolates_by_the_roofline_ratio() -> None:
    big = (10**12, 10**9)
    ratio = roofline_time("matmul", *big, BF16, H100) / roofline_time(
        "matmul", 10**11, 10**8, BF16, H100
    )
    assert compute_time("matmul", *big, BF16, H100, TABLE) == pytest.approx(4e-2 * ratio)
    assert compute_time("matmul", 10**6, 10**4, BF16, H100, TABLE) < 2e-3


def test_calibration_without_the_kind_uses_the_roofline() -> None:
    assert compute_time("add", 10**6, 6 * 10**6, BF16, H100, TABLE) == roofline_time(
        "add", 10**6, 6 * 10**6, BF16, H100
    )


def test_calibration_zero_flop_kinds_interpolate_on_bytes() -> None:
    table = _table(("embedding", 0, 10**6, 1e-5), ("embedding", 0, 10**8, 1e-4))
    t = compute_time("embedding", 0, 10**7, BF16, H100, table)
    assert t == pytest.approx(math.sqrt(1e-5 * 1e-4))


def test_calibration_round_trips_through_a_file(tmp_path: Path) -> None:
    path = tmp_path / "calib.json"
    path.write_text(json.dumps(TABLE.to_json()))
    assert CalibrationTable.load(path) == TABLE


@pytest.mark.parametrize(
    ("entry", "field_name", "words"),
    [
        ({"kind": "matmul", "flops": 1, "bytes": 1}, "seconds", "no field 'seconds'"),
        ({"kind": "matmul", "flops": 1, "bytes": 1, "seconds": -1}, "seconds", "positive"),
        ({"kind": "matmul", "flops": 1.5, "bytes": 1, "seconds": 1}, "flops", "whole number"),
        ({"kind": "matmul", "flops": 1, "bytes": "8", "seconds": 1}, "bytes", "whole number"),
        ({"kind": "matmull", "flops": 1, "bytes": 1, "seconds": 1}, "kind", "not an op kind"),
        ({"kind": "matmul", "flops": 0, "bytes": 0, "seconds": 1}, "flops", "must be > 0"),
    ],
)
def test_malformed_calibration_names_the_entry(
    entry: dict[str, Any], field_name: str, words: str
) -> None:
    good = {"kind": "add", "flops": 1, "bytes": 12, "seconds": 1e-6}
    with pytest.raises(ClusterError, match=words) as err:
        CalibrationTable.from_json({"device": "d", "entries": [good, entry]}, "calib.json")
    assert "calib.json: entry 1" in err.value.message
    assert err.value.detail == {"entry": 1, "field": field_name}


def test_malformed_calibration_files(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match="'entries' must be a list"):
        CalibrationTable.from_json({"device": "d", "entries": {}})
    with pytest.raises(ClusterError, match="entry 1 repeats entry 0"):
        _table(("add", 1, 12, 1e-6), ("add", 1, 12, 2e-6))
    bad = tmp_path / "bad.json"
    bad.write_text('{"device": "d",\n "entries": [}')
    with pytest.raises(ClusterError, match="line 2") as err:
        CalibrationTable.load(bad)
    assert str(bad) in err.value.message


# -- programs -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plan() -> Plan:
    model = build_model("llama3-8b", {"layers": LAYERS})
    return build_plan(model, Strategy.build("dp=2,tp=2", ["dp", "megatron_tp"]))


def _local_flops(plan: Plan, name: str) -> int:
    program = plan.program
    op = next(o for o in program.ops if o.name == name)
    ins, outs = local_types(program, op.inputs), local_types(program, op.outputs)
    return op_flops(op.kind, ins, outs, op.attrs)


def test_local_types_follow_the_placements(plan: Plan) -> None:
    program = plan.program
    w = "layers.0.attn.q_proj.weight"
    assert str(program.specs[w]) == "RS(1)"  # column parallel: out features over tp
    assert local_types(program, [w]) == [TensorType((4096, 2048), BF16)]
    assert local_types(program, ["layers.0.attn.o_proj"]) == [  # S(0)P(sum): partial keeps dims
        TensorType((4, 8192, 4096), BF16)
    ]


def test_column_parallel_matmul_halves_the_local_flops(plan: Plan) -> None:
    """With dp=2 the batch is halved too, so a rank does serial / (dp * tp): tp's share is 1/2."""
    for name in ("layers.0.attn.q_proj", "layers.0.mlp.gate_proj", "layers.1.mlp.up_proj"):
        serial = op_cost(plan.training, plan.training.op(name)).flops
        assert _local_flops(plan, name) * 2 * 2 == serial
    serial_q = 2 * B * S * HID * HID
    assert _local_flops(plan, "layers.0.attn.q_proj") == serial_q // 4 == 549_755_813_888


def test_program_op_times_cover_compute_ops_only(plan: Plan) -> None:
    program = plan.program
    times = program_op_times(program, H100)
    compute = [op.name for op in program.ops if not op.is_comm]
    assert list(times) == compute and len(compute) < len(program.ops)
    assert all(t == 0.0 for n, t in times.items() if n.endswith(("q_heads", "merge_heads")))
    q_proj = _local_flops(plan, "layers.0.attn.q_proj")  # 0.55 TFLOP of bfloat16
    assert times["layers.0.attn.q_proj"] == pytest.approx(q_proj / (989e12 * 0.75), rel=0.01)
    assert times["layers.0.attn.sdpa.bwd0"] == pytest.approx(
        2.5 * times["layers.0.attn.sdpa"], rel=0.01
    )
    assert times["layers.0.attn.q_proj"] > times["layers.0.attn_norm"] > 5e-6


def test_program_op_times_use_the_table(plan: Plan) -> None:
    program = plan.program
    op = next(o for o in program.ops if o.name == "layers.0.attn.q_proj")
    ins, outs = local_types(program, op.inputs), local_types(program, op.outputs)
    key = (op_flops("linear", ins, outs, {}), op_bytes("linear", ins, outs, {}))
    table = _table(("linear", *key, 1.0))
    times = program_op_times(program, H100, table)
    assert times["layers.0.attn.q_proj"] == 1.0
    assert times["layers.0.attn_norm"] == program_op_times(program, H100)["layers.0.attn_norm"]


def test_params_counted_by_6nd_are_the_matmul_weights(llama_training: Graph) -> None:
    """The N of 6NT: every 2-D param read by a linear op except the embedding table."""
    weights = {
        op.inputs[1]: llama_training.type_of(op.inputs[1])
        for op in llama_training.ops
        if op.kind == "linear"
    }
    assert all(llama_training.value(w).kind == ValueKind.PARAM for w in weights)
    assert sum(t.numel for t in weights.values()) == 961_544_192
    embed = next(op for op in llama_training.ops if op.kind == "embedding")
    assert "embed.weight" not in weights and op_cost(llama_training, embed).flops == 0
