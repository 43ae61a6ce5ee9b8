"""Activation recomputation: what is replayed, what the backward keeps (Korthikanti et al.
2022, Table 2), that the numbers stay one device's, and what it costs."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from backend.cli import app
from shardlab.autodiff import training_graph
from shardlab.cost.memory import MemoryProfile, memory_profile
from shardlab.ir import Graph, OpRole
from shardlab.models import build_model
from shardlab.plan import build_plan
from shardlab.recompute import RecomputeError, apply_recompute, is_recompute
from shardlab.runtime.reference import run_reference
from shardlab.runtime.verify import verify
from shardlab.scopes import layer_scope
from shardlab.strategy import Strategy, StrategyError
from tests.shardlab.conftest import SBH

SMALL_GPT = {"layers": 2, "hidden": 64, "heads": 4, "ffn": 128, "vocab": 128, "seq": 16,
             "batch": 4, "dropout": 0.1, "attention": "eager"}  # fmt: skip
SMALL_LLAMA = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 64,
               "seq": 8, "batch": 4}  # fmt: skip


def test_selective_replays_the_attention_core_before_each_layers_backward() -> None:
    g = training_graph(build_model("gpt", SMALL_GPT), recompute="selective")
    replayed = [op for op in g.ops if is_recompute(op)]
    assert [op.name for op in replayed] == [
        f"layers.{i}.attn.{n}.recompute"
        for i in (1, 0)
        for n in ("scores", "probs", "probs_dropout", "context")
    ]
    assert all(op.role == OpRole.BACKWARD for op in replayed)
    first_backward_of_layer_1 = next(
        i for i, op in enumerate(g.ops) if op.role == OpRole.BACKWARD and "layers.1" in op.scope
    )
    assert g.ops[first_backward_of_layer_1].name == "layers.1.attn.scores.recompute"
    readers = {r.name for r in g.consumers("layers.0.attn.probs")}
    assert readers == {"layers.0.attn.probs_dropout"}  # the forward only: backward reads the copy
    assert g.op("layers.0.attn.probs.bwd0").inputs[0] == "layers.0.attn.probs.recomputed"
    assert g.meta["recompute"] == "selective"


def test_full_replays_every_forward_op_of_each_layer() -> None:
    g = training_graph(build_model("llama3-8b", SMALL_LLAMA), recompute="full")
    forward = [op for op in g.ops if op.role == OpRole.FORWARD and op.scope.startswith("layers.")]
    assert {f"{op.name}.recompute" for op in forward} == {
        op.name for op in g.ops if is_recompute(op)
    }
    # the backward of layer 0 reads from the forward only layer 0's input and the parameters
    kept = {
        v
        for op in g.ops
        if op.role == OpRole.BACKWARD and op.scope.startswith("layers.0")
        for v in op.inputs
        if (p := g.producer(v)) is not None and p.role == OpRole.FORWARD
    }
    assert kept == {"embed", "rope.cos", "rope.sin"}
    assert apply_recompute(g, "none") is g


def test_full_replays_each_layer_from_its_own_checkpoint() -> None:
    """A layer's replay reads its kept input (the previous layer's output as the forward made
    it), never another layer's replay; so it runs right before its own layer's backward, as
    Megatron-LM's checkpointed layers do, and two layers' replays are never live together."""
    g = training_graph(build_model("gpt", {**SMALL_GPT, "layers": 3}), recompute="full")
    for op in g.ops:
        if is_recompute(op):
            made_by = [p for v in op.inputs if (p := g.producer(v)) is not None]
            assert all(
                layer_scope(p.scope) == layer_scope(op.scope) for p in made_by if is_recompute(p)
            )
    first_replay = {
        layer: next(i for i, op in enumerate(g.ops) if is_recompute(op) and f"{layer}." in op.scope)
        for layer in ("layers.0", "layers.1", "layers.2")
    }
    last_backward = {
        layer: max(
            i
            for i, op in enumerate(g.ops)
            if op.role == OpRole.BACKWARD and not is_recompute(op) and f"{layer}." in op.scope
        )
        for layer in ("layers.1", "layers.2")
    }
    assert last_backward["layers.2"] < first_replay["layers.1"]
    assert last_backward["layers.1"] < first_replay["layers.0"]


def test_unknown_policies_are_named() -> None:
    with pytest.raises(RecomputeError, match="recompute must be one of none, selective, full"):
        training_graph(build_model("mlp_demo"), recompute="some")
    with pytest.raises(StrategyError, match="option 'recompute' must be one of"):
        Strategy.build("dp=2", ["dp"], options={"recompute": "layers"})
    result = CliRunner().invoke(app, ["plan", "mlp_demo", "--mesh", "x=2", "--recompute", "all"])
    assert result.exit_code == 1 and "option 'recompute' must be one of" in result.output


@pytest.mark.parametrize("policy", ["selective", "full"])
@pytest.mark.parametrize(
    ("model", "overrides"), [("gpt", SMALL_GPT), ("llama3-8b", SMALL_LLAMA)], ids=["gpt", "llama"]
)
def test_recomputed_steps_match_one_device(policy: str, model: str, overrides: dict) -> None:
    """The replay gives every value of the step exactly: the reference with and without
    recomputation agree bit for bit (dropout masks included), and dp x tp x sp verifies."""
    graph = build_model(model, overrides)
    plain, replayed = training_graph(graph), training_graph(graph, recompute=policy)
    a, b = run_reference(plain, seed=3), run_reference(replayed, seed=3)
    for name in plain.outputs:
        np.testing.assert_array_equal(a[name], b[name])
    for template in (["dp", "megatron_tp"], ["dp", "megatron_tp", "sequence_parallel"]):
        strategy = Strategy.build("dp=2,tp=2", template, options={"recompute": policy})
        report = verify(graph, strategy)
        assert report.ok, report.failed()[:3]


# --- what the backward keeps: Korthikanti et al. (2022), Table 2 -----------------------------


def _profile(model: Graph, t: int, templates: list[str], policy: str) -> MemoryProfile:
    strategy = Strategy.build(f"tp={t}", templates, options={"recompute": policy})
    plan = build_plan(model, strategy, passes=False)
    return memory_profile(plan.program, plan.training)


@pytest.mark.parametrize("t", [1, 2, 8])
@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_selective_recomputation_drops_the_5as_over_h_term(
    gpt3_layers: Graph, t: int, sequence_parallel: bool
) -> None:
    """Table 2: tensor parallel + selective sbh(10 + 24/t); with sequence parallel sbh 34/t."""
    templates = ["megatron_tp", "sequence_parallel"] if sequence_parallel else ["megatron_tp"]
    got = _profile(gpt3_layers, t, templates, "selective").kept_for_backward_by_scope
    want = 34 * SBH // t if sequence_parallel else 10 * SBH + 24 * SBH // t
    assert got["layers.0"] == want


@pytest.mark.parametrize("t", [1, 8])
@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_full_recomputation_keeps_only_each_layers_input(
    gpt3_layers: Graph, t: int, sequence_parallel: bool
) -> None:
    """Table 2: full recomputation keeps 2sbh per layer (the layer's input, charged to the
    layer that made it); with sequence parallelism that input is sequence-sharded: 2sbh/t."""
    templates = ["megatron_tp", "sequence_parallel"] if sequence_parallel else ["megatron_tp"]
    got = _profile(gpt3_layers, t, templates, "full").kept_for_backward_by_scope
    assert got["layers.0"] == (2 * SBH // t if sequence_parallel else 2 * SBH)


def test_recomputation_trades_step_time_for_memory() -> None:
    """Korthikanti et al.'s Table 4 ordering on a 22B-like layer stack: full recomputation
    costs most time and keeps least for the backward; selective adds a little time and
    keeps no attention scores; the model FLOPs stay, the hardware FLOPs grow (HFU > MFU)."""
    model = build_model("gpt", {"layers": 2, "hidden": 6144, "heads": 64, "vocab": 512,
                                "seq": 2048, "batch": 4, "attention": "eager"})  # fmt: skip
    costs = {}
    for policy in ("none", "selective", "full"):
        strategy = Strategy.build("tp=8", ["megatron_tp", "sequence_parallel"],
                                  options={"recompute": policy})  # fmt: skip
        plan = build_plan(model, strategy, cluster="a100-80g-8x8", passes=False)
        assert plan.cost is not None
        costs[policy] = plan.cost
    none, selective, full = costs["none"], costs["selective"], costs["full"]
    assert none.step_time < selective.step_time < full.step_time
    kept = {k: sum(b.bytes for b in c.memory.kept_for_backward) for k, c in costs.items()}
    assert kept["full"] < kept["selective"] < kept["none"]
    assert none.model_flops == selective.model_flops == full.model_flops
    assert none.hardware_flops < selective.hardware_flops < full.hardware_flops
    assert full.hfu > full.mfu
    assert full.summary()["hfu"] == full.hfu
