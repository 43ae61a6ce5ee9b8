"""Memory per rank (shardlab/cost/memory.py): liveness checked by hand, ZeRO's model-state
bytes per parameter, and Korthikanti et al.'s activation memory per transformer layer."""

from __future__ import annotations

import dataclasses
import json
import time
from fractions import Fraction

import pytest

from shardlab.cost.memory import CATEGORIES, MemoryProfile, layer_scope, memory_profile
from shardlab.errors import MeshError
from shardlab.ir import Graph
from shardlab.models import build_model
from shardlab.models.presets import get_preset
from shardlab.models.transformer import build_transformer
from shardlab.plan import Plan, build_plan
from shardlab.strategy import Strategy


def _plan(model: Graph, mesh: str, templates: list[str], annotations: list[str]) -> Plan:
    return build_plan(model, Strategy.build(mesh, templates, annotations), passes=False)


def _profile(plan: Plan) -> MemoryProfile:
    return memory_profile(plan.program, plan.training)


# --- 1. liveness on a program small enough to follow by hand ---------------------------------


def test_mlp_demo_liveness_by_hand() -> None:
    """mlp_demo (batch 4, hidden 3, classes 2, float32) on mesh x=2 with template dp.

    Per rank (batch halved, 4 bytes per element): x [2,3] 24 B, label [2,2] 16 B, w0 [3,3]
    36 B, w1 [3,2] 24 B, AdamW moments 2 x (36 + 24) = 120 B, and the gradients' buffers
    w0.grad 36 B and w1.grad 24 B, kept all step as Megatron keeps its main-gradient buffer
    (the all-reduce writes into them); static = 280 B. Then, op by op (+ allocated, - freed
    after the op's last read):

        y = x @ w0            +24  -> 304
        z = y @ w1            +16  -> 320
        loss                  +4   -> 324  (a graph output: live to the end)
        loss.grad_seed        +4   -> 328
        loss.bwd0 = z - label +16  -> 344, then -16 (z) -> 328
        loss.bwd1             +16  -> 344, then -16 (bwd0) -4 (loss.grad) -> 324
        loss.bwd2 = z.grad    +16  -> 340, then -16 (bwd1) -> 324
        z.bwd0 = y.grad       +24  -> 348  <- peak
        z.bwd1 = w1.grad      +0   -> 348 (its buffer), then -24 (y) -16 (z.grad) -> 308
        y.bwd0 = w0.grad      +0   -> 308, then -24 (y.grad) -> 284
        all_reduce w0.grad@R  +0   -> 284 (in place)
        w0.adamw (in place)   +0   -> 284
        all_reduce w1.grad@R  +0   -> 284
        w1.adamw (in place)   +0   -> 284 = static + loss

    At the peak: parameters 60, gradients 60, optimizer state 120, inputs 40, activations 24
    (y, kept for the backward), temporaries 44 (the loss, z.grad, y.grad), comm buffers 0.
    """
    model = build_model("mlp_demo", {"batch": 4, "hidden": 3, "classes": 2})
    profile = _profile(_plan(model, "x=2", ["dp"], []))
    assert profile.static_bytes == 280
    assert list(profile.timeline) == [
        ("y", 304),
        ("z", 320),
        ("loss", 324),
        ("loss.grad_seed", 328),
        ("loss.bwd0", 344),
        ("loss.bwd1", 344),
        ("loss.bwd2", 340),
        ("z.bwd0", 348),
        ("z.bwd1", 348),
        ("y.bwd0", 308),
        ("all_reduce:w0.grad@R", 284),
        ("w0.adamw", 284),
        ("all_reduce:w1.grad@R", 284),
        ("w1.adamw", 284),
    ]
    assert (profile.peak_bytes, profile.peak_op) == (348, "z.bwd0")
    assert profile.breakdown_at_peak == {
        "parameters": 60,
        "gradients": 60,
        "optimizer_state": 120,
        "inputs": 40,
        "activations": 24,
        "temporaries": 44,
        "comm_buffers": 0,
    }
    # y and z are made in the forward and read by the backward: 24 + 16 bytes kept.
    assert {t.value: t.bytes for t in profile.kept_for_backward} == {"y": 24, "z": 16}
    assert profile.model_state == {"parameters": 60, "gradients": 60, "optimizer_state": 120}
    # The buffers live at the peak are all listed, largest first.
    at_peak = profile.largest_at_peak
    assert sum(b.bytes for b in at_peak) == 348 and at_peak[0].bytes == 36
    assert {b.value: b.category for b in at_peak if b.bytes == 36} == {
        "w0": "parameters",
        "w0.exp_avg": "optimizer_state",
        "w0.exp_avg_sq": "optimizer_state",
        "w0.grad": "gradients",
    }


