"""CI checks over REST, on SQLite and PostgreSQL, built by an in-process worker: a plan within
budget passes, a strategy version slower than the baseline by more than the allowed percent
fails and the Markdown names the regression, a plan over the memory fails on `must_fit`;
bad input gets a 4xx naming the field, with nothing stored."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

from fastapi.testclient import TestClient

from backend.settings import Settings
from tests.api.conftest import assert_error
from tests.api.test_plans import TINY, run_jobs


def _ids(client: TestClient) -> dict[str, int]:
    """A tiny llama and two strategy versions of one name: data parallelism on 4 GPUs (the
    baseline) and dp=2 x tp=4 (26% slower on this model: tensor parallelism's collectives
    outweigh its tiny matmuls)."""
    model = client.post("/api/models", json={"name": "tiny", "preset": "llama3-8b",
                                              "overrides": TINY})  # fmt: skip
    assert model.status_code == 201, model.text
    first = client.post("/api/strategies", json={"name": "s", "mesh": "dp=4",
                                                 "templates": ["dp"]})  # fmt: skip
    assert first.status_code == 201, first.text
    second = client.put(f"/api/strategies/{first.json()['id']}",
                        json={"mesh": "dp=2,tp=4", "templates": ["dp", "megatron_tp"]})  # fmt: skip
    assert second.status_code in (200, 201), second.text
    return {"model": model.json()["id"], "v1": first.json()["id"], "v2": second.json()["id"]}


def _check(client: TestClient, body: dict[str, Any]) -> int:
    created = client.post("/api/checks", json=body)
    assert created.status_code == 202, created.text
    return int(created.json()["id"])


def test_a_check_passes_within_budget_and_fails_a_regression(
    client: TestClient, other_client: TestClient, settings: Settings
) -> None:
    ids = _ids(client)
    base = {"model_id": ids["model"], "cluster": "h100-sxm-1x8"}
    baseline = client.post("/api/plans", json={**base, "strategy_id": ids["v1"]}).json()["id"]
    run_jobs(settings)
    within = _check(
        client,
        {
            **base,
            "strategy_id": ids["v1"],
            "baseline_plan_id": baseline,
            "budgets": {"max_regression_pct": 5, "max_fallback_ops": 0},
        },
    )
    slower = _check(client, {**base, "strategy_id": ids["v2"], "baseline_plan_id": baseline,
                             "budgets": {"max_regression_pct": 5}})  # fmt: skip
    queued = client.get(f"/api/checks/{within}").json()
    assert queued["status"] == "queued" and queued["passed"] is None and queued["verdict"] is None
    assert_error(client.get(f"/api/checks/{within}/junit"), 409, "not_ready", "queued")
    run_jobs(settings)
    ok = client.get(f"/api/checks/{within}").json()
    assert ok["status"] == "succeeded" and ok["passed"] is True
    budgets = [r["budget"] for r in ok["verdict"]["results"]]
    assert budgets == ["must_fit", "max_regression_pct", "max_fallback_ops"]
    assert ok["markdown"].startswith("✅ **Shardlab check passed**")
    assert f"(/#/plans/{ok['plan_id']})" in ok["markdown"]
    bad = client.get(f"/api/checks/{slower}").json()
    assert bad["passed"] is False
    assert "❌ **Shardlab check failed**" in bad["markdown"]
    assert "(max_regression_pct)" in bad["markdown"] and "**FAIL**" in bad["markdown"]
    junit = client.get(f"/api/checks/{slower}/junit")
    assert junit.status_code == 200 and junit.headers["content-type"].startswith("application/xml")
    assert ET.fromstring(junit.text).get("failures") == "1"
    # another team sees neither the check nor its report
    assert_error(other_client.get(f"/api/checks/{within}"), 404, "not_found", "check")
    assert_error(other_client.get(f"/api/checks/{within}/junit"), 404, "not_found", "check")


def test_a_plan_over_the_memory_fails_on_must_fit(client: TestClient, settings: Settings) -> None:
    """Llama-3-8B with plain data parallelism needs 161 GB a rank, of 80."""
    model = client.post("/api/models", json={"name": "8b", "preset": "llama3-8b"})
    strategy = client.post("/api/strategies", json={"name": "dp", "mesh": "dp=8",
                                                    "templates": ["dp"]})  # fmt: skip
    check = _check(client, {"model_id": model.json()["id"], "strategy_id": strategy.json()["id"],
                            "cluster": "h100-sxm-1x8", "budgets": {"must_fit": True}})  # fmt: skip
    run_jobs(settings)
    out = client.get(f"/api/checks/{check}").json()
    assert out["passed"] is False, out
    (fit,) = out["verdict"]["results"]
    assert fit["budget"] == "must_fit" and fit["passed"] is False
    assert "| must_fit |" in out["markdown"]


def test_bad_checks_are_named_and_store_nothing(
    client: TestClient, other_client: TestClient, settings: Settings
) -> None:
    ids = _ids(client)
    base = {"model_id": ids["model"], "strategy_id": ids["v1"], "cluster": "h100-sxm-1x8"}
    plans_before = client.get("/api/plans").headers["X-Total-Count"]
    for body, status, code, field in (
        ({**base, "budgets": {"max_step_time_s": -1}}, 422, "invalid_request", "max_step_time_s"),
        ({**base, "budgets": {"min_mfu": 40}}, 422, "invalid_request", "min_mfu"),
        ({**base, "budgets": {"max_regression_pct": 5}}, 422, "invalid_check", "baseline_plan_id"),
        ({**base, "baseline_plan_id": 999}, 404, "not_found", "999"),
        ({**base, "budgets": {"verify": True}}, 422, "invalid_check", "verify"),
        ({**base, "budgets": {"max_steps": 3}}, 422, "invalid_request", "max_steps"),
        ({**base, "cluster": "nowhere"}, 404, "not_found", "nowhere"),
    ):
        assert_error(client.post("/api/checks", json=body), status, code, field)
    # another team's model or baseline is not found either
    theirs = {**base, "model_id": ids["model"]}
    assert_error(other_client.post("/api/checks", json=theirs), 404, "not_found", "model")
    assert client.get("/api/plans").headers["X-Total-Count"] == plans_before
