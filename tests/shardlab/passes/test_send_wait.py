"""Seed 001 send/wait: waits after forward sends become holds after the backward recv."""

from __future__ import annotations

import dataclasses

import pytest

from shardlab.models import build_model
from shardlab.passes import pipeline as pipeline_pass
from shardlab.passes.pipeline import PipelineError, PipelineProgram, build_pipeline
from shardlab.passes.send_wait import (
    backward_recv_of,
    check_implied,
    check_send_buffers,
    forward_sends,
    pipeline_send_wait,
    with_send_waits,
)
from shardlab.runtime import pipeline_exec
from shardlab.runtime.pipeline_exec import verify_pipeline
from shardlab.strategy import Strategy

LLAMA = {"layers": 4, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 64,
         "seq": 8, "batch": 8, "dtype": "float32"}  # fmt: skip
M = 4


def pipeline(mesh: str = "pp=2,dp=2", schedule: str = "1f1b") -> PipelineProgram:
    strategy = Strategy.build(mesh, ["dp"] if "dp" in mesh else [])
    model = build_model("llama3-8b", {**LLAMA, "batch": 8 // M})
    return build_pipeline(model, strategy, microbatches=M, schedule=schedule)


def _kinds(p: PipelineProgram, kind: str) -> int:
    return sum(op.kind == kind for s in p.stages for op in s.ops)


def _without_holds(p: PipelineProgram) -> PipelineProgram:
    stages = [dataclasses.replace(s, ops=[o for o in s.ops if o.kind != "hold"]) for s in p.stages]
    return dataclasses.replace(p, stages=stages)


@pytest.mark.parametrize(("mesh", "schedule", "sends"), [("pp=2,dp=2", "1f1b", 4),
                                                         ("pp=4", "gpipe", 12)])  # fmt: skip
def test_counts_waits_and_holds(mesh: str, schedule: str, sends: int) -> None:
    p = pipeline(mesh, schedule)
    fwd = [(s, i) for s, prog in enumerate(p.stages) for i in forward_sends(prog)]
    matched = [si for si in fwd if backward_recv_of(p.stages[si[0]], si[1]) is not None]
    assert len(fwd) == len(matched) == sends  # one activation per stage boundary per micro-batch
    base = with_send_waits(p)
    assert _kinds(base, "wait") == sends and _kinds(with_send_waits(base), "wait") == sends
    opt, summary = pipeline_send_wait(p)
    assert (summary.forward_sends, summary.waits_removed, summary.holds_added) == (sends,) * 3
    assert summary.message == f"{sends} send waits removed, {sends} holds added"
    assert summary.kept == [] and _kinds(opt, "wait") == 0 and _kinds(opt, "hold") == sends
    assert pipeline_send_wait(base)[1] == summary
    stage0 = opt.stages[0].ops
    hold = next(i for i, op in enumerate(stage0) if op.kind == "hold")
    assert stage0[hold - 1].kind == "recv" and stage0[hold].deps == (stage0[hold - 1].name,)
    assert stage0[hold - 1].attrs["value"] == f"{stage0[hold].inputs[0].split('#')[0]}.grad"


def test_hazards_clean_and_broken_variant_caught() -> None:
    p = pipeline()
    opt, _ = pipeline_send_wait(p)
    assert check_send_buffers(with_send_waits(p)) == []
    assert check_send_buffers(opt) == []
    check_implied(opt)
    broken = check_send_buffers(_without_holds(opt))
    assert len(broken) == 4
    assert {h.kind for _, h in broken} == {"free_in_flight"}
    assert {s for s, _ in broken} == {0} and all(h.other.startswith("send:") for _, h in broken)


def test_check_implied_rejects_a_hold_on_an_unrelated_recv() -> None:
    opt, _ = pipeline_send_wait(pipeline())
    ops = opt.stages[0].ops
    first_recv = next(op.name for op in ops if op.kind == "recv")
    holds = [i for i, op in enumerate(ops) if op.kind == "hold"]
    wrong = dataclasses.replace(ops[holds[-1]], deps=(first_recv,))  # micro-batch 3 on 0's recv
    stage = dataclasses.replace(
        opt.stages[0], ops=[*ops[: holds[-1]], wrong, *ops[holds[-1] + 1 :]]
    )
    with pytest.raises(PipelineError, match="does not imply"):
        check_implied(dataclasses.replace(opt, stages=[stage, *opt.stages[1:]]))


def test_optimized_pipeline_matches_one_device(monkeypatch: pytest.MonkeyPatch) -> None:
    build = pipeline_pass.build_pipeline

    def optimized(*args: object, **kwargs: object) -> PipelineProgram:
        p, summary = pipeline_send_wait(build(*args, **kwargs))  # type: ignore[arg-type]
        assert summary.holds_added == 4
        return p

    monkeypatch.setattr(pipeline_exec, "build_pipeline", optimized)
    report = verify_pipeline(
        "llama3-8b",
        Strategy.build("pp=2,dp=2", ["dp"]),
        microbatches=M,
        schedule="1f1b",
        overrides=LLAMA,
        compute_dtype="float64",
    )
    assert report.ok, report.first_divergence
    assert report.summary["compared"] > 39  # the loss, every gradient, param and state


def test_optimized_interleaved_pipeline_with_tensor_parallel_matches_one_device() -> None:
    def optimized(p: PipelineProgram) -> PipelineProgram:
        out, summary = pipeline_send_wait(p)
        assert summary.holds_added > 0 and summary.kept == []
        return out

    report = verify_pipeline(
        "llama3-8b",
        Strategy.build("pp=2,tp=2", ["megatron_tp"]),
        microbatches=M,
        schedule="interleaved",
        virtual_stages=2,
        overrides=LLAMA,
        compute_dtype="float64",
        transform=optimized,
    )
    assert report.ok, report.first_divergence