def test_rank_must_be_on_the_mesh() -> None:
    plan = _plan(build_model("mlp_demo"), "x=2", ["dp"], [])
    assert (
        memory_profile(plan.program, plan.training, rank=1).peak_bytes == _profile(plan).peak_bytes
    )
    with pytest.raises(MeshError, match="rank 2"):
        memory_profile(plan.program, plan.training, rank=2)


def test_profile_is_json_ready_and_keeps_the_peak_when_thinned() -> None:
    model = build_model("mlp_demo", {"batch": 4, "hidden": 3, "classes": 2})
    profile = _profile(_plan(model, "x=2", ["dp"], []))
    data = json.loads(json.dumps(profile.to_json(timeline_points=4)))
    assert data["peak_bytes"] == 348 and set(data["breakdown_at_peak"]) == set(CATEGORIES)
    assert [profile.peak_op, 348] in data["timeline"] and len(data["timeline"]) <= 5


def test_layer_scope() -> None:
    assert layer_scope("layers.12.attn.q_proj") == "layers.12"
    assert layer_scope("layers.3") == "layers.3"
    assert layer_scope("lm_head") == "lm_head"
    assert layer_scope("embed.x") == "embed"
    assert layer_scope("") == ""


# --- 2. mixed-precision AdamW model states: 18 bytes per parameter and its ZeRO shares -------

#: Two full-width Llama 3 8B layers (h 4096, ffn 14336, vocab 128256), 16-bit params.
LLAMA_BF16 = {"layers": 2, "dtype": "bfloat16"}
#: Shard the float32 optimizer state (moments and master weights) on dp.
ZERO1 = ["*.exp_avg=dp:S(0)", "*.exp_avg_sq=dp:S(0)", "*.master=dp:S(0)"]
#: Place every param gradient sharded on dp: reduce-scattered right after the op making it.
SHARDED_GRADS = ["*.weight.grad=dp:S(0)"]
ZERO2 = [*ZERO1, *SHARDED_GRADS]


@pytest.mark.parametrize(
    ("templates", "annotations", "params", "grads", "state"),
    [
        pytest.param(["dp"], [], 2, 4, 12, id="dp"),
        pytest.param(["dp"], ZERO1, 2, 4, Fraction(12, 8), id="zero1"),
        pytest.param(["dp"], ZERO2, 2, Fraction(4, 8), Fraction(12, 8), id="zero2"),
        pytest.param(
            ["dp", "fsdp"],
            SHARDED_GRADS,
            Fraction(2, 8),
            Fraction(4, 8),
            Fraction(12, 8),
            id="fsdp",
        ),
        pytest.param(
            ["dp", "fsdp"], [], Fraction(2, 8), Fraction(4, 8), Fraction(12, 8), id="fsdp-template"
        ),
    ],
)
def test_mixed_precision_adamw_model_states(
    templates: list[str],
    annotations: list[str],
    params: Fraction,
    grads: Fraction,
    state: Fraction,
) -> None:
    """Model states per rank on mesh dp=8, N = 8, in Megatron-LM's mixed-precision
    accounting (Rajbhandari et al.'s ZeRO stages with float32 gradients).

    Mixed-precision AdamW keeps per parameter a bf16 param (2 B), a float32 main gradient
    (4 B: bf16 training accumulates and all-reduces gradients in fp32) and float32
    exp_avg, exp_avg_sq and master weight (4 + 4 + 4 = 12 B): 18 B without sharding.
    Measured: `MemoryProfile.model_state`, the per-rank bytes of every param, every param
    gradient `<p>.grad` and every optimizer state value in its completed placement (so a
    gradient all-reduced only for the optimizer counts once, at its stored P(sum) size).

    - dp:    2 + 4 + 12 = 18 B per param.
    - ZeRO-1 (annotations shard exp_avg, exp_avg_sq, master on dp): 2 + 4 + 12/N = 7.5
      (Megatron's distributed optimizer: 6 + 12/N).
    - ZeRO-2 (also `*.weight.grad=dp:S(0)`: the gradient is reduce-scattered right after
      the op that makes it): 2 + 16/N = 4.
    - FSDP (ZeRO-3; templates dp + fsdp shard every param on its first dim divisible by 8,
      which every Llama dim is, so no param stays replicated; the optimizer state follows
      its param; the template also shards the gradients): 18/N = 2.25, with or without the
      explicit gradient annotation.
    """
    plan = _plan(build_model("llama3-8b", LLAMA_BF16), "dp=8", templates, annotations)
    profile = _profile(plan)
    n = plan.training.num_params()
    assert profile.num_params == n
    assert profile.model_state == {
        "parameters": params * n,
        "gradients": grads * n,
        "optimizer_state": state * n,
    }
    per_param = sum(profile.model_state_per_param().values())
    assert per_param == pytest.approx(float(params + grads + state))


