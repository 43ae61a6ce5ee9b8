"""The search end to end on small models: ranking, the Pareto front, agreement with an
exhaustive walk of the same space, and clear errors for bad input."""

from __future__ import annotations

import dataclasses
import itertools
import json
import re

import pytest
from typer.testing import CliRunner

from shardlab.cli import app
from shardlab.cost.clusters import ClusterError, load_cluster
from shardlab.models import build_model
from shardlab.search.evaluate import evaluate
from shardlab.search.run import SearchError, search
from shardlab.search.space import Limits, ModelShape, every_candidate

TINY = {"layers": 4, "hidden": 128, "heads": 8, "kv_heads": 2, "ffn": 256, "vocab": 256,
        "seq": 64}  # fmt: skip


def _small_memory(gib: float):
    """One node of 8 H100 with `gib` GiB each: memory decides the recipe."""
    return dataclasses.replace(load_cluster("h100-sxm-1x8"), hbm_bytes=int(gib * (1 << 30)))


def test_fitting_candidates_rank_first_and_the_front_trades_time_for_memory():
    cluster = _small_memory(0.012)
    result = search("llama3-8b", cluster, overrides=TINY, global_batch=8, gpus=4, workers=1)
    ranked = result.ranked
    fits = [e.fits for e in ranked]
    assert any(fits) and not all(fits)
    assert fits == sorted(fits, reverse=True)  # no candidate that fits below one that does not
    steps = [e.step_time_s for e in result.feasible]
    assert steps == sorted(steps)
    # some base recipes did not fit and were retried leaner (ZeRO, FSDP, recomputation)
    leaner = [e for e in ranked if e.candidate.dp_recipe not in ("dp", None)
              or e.candidate.recompute != "none"]  # fmt: skip
    assert leaner
    assert all(e.reason and "GiB" in e.reason for e in ranked if not e.fits and not e.error)
    front = result.pareto()
    assert front[0] is result.winner
    for a, b in itertools.pairwise(front):
        assert a.step_time_s <= b.step_time_s and a.peak_memory_bytes > b.peak_memory_bytes
    why = result.why()
    assert why[0].startswith(f"winner: {result.winner.candidate.label()}")
    data = result.to_json()
    assert data["candidates"][0]["fits"] and data["pareto"][0] == 0
    assert set(data["candidates"][0]) >= {"mesh", "templates", "recompute", "schedule",
                                          "microbatches", "step_time_s", "peak_memory_bytes",
                                          "fits"}  # fmt: skip


def test_the_winner_is_within_one_percent_of_the_exhaustive_best():
    cluster = _small_memory(0.012)
    model = build_model("llama3-8b", {**TINY, "batch": 8})
    result = search("llama3-8b", cluster, overrides=TINY, global_batch=8, gpus=4, workers=1)
    shape = ModelShape(4, 8, 2, 8)
    every = [evaluate(c, model, cluster, 0.1) for c in every_candidate(shape, Limits(4, 8))]
    assert len(every) > len(result.ranked)  # the search walked less than the whole space
    best = min(e.step_time_s for e in every if e.fits)
    assert result.winner is not None
    assert result.winner.step_time_s <= best * 1.01


def test_bad_input_names_the_value():
    with pytest.raises(SearchError, match="--gpus must be 1 to 8"):
        search("llama3-8b", "h100-sxm-1x8", overrides=TINY, gpus=0, workers=1)
    with pytest.raises(SearchError, match="--global-batch must be at least 1"):
        search("llama3-8b", "h100-sxm-1x8", overrides=TINY, global_batch=0, workers=1)
    with pytest.raises(ClusterError, match="nope"):
        search("llama3-8b", "nope-1x8", overrides=TINY, workers=1)
    with pytest.raises(SearchError, match="needs a transformer preset"):
        search("mlp_demo", "h100-sxm-1x8", workers=1)


def test_a_model_that_fits_nowhere_says_so():
    result = search("llama3-8b", _small_memory(0.0001), overrides=TINY, global_batch=4,
                    gpus=2, workers=1)  # fmt: skip
    assert result.winner is None
    assert result.why()[0].startswith("no candidate fits: the leanest")


def test_cli_search_json_and_text():
    runner = CliRunner()
    args = ["search", "llama3-8b", "--cluster", "h100-sxm-1x4", "--global-batch", "8",
            "--workers", "1"] + [f"--set={k}={v}" for k, v in TINY.items()]  # fmt: skip
    out = runner.invoke(app, [*args, "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)  # progress goes to stderr: stdout is the JSON alone
    assert data["gpus"] == 4 and data["candidates"][0]["fits"]
    assert data["planned"] == sum(1 + len(c["same_plan"]) for c in data["candidates"])
    assert "search: 100% ranked" in out.stderr
    assert re.search(r"search: +\d+% screened \d+, planned \d+, skipped \d+ of \d+ candidates",
                     out.stderr)  # fmt: skip
    quiet = runner.invoke(app, [*args, "--json", "--no-progress"])
    assert quiet.exit_code == 0 and quiet.stderr == ""
    text = runner.invoke(app, [*args, "--top", "3"])
    assert text.exit_code == 0, text.output
    assert "Pareto front" in text.output and "winner:" in text.output
    bad = runner.invoke(app, ["search", "llama3-8b", "--cluster", "h100-sxm-1x4", "--gpus", "9"])
    assert bad.exit_code == 1 and "--gpus must be 1 to 4" in bad.output


def test_worker_processes_leave_the_refinement_to_a_thread_that_finds_the_same():
    """With worker processes, the per-op refinement runs beside the pipelines' plans, from
    the moment the flat plans it stands on are all made: the same base and refined plan as
    one process refining after the walk."""
    options = {"overrides": TINY, "global_batch": 8, "gpus": 4}
    one = search("llama3-8b", "h100-sxm-1x8", workers=1, **options)
    two = search("llama3-8b", "h100-sxm-1x8", workers=2, **options)
    assert one.refinement is not None and two.refinement is not None
    assert two.refinement.base.candidate == one.refinement.base.candidate
    assert one.refinement.evaluation is not None and two.refinement.evaluation is not None
    assert two.refinement.evaluation.step_time_s == pytest.approx(
        one.refinement.evaluation.step_time_s
    )
    assert two.winner is not None and one.winner is not None
    assert two.winner.step_time_s == pytest.approx(one.winner.step_time_s)
