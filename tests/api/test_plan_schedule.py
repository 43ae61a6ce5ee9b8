"""The schedule view of a pipelined plan: slots by stage, and the ops of one unit."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from backend.settings import Settings
from tests.api.conftest import assert_error
from tests.api.test_plans import TINY, run_jobs, setup_plan


def create_pipelined_plan(client: TestClient, microbatches: int = 4, v: int = 2) -> int:
    models = {m["name"]: m["id"] for m in client.get("/api/models").json()}
    model_id = models.get("tiny-pp") or client.post(
        "/api/models",
        json={"name": "tiny-pp", "preset": "llama3-8b", "overrides": {**TINY, "layers": 4,
                                                                      "batch": 8}},
    ).json()["id"]  # fmt: skip
    options = {"pipeline": {"schedule": "interleaved", "microbatches": microbatches,
                            "virtual_stages": v}}  # fmt: skip
    strategy = client.post(
        "/api/strategies",
        json={"name": "pp", "mesh": "pp=2,tp=2", "templates": ["megatron_tp"],
              "options": options},
    ).json()  # fmt: skip
    body = {"model_id": model_id, "strategy_id": strategy["id"], "cluster": "h100-sxm-1x8"}
    created = client.post("/api/plans", json=body)
    assert created.status_code == 202, created.text
    return int(created.json()["id"])


def _get(client: TestClient, path: str) -> Any:
    answer = client.get(path)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_schedule_slots_and_units(client: TestClient, settings: Settings) -> None:
    plan_id = create_pipelined_plan(client)
    assert_error(client.get(f"/api/plans/{plan_id}/schedule"), 409, "not_ready")
    assert run_jobs(settings) == 1
    summary = _get(client, f"/api/plans/{plan_id}")["summary"]["pipeline"]
    view = _get(client, f"/api/plans/{plan_id}/schedule")
    assert view["schedule"] == "interleaved" and view["pp"] == 2 and view["microbatches"] == 4
    assert view["step_time_s"] == summary["step_time_s"]
    assert len(view["stages"]) == 2
    for stage in view["stages"]:
        slots = stage["slots"]
        n = len(slots["phase"])
        assert n == 2 * 4 * 2  # forward and backward, 4 micro-batches, 2 chunks per stage
        assert sorted(slots["microbatch"]) == sorted(list(range(4)) * 4)
        # one unit at a time: slots follow each other on their stage
        for i in range(1, n):
            assert slots["start"][i] >= slots["end"][i - 1] - 1e-15
        assert max(slots["end"]) == stage["end_s"]
        assert stage["end_s"] + stage["tail_s"] <= view["step_time_s"] * (1 + 1e-12)
    units = {(u["chunk"], u["phase"]) for u in view["units"]}
    assert units == {(c, p) for c in range(4) for p in "FB"}

    unit = _get(client, f"/api/plans/{plan_id}/schedule/units/1/B")
    ops = unit["ops"]
    assert unit["chunk"] == 1 and unit["phase"] == "B" and ops["name"]
    assert max(ops["end"]) == unit["seconds"]
    assert {"backward"} <= set(ops["role"])
    assert_error(client.get(f"/api/plans/{plan_id}/schedule/units/9/F"), 404, "not_found")
    assert_error(client.get(f"/api/plans/{plan_id}/schedule/units/1/X"), 422, "invalid_request")


def test_a_plan_without_pipeline_has_no_schedule(client: TestClient, settings: Settings) -> None:
    plan_id = setup_plan(client)
    run_jobs(settings)
    body = assert_error(client.get(f"/api/plans/{plan_id}/schedule"), 404, "not_found")
    assert f"/api/plans/{plan_id}/timeline" in body["message"]


def test_an_accumulated_plan_keeps_its_flat_mesh(client: TestClient, settings: Settings) -> None:
    """Gradient accumulation through the API: strategy option `microbatches` on dp=2, built
    by the worker as a schedule of one stage; the plan says accumulation, not a pipeline."""
    model = client.post("/api/models", json={"name": "tiny-acc", "preset": "llama3-8b",
                                              "overrides": {**TINY, "batch": 8}})  # fmt: skip
    assert model.status_code == 201, model.text
    strategy = client.post("/api/strategies", json={
        "name": "acc", "mesh": "dp=2", "templates": ["dp", "zero1"],
        "options": {"microbatches": 2}})  # fmt: skip
    assert strategy.status_code == 201, strategy.text
    body = {"model_id": model.json()["id"], "strategy_id": strategy.json()["id"],
            "cluster": "h100-sxm-1x8"}  # fmt: skip
    plan_id = client.post("/api/plans", json=body).json()["id"]
    assert run_jobs(settings) == 1
    plan = _get(client, f"/api/plans/{plan_id}")
    assert plan["status"] == "succeeded", plan
    summary = plan["summary"]
    assert summary["mesh"] == "dp=2"
    pipeline = summary["pipeline"]
    assert pipeline["accumulation"] is True and pipeline["microbatches"] == 2
    assert pipeline["pp"] == 1 and len(pipeline["stages"]) == 1
    stage = pipeline["stages"][0]
    assert (
        pipeline["step_time_s"]
        == sum(2 * (f + b) for f, b in zip(stage["forward_s"], stage["backward_s"], strict=True))
        + stage["tail_s"]
    )