def test_data_parallel_gradients_all_coexist_before_the_optimizer() -> None:
    """Under plain dp every float32 main gradient (4 B per param, P(sum) before its
    all-reduce) is made during the backward and all-reduced only just before its AdamW op,
    so at the end of the backward all of them are live at once: the most gradient bytes =
    4 x params (Megatron's persistent fp32 gradient buffer)."""
    plan = _plan(build_model("llama3-8b", LLAMA_BF16), "dp=8", ["dp"], [])
    profile = _profile(plan)
    assert profile.max_by_category["gradients"] == 4 * plan.training.num_params()


# --- 3. activations kept for backward per layer (Korthikanti et al. 2022) --------------------

H, A, S, B = 12288, 96, 2048, 1  # GPT-3 175B layer sizes, one sequence
SBH = S * B * H  # 25,165,824: one 16-bit [s, b, h] tensor is 2 sbh bytes


@pytest.fixture(scope="module")
def gpt3_layers() -> Graph:
    """Two GPT-3-sized GPT-2 blocks (bf16, vocab 512 so the head stays small)."""
    base = get_preset("gpt2").config
    cfg = dataclasses.replace(
        base,
        layers=2,
        hidden=H,
        heads=A,
        kv_heads=A,
        ffn=4 * H,
        vocab=512,
        seq=S,
        batch=B,
        max_positions=S,
        dtype="bfloat16",
    )
    return build_transformer(cfg, "gpt3-layers")


