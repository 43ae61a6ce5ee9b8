"""Pipelines under 50 random cross-stage interleavings: the real passes (data-parallel passes on
every stage, send/wait) run clean and bit-identical to program order; broken variants (a sent
buffer freed too early, a received value read before its recv completes, a recv moved ahead
of the send it depends on) are caught, naming the ops."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from shardlab.autodiff import training_graph
from shardlab.errors import ExecutionError
from shardlab.models import build_model
from shardlab.passes.pipeline import PipelineProgram, build_pipeline
from shardlab.passes.pipeline_passes import apply_stage_passes
from shardlab.passes.send_wait import (
    forward_sends,
    pipeline_send_wait,
    with_gc_frees,
    with_send_waits,
)
from shardlab.program import DistProgram
from shardlab.runtime.hazards import HazardError
from shardlab.runtime.pipeline_exec import run_pipeline_blocks
from shardlab.runtime.pipeline_interleave import (
    run_pipeline_interleaved,
    run_pipeline_interleavings,
)
from shardlab.runtime.reference import make_feeds, source_values
from shardlab.strategy import Strategy

LLAMA = {"layers": 4, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 64,
         "seq": 8, "batch": 8, "dtype": "float32"}  # fmt: skip
M = 4
N = 50


def _build(mesh: str, templates: list[str], schedule: str, v: int | None = None) -> Any:
    micro = build_model("llama3-8b", {**LLAMA, "batch": 8 // M})
    strategy = Strategy.build(mesh, templates)
    p = build_pipeline(micro, strategy, microbatches=M, schedule=schedule, virtual_stages=v)
    return p, training_graph(micro)


def _sources(p: PipelineProgram) -> dict[str, np.ndarray]:
    full = training_graph(build_model("llama3-8b", LLAMA))
    feeds = make_feeds(full, seed=0)
    return {v.name: feeds[v.name] for v in source_values(full)}


def _gc(p: PipelineProgram) -> PipelineProgram:
    """Every stage with garbage-collector frees of its forward-sent values (`with_gc_frees`)."""
    stages = [with_gc_frees(s, [s.ops[i].inputs[0] for i in forward_sends(s)]) for s in p.stages]
    return dataclasses.replace(p, stages=stages)


def _same_as_program_order(p: PipelineProgram, sources: dict[str, np.ndarray]) -> None:
    ordered = run_pipeline_blocks(p, sources, seed=0)
    interleaved = run_pipeline_interleavings(p, sources, n=N, seed=0)
    for s, blocks in enumerate(ordered):
        assert blocks.keys() == interleaved[s].keys()
        for value, ranks in blocks.items():
            for rank, block in ranks.items():
                np.testing.assert_array_equal(interleaved[s][value][rank], block)


CASES = [("pp=2,dp=2", ["dp"], "1f1b", None), ("pp=2,tp=2", ["megatron_tp"], "interleaved", 2),
         ("pp=4", [], "gpipe", None)]  # fmt: skip


@pytest.mark.parametrize(("mesh", "templates", "schedule", "v"), CASES,
                         ids=[f"{c[0]}-{c[2]}" for c in CASES])  # fmt: skip
def test_every_pass_is_clean_under_50_interleavings(
    mesh: str, templates: list[str], schedule: str, v: int | None
) -> None:
    built, training = _build(mesh, templates, schedule, v)
    sources = _sources(built)
    passed, _ = apply_stage_passes(built, training, {"dp_fuse_allreduce": {"bucket_mb": 0.05}})
    optimized, summary = pipeline_send_wait(passed)
    assert summary.holds_added > 0
    for variant in (built, _gc(with_send_waits(passed)), _gc(optimized)):
        _same_as_program_order(variant, sources)


def _without_holds(p: PipelineProgram) -> PipelineProgram:
    stages = [dataclasses.replace(s, ops=[o for o in s.ops if o.kind != "hold"]) for s in p.stages]
    return dataclasses.replace(p, stages=stages)


def test_a_sent_buffer_freed_before_the_send_completes_is_caught() -> None:
    built, _ = _build("pp=2,dp=2", ["dp"], "1f1b")
    optimized, _ = pipeline_send_wait(built)
    broken = _gc(_without_holds(optimized))
    with pytest.raises(HazardError) as caught:
        run_pipeline_interleavings(broken, _sources(built), n=N, seed=0)
    error = caught.value
    assert error.detail["kind"] == "free_in_flight"
    assert error.detail["op"].startswith("free:") and error.detail["other"].startswith("send:")
    assert "on stage 0" in str(error)


def _replace_stage(p: PipelineProgram, s: int, program: DistProgram) -> PipelineProgram:
    return dataclasses.replace(p, stages=[*p.stages[:s], program, *p.stages[s + 1 :]])


def test_a_received_value_read_before_its_recv_completes_is_caught() -> None:
    built, _ = _build("pp=2,dp=2", ["dp"], "1f1b")
    stage = built.stages[1]
    recv = next(op for op in stage.ops if op.kind == "recv")
    ops = [
        dataclasses.replace(op, deps=tuple(d for d in op.deps if d != recv.name))
        for op in stage.ops
    ]
    broken = _replace_stage(built, 1, dataclasses.replace(stage, ops=ops))
    with pytest.raises(HazardError) as caught:
        run_pipeline_interleavings(broken, _sources(built), n=N, seed=0)
    assert caught.value.detail["kind"] == "read_before_complete"
    assert caught.value.detail["other"] == recv.name


def test_a_recv_moved_ahead_of_what_its_send_needs_stalls_naming_both_stages() -> None:
    built, _ = _build("pp=2,dp=2", ["dp"], "1f1b")
    stage = built.stages[0]
    first_send = next(i for i, op in enumerate(stage.ops) if op.kind == "send")
    recv_at = next(i for i, op in enumerate(stage.ops) if op.kind == "recv")
    recv = stage.ops[recv_at]
    ops = [*stage.ops[:first_send], recv, *stage.ops[first_send:recv_at], *stage.ops[recv_at + 1 :]]
    broken = _replace_stage(built, 0, dataclasses.replace(stage, ops=ops))
    with pytest.raises(ExecutionError, match="pipeline stalled") as caught:
        run_pipeline_interleaved(broken, _sources(built), interleave=0)
    message = str(caught.value)
    assert f"stage 0 at {recv.name!r} (recv from stage 1" in message
    assert "stage 1 at" in message
