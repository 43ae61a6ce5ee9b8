"""The worker's verify job (`worker.engine.run_verify`): a pipeline runs as its schedule says,
on either backend, and a model too large to verify runs as its scaled-down twin or is
refused."""

from __future__ import annotations

from typing import Any

import pytest

from shardlab.errors import ExecutionError
from shardlab.graph_json import graph_to_json
from shardlab.models import build_model
from worker.engine import run_verify

TINY = {"layers": 4, "hidden": 32, "heads": 4, "kv_heads": 2, "ffn": 64, "vocab": 64,
        "seq": 8, "batch": 4}  # fmt: skip


def _quiet(fraction: float, message: str) -> None:
    pass


def _inputs(model: dict[str, Any], mesh: str, templates: list[str], **extra: Any) -> dict:
    graph = graph_to_json(build_model("llama3-8b", model))
    strategy = {"mesh": mesh, "templates": templates, "options": extra.pop("options", {})}
    return {"graph": graph, "strategy": strategy, "compute_dtype": "float64", **extra}


@pytest.mark.parametrize("backend", ["simulated", "torch"])
def test_a_pipelined_plan_verifies_as_a_pipeline(backend: str) -> None:
    options = {"pipeline": {"schedule": "1f1b", "microbatches": 2}}
    inputs = _inputs(TINY, "pp=2", [], options=options, backend=backend)
    report = run_verify(inputs, _quiet)["report"]
    assert report["ok"], report["first_divergence"]
    summary = report["summary"]
    assert (summary["schedule"], summary["pp"], summary["microbatches"]) == ("1f1b", 2, 2)
    assert "twin" not in summary and summary["estimate_bytes"] < summary["limit_bytes"]


def test_a_full_size_model_verifies_as_its_twin_or_is_refused() -> None:
    inputs = _inputs({}, "dp=2,tp=2", ["dp", "megatron_tp"])
    report = run_verify(inputs, _quiet)["report"]
    assert report["ok"], report["first_divergence"]
    twin = report["summary"]["twin"]
    assert twin["changes"]["layers"] == [32, 2] and twin["full_estimate_bytes"] > (1 << 40)
    with pytest.raises(ExecutionError, match=r"over the limit of 4\.00 GiB"):
        run_verify({**inputs, "twin": False}, _quiet)
