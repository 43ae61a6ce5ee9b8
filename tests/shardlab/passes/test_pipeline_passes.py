"""Data-parallel passes on the stage programs of a pipeline (pp=2 x dp=2, 1F1B, 4 micro-batches)."""

from __future__ import annotations

from typing import Any

import pytest

from shardlab.autodiff import training_graph
from shardlab.ir import Graph
from shardlab.models import build_model
from shardlab.passes.data_parallel import is_grad_all_reduce
from shardlab.passes.pipeline import PipelineProgram, build_pipeline
from shardlab.passes.pipeline_passes import apply_stage_passes
from shardlab.passes.send_wait import check_implied, pipeline_send_wait
from shardlab.runtime.hazards import check_hazards
from shardlab.runtime.pipeline_exec import verify_pipeline
from shardlab.strategy import Strategy

LLAMA = {"layers": 4, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 64,
         "seq": 8, "batch": 8, "dtype": "float32"}  # fmt: skip
M = 4
MESH, TEMPLATES = "pp=2,dp=2", ["dp"]
#: gradient all-reduces per stage as lowered: 2 layers x 9 params + embed / + final_norm, lm_head
LOWERED = [19, 20]
ONLY = {
    "dp_grad_scaling": {"dp_grad_scaling": True, "dp_fuse_allreduce": False, "dp_overlap": False},
    "dp_fuse_allreduce": {"dp_grad_scaling": False, "dp_overlap": False},
    "dp_overlap": {"dp_grad_scaling": False, "dp_fuse_allreduce": False},
}


def micro_model() -> Graph:
    return build_model("llama3-8b", {**LLAMA, "batch": 8 // M})


def micro_training() -> Graph:
    """The per-micro-batch training graph the passes look values up in."""
    return training_graph(micro_model())


def pipeline() -> PipelineProgram:
    return build_pipeline(micro_model(), Strategy.build(MESH, TEMPLATES), microbatches=M)


def grad_all_reduces(p: PipelineProgram) -> list[int]:
    return [sum(is_grad_all_reduce(op) for op in stage.ops) for stage in p.stages]


def p2p_ops(p: PipelineProgram) -> list[list[str]]:
    return [[op.name for op in s.ops if op.kind in ("send", "recv")] for s in p.stages]


@pytest.mark.parametrize(
    ("config", "send_wait"),
    [(ONLY["dp_grad_scaling"], False), (ONLY["dp_fuse_allreduce"], False),
     (ONLY["dp_overlap"], False), ({"dp_fuse_allreduce": {"bucket_mb": 0.1}}, False),
     (None, True)],
    ids=["scaling", "fuse", "overlap", "all-small-buckets", "all+send_wait"],
)  # fmt: skip
def test_stage_passes_match_one_device(config: dict[str, Any] | None, send_wait: bool) -> None:
    training = micro_training()
    built: list[PipelineProgram] = []

    def transform(p: PipelineProgram) -> PipelineProgram:
        out, summaries = apply_stage_passes(p, training, config)
        assert all(len(s["stages"]) == 2 for s in summaries)
        if send_wait:
            out, sw = pipeline_send_wait(out)
            assert sw.holds_added == M
        built.extend((p, out))
        return out

    report = verify_pipeline(
        "llama3-8b",
        Strategy.build(MESH, TEMPLATES),
        microbatches=M,
        schedule="1f1b",
        overrides=LLAMA,
        compute_dtype="float64",
        transform=transform,
    )
    assert report.ok, report.failed()[:3]
    assert report.summary["compared"] == 1 + 39 * 4  # loss, 39 grads, params, 2 AdamW moments
    before, after = built
    assert [check_hazards(stage) for stage in after.stages] == [[], []]
    if send_wait:
        check_implied(after)
    else:  # the DP passes leave every send and recv where it was
        assert p2p_ops(after) == p2p_ops(before)


@pytest.mark.parametrize(
    ("bucket_mb", "per_stage", "closed_by"),
    [(25.0, [1, 1], {"reader": 2}), (0.1, [4, 4], {"cap": 6, "reader": 2}),
     (0.05, [8, 8], {"cap": 14, "reader": 2})],
)  # fmt: skip
def test_fusion_counts(bucket_mb: float, per_stage: list[int], closed_by: dict[str, int]) -> None:
    p = pipeline()
    assert grad_all_reduces(p) == LOWERED
    config = {**ONLY["dp_fuse_allreduce"], "dp_fuse_allreduce": {"bucket_mb": bucket_mb}}
    fused, [summary] = apply_stage_passes(p, micro_training(), config)
    assert grad_all_reduces(fused) == per_stage
    total = sum(per_stage)
    assert summary["pass"] == "dp_fuse_allreduce"
    assert (summary["all_reduces_before"], summary["all_reduces_after"]) == (39, total)
    assert summary["message"] == f"39 all-reduces fused into {total} over 2 stages"
    assert summary["closed_by"] == closed_by
    assert [s["all_reduces_after"] for s in summary["stages"]] == per_stage
    assert [s["bucket_bytes"] for s in summary["stages"]] == [int(bucket_mb * 2**20)] * 2
    assert "bucket_bytes" not in summary  # a setting, not a count


def test_overlap_waits_for_the_last_microbatch_accumulation() -> None:
    p = pipeline()
    out, summaries = apply_stage_passes(p, micro_training(), None)
    overlap = summaries[-1]
    assert overlap["pass"] == "dp_overlap" and overlap["all_reduces"] == 2
    assert overlap["issued_during_backward_after"] == 2
    for stage in out.stages:
        at = {v: i for i, op in enumerate(stage.ops) for v in op.outputs}
        adds = [i for i, op in enumerate(stage.ops) if op.name.endswith(f".acc_add#{M - 1}")]
        packs = [i for i, op in enumerate(stage.ops) if op.kind == "pack"]
        assert len(packs) == 1 and packs[0] > max(adds)  # one bucket, after every last add
        assert all(v.endswith(".acc") for v in stage.ops[packs[0]].inputs)
        for i, op in enumerate(stage.ops):
            if is_grad_all_reduce(op) or op.kind == "pack":
                assert all(at[v] < i for v in op.inputs)


def test_overlap_alone_moves_the_accumulated_all_reduces_up() -> None:
    out, [summary] = apply_stage_passes(pipeline(), micro_training(), ONLY["dp_overlap"])
    assert grad_all_reduces(out) == LOWERED
    assert (summary["all_reduces"], summary["moved"]) == (39, 33)
    assert summary["message"] == "33 of 39 gradient all-reduces moved up over 2 stages"
    for stage in out.stages:
        index = {op.name: i for i, op in enumerate(stage.ops)}
        for i, op in enumerate(stage.ops):
            if is_grad_all_reduce(op):
                assert op.inputs[0].endswith(".acc")
                assert all(index[d] < i for d in op.deps)
                assert stage.ops[index[op.deps[0]]].name.endswith(f".acc_add#{M - 1}")


def test_no_passes_leave_the_pipeline_alone() -> None:
    p = pipeline()
    off = {"dp_grad_scaling": False, "dp_fuse_allreduce": False, "dp_overlap": False}
    out, summaries = apply_stage_passes(p, micro_training(), off)
    assert summaries == [] and out.stages == p.stages
