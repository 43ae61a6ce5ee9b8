"""Strategy searches through the REST API: a job with progress, then the ranked candidates
with their Pareto front, the same JSON as `shardlab search --json`."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from backend.settings import Settings
from tests.api.conftest import assert_error
from tests.api.test_plans import TINY, run_jobs


def tiny_model(client: TestClient) -> int:
    models = {m["name"]: m["id"] for m in client.get("/api/models").json()}
    if "tiny" in models:
        return int(models["tiny"])
    made = client.post("/api/models", json={"name": "tiny", "preset": "llama3-8b",
                                            "overrides": TINY})  # fmt: skip
    assert made.status_code == 201, made.text
    return int(made.json()["id"])


def create_search(client: TestClient, **extra: Any) -> int:
    body = {"model_id": tiny_model(client), "cluster": "h100-sxm-1x4", **extra}
    made = client.post("/api/searches", json=body)
    assert made.status_code == 202, made.text
    return int(made.json()["id"])


def test_a_search_runs_as_a_job_and_ranks_its_candidates(
    client: TestClient, settings: Settings
) -> None:
    search_id = create_search(client, memory_headroom=0.2)
    queued = client.get(f"/api/searches/{search_id}").json()
    assert queued["status"] == "queued" and queued["result"] is None
    assert queued["request"]["memory_headroom"] == 0.2 and queued["cluster"] == "h100-sxm-1x4"
    assert run_jobs(settings) == 1
    done = client.get(f"/api/searches/{search_id}").json()
    assert done["status"] == "succeeded", done["error"]
    assert done["progress"] == 1.0
    result = done["result"]
    assert result["format"] == "shardlab.search/1" and result["gpus"] == 4
    best = result["candidates"][0]
    assert best["fits"] and result["pareto"][0] == 0
    assert {"mesh", "templates", "recompute", "schedule", "microbatches", "options",
            "step_time_s", "peak_memory_bytes", "fits", "reason"} <= set(best)  # fmt: skip
    fits = [c["fits"] for c in result["candidates"]]
    assert fits == sorted(fits, reverse=True)
    assert result["why"][0].startswith("winner: ")
    job = client.get(f"/api/jobs/{done['job_id']}").json()
    assert job["kind"] == "search" and job["result"]["winner"] == best["label"]
    listed = client.get("/api/searches").json()
    assert [s["id"] for s in listed] == [search_id]

    # the winner becomes a stored strategy and plan through the usual endpoints
    strategy = client.post("/api/strategies", json={
        "name": "found", "mesh": best["mesh"], "templates": best["templates"],
        "annotations": best["annotations"], "options": best["options"]}).json()  # fmt: skip
    plan = client.post("/api/plans", json={"model_id": done["model_id"],
                                           "strategy_id": strategy["id"],
                                           "cluster": "h100-sxm-1x4"})  # fmt: skip
    assert plan.status_code == 202, plan.text
    assert run_jobs(settings) == 1
    built = client.get(f"/api/plans/{plan.json()['id']}").json()
    assert built["summary"]["cost"]["step_time_s"] == best["step_time_s"]


def test_bad_searches_are_refused_and_name_the_value(client: TestClient) -> None:
    model_id = tiny_model(client)
    answer = client.post("/api/searches", json={"model_id": model_id, "cluster": "h100-sxm-1x4",
                                                "gpus": 9})  # fmt: skip
    assert_error(answer, 422, "invalid_search", "gpus 9", "4 devices")
    answer = client.post("/api/searches", json={"model_id": model_id, "cluster": "nope-1x8"})
    assert_error(answer, 404, "not_found", "nope-1x8")
    answer = client.post("/api/searches", json={"model_id": model_id, "cluster": "h100-sxm-1x4",
                                                "gpus": 0})  # fmt: skip
    assert_error(answer, 422, "invalid_request", "gpus")
    answer = client.post("/api/searches", json={"model_id": 999, "cluster": "h100-sxm-1x4"})
    assert_error(answer, 404, "not_found", "999")
    document = client.get(f"/api/models/{model_id}/graph").json()
    raw = client.post("/api/models", json={"name": "raw", "graph": document}).json()
    answer = client.post("/api/searches", json={"model_id": raw["id"], "cluster": "h100-sxm-1x4"})
    assert_error(answer, 422, "invalid_search", "not made from a preset")
    assert client.get("/api/searches").json() == []


def test_a_candidate_is_built_at_the_searched_global_batch_and_again_without_a_409(
    client: TestClient, settings: Settings
) -> None:
    """ "Build this plan" once planned the model at its own batch (8) under a candidate
    searched at 16 (a 422), and a retry hit the strategy's name (409). Now the search
    builds the candidate: the team's model of the preset at the searched batch (made once),
    the candidate's strategy (one version), the plan the search costed."""
    search_id = create_search(client, global_batch=16)
    assert_error(client.post(f"/api/searches/{search_id}/plans", json={"candidate": 0}),
                 409, "not_ready", "queued")  # fmt: skip
    assert run_jobs(settings) == 1
    result = client.get(f"/api/searches/{search_id}").json()["result"]
    assert result["global_batch"] == 16
    best = result["candidates"][0]
    plans = [client.post(f"/api/searches/{search_id}/plans", json={"candidate": 0})
             for _ in range(2)]  # fmt: skip
    assert [p.status_code for p in plans] == [202, 202], plans[1].text
    assert run_jobs(settings) == 2
    built = [client.get(f"/api/plans/{p.json()['id']}").json() for p in plans]
    assert built[0]["model_id"] == built[1]["model_id"] != tiny_model(client)
    assert built[0]["strategy_id"] == built[1]["strategy_id"]
    model = client.get(f"/api/models/{built[0]['model_id']}").json()
    assert model["overrides"]["batch"] == 16
    strategy = client.get(f"/api/strategies/{built[0]['strategy_id']}").json()
    assert (strategy["mesh"], strategy["templates"]) == (best["mesh"], best["templates"])
    assert built[0]["summary"]["cost"]["step_time_s"] == pytest.approx(best["step_time_s"])
    n = len(result["candidates"])
    assert_error(client.post(f"/api/searches/{search_id}/plans", json={"candidate": n}),
                 422, "invalid_candidate", f"ranked {n} candidates")  # fmt: skip
