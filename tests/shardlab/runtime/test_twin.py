"""Safe verification of big plans: the memory estimate, the scaled-down twin, the refusal."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from shardlab.cli import app
from shardlab.errors import ExecutionError
from shardlab.ir import ValueKind
from shardlab.models import build_model
from shardlab.runtime.twin import (
    MAX_VERIFICATION_BYTES,
    _layout,
    scaled_twin,
    verification_estimate,
    verify_safely,
)
from shardlab.strategy import Strategy

TP_SP = Strategy.build("dp=2,tp=2", ["dp", "megatron_tp", "sequence_parallel"])


def test_the_estimate_counts_state_and_activations_on_every_rank_and_the_reference() -> None:
    graph = build_model("mlp_demo")
    params = graph.num_params()
    acts = sum(v.type.numel for v in graph.values.values() if v.kind == ValueKind.ACTIVATION)
    assert params > 0 and acts > 0
    # (4 ranks + the reference) x (param, grad, two moments; activation and its grad) x 8 B
    assert verification_estimate(graph, 4, "float64") == 5 * (4 * params + 2 * acts) * 8
    assert verification_estimate(graph, 4, "float32") == 5 * (4 * params + 2 * acts) * 4


def test_a_full_size_llama_verifies_as_a_twin_that_says_so() -> None:
    report = verify_safely(build_model("llama3-8b"), TP_SP)
    assert report.ok, report.failed()[:3]
    twin = report.summary["twin"]
    assert twin["preset"] == "llama3-8b"
    assert twin["changes"]["layers"] == [32, 2]
    assert twin["changes"]["hidden"][0] == 4096 and twin["changes"]["hidden"][1] <= 128
    assert twin["full_estimate_bytes"] > 1000 * (1 << 30) > MAX_VERIFICATION_BYTES
    assert report.summary["estimate_bytes"] == twin["twin_estimate_bytes"] < (64 << 20)
    assert report.summary["limit_bytes"] == MAX_VERIFICATION_BYTES
    # the same strategy ran: the collectives of TP + SP and DP are all there
    assert set(report.summary["collectives"]) == {"all_gather", "all_reduce", "reduce_scatter"}


def test_the_twin_places_every_parameter_input_and_state_as_the_model_does() -> None:
    full = build_model("llama3-8b")
    twin = scaled_twin(full, TP_SP)
    two_layers = build_model("llama3-8b", {"layers": 2})
    assert _layout(twin.graph, TP_SP) == _layout(two_layers, TP_SP)
    assert twin.graph.num_params() < 2_000_000
    assert "over the limit of 4.00 GiB" in twin.describe()


def test_a_pipeline_twin_keeps_a_layer_for_every_chunk() -> None:
    interleaved = {"pipeline": {"schedule": "interleaved"}}
    strategy = Strategy.build("pp=2,dp=2", ["dp"], options=interleaved)
    report = verify_safely(build_model("llama3-8b"), strategy, compute_dtype="float32")
    assert report.ok, report.failed()[:3]
    assert report.summary["schedule"] == "interleaved" and report.summary["virtual_stages"] == 2
    assert report.summary["twin"]["changes"]["layers"] == [32, 4]  # 2 stages x 2 chunks


def test_a_model_within_the_limit_verifies_as_it_is() -> None:
    graph = build_model("mlp_demo")
    report = verify_safely(graph, Strategy.build("x=2", ["dp"]), optimizer="sgd")
    assert report.ok and "twin" not in report.summary
    assert report.summary["estimate_bytes"] == verification_estimate(graph, 2)


def test_without_a_twin_a_big_model_is_refused_naming_the_estimate_and_the_limit() -> None:
    with pytest.raises(ExecutionError, match=r"would hold about [\d.]+ GiB in float64, over "
                       r"the limit of 4.00 GiB") as info:  # fmt: skip
        verify_safely(build_model("llama3-8b"), TP_SP, twin=False)
    assert info.value.detail["limit"] == MAX_VERIFICATION_BYTES


def test_a_model_that_is_no_transformer_preset_has_no_twin() -> None:
    with pytest.raises(ExecutionError, match="not a transformer preset"):
        verify_safely(build_model("mlp_demo"), Strategy.build("x=2", ["dp"]), limit=1)


def test_a_limit_below_the_smallest_twin_is_refused() -> None:
    with pytest.raises(ExecutionError, match="even the smallest twin of 'llama3-8b'"):
        verify_safely(build_model("llama3-8b"), TP_SP, limit=1 << 20)


def test_cli_verify_of_a_full_size_model_runs_its_twin_and_says_so() -> None:
    args = ["verify", "llama3-8b", "--mesh", "dp=2,tp=2", "--template", "dp",
            "--template", "megatron_tp", "--template", "sequence_parallel"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert result.output.startswith("PASS")
    assert "scaled-down twin verified, not the model itself" in result.output
    assert "limit 4.0 GiB" in result.output and "layers 32->2" in result.output
    refused = CliRunner().invoke(app, [*args, "--no-twin"])
    assert refused.exit_code == 1
    assert "over the limit of 4.00 GiB" in refused.output
    bigger = CliRunner().invoke(app, [*args, "--max-memory-gib", "0.001"])
    assert bigger.exit_code == 1 and "even the smallest twin" in bigger.output