def _kept_per_layer(model: Graph, t: int, templates: list[str], annotations: list[str]) -> int:
    kept = _profile(_plan(model, f"tp={t}", templates, annotations)).kept_for_backward_by_scope
    assert kept["layers.0"] == kept["layers.1"], "both blocks keep the same tensors"
    return kept["layers.0"]


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_activations_per_layer_with_tensor_parallelism(gpt3_layers: Graph, t: int) -> None:
    """Korthikanti et al. (2022), section 4: sbh(10 + 24/t + 5as/(ht)) bytes per layer with
    tensor parallelism t (t = 1: sbh(34 + 5as/h)), s = 2048, b = 1, h = 12288, a = 96.

    Terms that do not apply: our GPT-2 block has no dropout (their two sbh one-byte masks,
    replicated: 10 -> 8) and a fused attention whose backward recomputes the scores (no
    2as^2b softmax output, as^2b dropout mask or 2as^2b dropout output: 5as/(ht) -> 0).
    What remains: 8sbh + 24sbh/t. Replicated over tp: the two LayerNorm inputs (the residual
    stream, all-reduced) and the two LayerNorm outputs (inputs of the QKV and up
    projections), 4 x 2sbh. Sharded: q, k, v (6sbh), the o_proj input (2sbh), the GELU input
    (8sbh) and the down_proj input (8sbh), 24sbh/t in all.

    Measured: `kept_for_backward_by_scope["layers.0"]`, tensors made in the forward and read
    after it, grouped by the scope of the op that made them; a block is charged for its own
    output (the next LayerNorm's input), not for its input, so every block counts the same.
    t = 1: 32 sbh = 805,306,368 B; t = 2: 20 sbh = 503,316,480 B; t = 4: 14 sbh =
    352,321,536 B; t = 8: 11 sbh = 276,824,064 B (all exact).
    """
    expected = 8 * SBH + 24 * SBH // t
    got = _kept_per_layer(gpt3_layers, t, ["megatron_tp"], [])
    assert got == pytest.approx(expected, rel=0.05)
    assert got == expected


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_activations_per_layer_with_sequence_parallelism(gpt3_layers: Graph, t: int) -> None:
    """Korthikanti et al. (2022), section 4.2.2: sbh(34/t + 5as/(ht)) bytes per layer with tensor
    and sequence parallelism; without dropout masks (2sbh) and stored scores, 32sbh/t:
    every kept tensor is sharded over tp, along the sequence outside the attention/MLP and
    along heads or ffn inside them.

    Templates megatron_tp + sequence_parallel: the LayerNorm outputs stay S(1) and are
    all-gathered for the column-parallel projections, so only their shard is kept.
    t = 1: 32 sbh = 805,306,368 B; t = 2: 16 sbh = 402,653,184 B; t = 4: 8 sbh =
    201,326,592 B; t = 8: 4 sbh = 100,663,296 B (all exact).
    """
    expected = 32 * SBH // t
    got = _kept_per_layer(gpt3_layers, t, ["megatron_tp", "sequence_parallel"], [])
    assert got == pytest.approx(expected, rel=0.05)
    assert got == expected


@pytest.mark.parametrize("t", [2, 4, 8])
def test_replicated_norm_outputs_keep_a_full_copy_for_backward(gpt3_layers: Graph, t: int) -> None:
    """Annotating the LayerNorm outputs Replicate (as this template did at first) all-gathers
    them right after the norm (which runs on sequence shards: `attn_norm@R` is the gathered
    copy), and that full copy is what the QKV / up projection backward reads:
    layers.{i}.attn_norm and layers.{i}.mlp_norm are kept at 2sbh each instead of 2sbh/t,
    i.e. 4sbh + 28sbh/t = 18 sbh (t = 2), 11 sbh (t = 4), 7.5 sbh (t = 8) against
    Korthikanti's 16, 8, 4. The difference is exactly those two tensors."""
    replicated = ["layers.*.attn_norm=tp:R", "layers.*.mlp_norm=tp:R"]
    templates = ["megatron_tp", "sequence_parallel"]
    profile = _profile(_plan(gpt3_layers, f"tp={t}", templates, replicated))
    assert profile.kept_for_backward_by_scope["layers.0"] == 4 * SBH + 28 * SBH // t
    by_value = {k.value.split("@")[0]: k.bytes for k in profile.kept_for_backward}
    for norm in ("layers.0.attn_norm", "layers.0.mlp_norm"):
        assert by_value[norm] == 2 * SBH
    sharded = _profile(_plan(gpt3_layers, f"tp={t}", templates, []))
    other = {k.value.split("@")[0]: k.bytes for k in sharded.kept_for_backward}
    differ = {v for v in by_value.keys() | other.keys() if by_value.get(v) != other.get(v)}
    assert {v for v in differ if layer_scope(v) == "layers.0"} == {
        "layers.0.attn_norm",
        "layers.0.mlp_norm",
    }


# --- 4. cost --------------------------------------------------------------------------------


def test_profile_is_linear_time_on_llama3_8b() -> None:
    """All 32 layers of Llama 3 8B on dp=8, tp=8: thousands of program ops, well under 1 s
    (about 30 ms when written)."""
    model = build_model("llama3-8b")
    plan = _plan(model, "dp=8,tp=8", ["dp", "megatron_tp"], [])
    start = time.perf_counter()
    profile = _profile(plan)
    assert time.perf_counter() - start < 1.0
    assert len(plan.program.ops) >= 2900 and profile.peak_bytes > profile.static_bytes
