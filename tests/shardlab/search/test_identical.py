"""Candidates whose plans are identical are one row of the ranking; different plans stay
apart, however close."""

from __future__ import annotations

import pytest

from shardlab.cost.clusters import load_cluster
from shardlab.models import build_model
from shardlab.search.evaluate import evaluate
from shardlab.search.identical import merge_identical, plan_key
from shardlab.search.results import SearchResult, rank
from shardlab.search.space import Candidate, Mesh3

#: GPT without dropout: selective recomputation under FSDP keeps what it would drop
GPT = {"layers": 4, "hidden": 128, "heads": 8, "kv_heads": 2, "ffn": 256, "vocab": 256,
       "seq": 64, "dropout": 0.0, "batch": 8}  # fmt: skip
DP4 = Mesh3(1, 4, 1)


@pytest.fixture(scope="module")
def evaluations():
    model = build_model("gpt", GPT)
    cluster = load_cluster("h100-sxm-1x4")
    candidates = {
        "fsdp": Candidate(DP4, "fsdp", False, "none"),
        "fsdp selective": Candidate(DP4, "fsdp", False, "selective"),
        "zero1": Candidate(DP4, "zero1", False, "none"),
        "zero2": Candidate(DP4, "zero2", False, "none"),
        "dp": Candidate(DP4, "dp", False, "none"),
        "dp selective": Candidate(DP4, "dp", False, "selective"),
    }
    return {name: evaluate(c, model, cluster, 0.1) for name, c in candidates.items()}


def test_two_recipes_with_the_same_plan_are_one_row(evaluations):
    plain, selective = evaluations["fsdp"], evaluations["fsdp selective"]
    # the same plan: step to the nanosecond, peak memory and communication to the byte
    assert plain.step_time_s == selective.step_time_s == pytest.approx(1.93e-3, rel=0.05)
    assert plain.peak_memory_bytes == selective.peak_memory_bytes
    assert plain.peak_memory_bytes == pytest.approx(4.16e6, rel=0.05)
    assert plain.comm_bytes_per_rank == selective.comm_bytes_per_rank
    assert plan_key(plain) == plan_key(selective)
    ranked = rank([selective, plain])  # the simpler recipe stands for the row either way
    fsdp = [e for e in ranked if e.candidate.dp_recipe == "fsdp"]
    assert fsdp == [plain] and plain.same_plan == [selective.candidate]
    assert merge_identical(ranked) == ranked  # merging again changes nothing
    assert plain.same_plan == [selective.candidate]
    row = plain.to_json()
    assert [t["label"] for t in row["same_plan"]] == ["dp=4 dp+fsdp, recompute selective"]
    assert row["same_plan"][0]["recompute"] == "selective"


def test_different_plans_stay_apart(evaluations):
    fresh = {k: evaluate(e.candidate, build_model("gpt", GPT), load_cluster("h100-sxm-1x4"),
                         0.1) for k, e in evaluations.items() if k != "fsdp selective"}  # fmt: skip
    for a in fresh.values():
        for b in fresh.values():
            if a is not b:
                assert plan_key(a) != plan_key(b), (a.candidate.label(), b.candidate.label())
    # selective recomputation changes plain data parallelism's step (not its peak): two rows
    assert fresh["dp"].step_time_s != fresh["dp selective"].step_time_s
    ranked = rank(list(fresh.values()))
    assert len(ranked) == len(fresh) and all(not e.same_plan for e in ranked)
    result = SearchResult("gpt", "h100-sxm-1x4", 4, 8, ranked, [])
    assert result.planned == len(fresh)
    assert result.to_json()["planned"] == len(fresh)


def test_screened_figures_and_refusals_never_merge(evaluations):
    from dataclasses import replace

    plain = evaluations["fsdp"]
    assert plan_key(replace(plain, screened=(4, 5))) is None
    assert plan_key(replace(plain, error="no")) is None
