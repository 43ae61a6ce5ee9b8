"""CI checks over REST, on SQLite and PostgreSQL, built by an in-process worker: a plan within
budget passes, a strategy version slower than the baseline by more than the allowed percent
fails and the Markdown names the regression, a plan over the memory fails on `must_fit`;
bad input gets a 4xx naming the field, with nothing stored. A fresh team checks a preset
under an inline strategy, which are stored once and reused (an inline strategy that differs
from its name's latest version adds the next one)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import func, select

from backend.db import make_engine, session_factory
from backend.orm import Check, Job, Model, Plan
from backend.orm import Strategy as StrategyRow
from backend.settings import Settings
from shardlab.graph_json import graph_to_json
from shardlab.models import build_model
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
        ({**base, "budgets": {"max_regression_pct": 5}}, 422, "invalid_check", "baseline"),
        ({**base, "baseline_plan_id": 999}, 404, "not_found", "999"),
        ({**base, "baseline": "prod"}, 422, "invalid_check", "'prod'"),
        ({**base, "baseline": "prod", "baseline_plan_id": 1}, 422, "invalid_check", "not both"),
        (
            {
                "graph": graph_to_json(build_model("llama3-8b", {"layers": 2})),
                "strategy": {"mesh": "dp=8", "templates": ["dp"]},
                "cluster": "h100-sxm-1x8",
                "budgets": {"verify": True},
            },
            422,
            "invalid_check",
            "verify",
        ),  # 1.3B parameters on 8 ranks, a graph document with no twin: too large to verify
        ({**base, "budgets": {"max_steps": 3}}, 422, "invalid_request", "max_steps"),
        ({**base, "cluster": "nowhere"}, 404, "not_found", "nowhere"),
    ):
        assert_error(client.post("/api/checks", json=body), status, code, field)
    # another team's model or baseline is not found either
    theirs = {**base, "model_id": ids["model"]}
    assert_error(other_client.post("/api/checks", json=theirs), 404, "not_found", "model")
    assert client.get("/api/plans").headers["X-Total-Count"] == plans_before


def test_checks_compare_with_the_teams_baseline_and_verify(
    user_client: Any, settings: Settings
) -> None:
    """A regression budget with no baseline named compares with the baseline of the model on
    the cluster; `baseline` names one; `verify` adds a verification to the verdict."""
    ann, bob = user_client("alpha", "ann"), user_client("alpha", "bob")
    ids = _ids(ann)
    base = {"model_id": ids["model"], "cluster": "h100-sxm-1x8"}
    reference = ann.post("/api/plans", json={**base, "strategy_id": ids["v1"]}).json()["id"]
    run_jobs(settings)
    assert bob.post(f"/api/plans/{reference}/review/decision",
                    json={"decision": "approve"}).status_code == 200  # fmt: skip
    made = bob.post("/api/baselines", json={"plan_id": reference, "name": "prod"})
    assert made.status_code == 201, made.text
    implicit = _check(ann, {**base, "strategy_id": ids["v2"], "budgets": {"max_regression_pct": 5}})
    named = _check(ann, {**base, "strategy_id": ids["v1"], "baseline": "prod",
                         "budgets": {"max_regression_pct": 5, "verify": True}})  # fmt: skip
    pending = ann.get(f"/api/checks/{named}").json()
    assert pending["verification_id"] is not None and pending["status"] == "queued"
    run_jobs(settings)
    slower = ann.get(f"/api/checks/{implicit}").json()
    assert slower["baseline_plan_id"] == reference and slower["passed"] is False
    assert "(max_regression_pct)" in slower["markdown"]
    ok = ann.get(f"/api/checks/{named}").json()
    assert ok["status"] == "succeeded" and ok["passed"] is True, ok
    verify = ok["verdict"]["results"][-1]
    assert verify["budget"] == "verify" and verify["passed"] is True
    assert verify["figure"].endswith("tensors match") and int(verify["figure"].split()[0]) > 10
    assert "| verify |" in ok["markdown"]


# -- a check that names its model and strategy inline -----------------------------------------

INLINE = {"model": {"preset": "llama3-8b", "overrides": TINY},
          "strategy": {"mesh": "dp=4", "templates": ["dp"]}, "cluster": "h100-sxm-1x8"}  # fmt: skip
TABLES = (Model, StrategyRow, Plan, Check, Job)


def _rows(settings: Settings) -> dict[str, int]:
    """Rows of every table a check may write, across teams."""
    engine = make_engine(settings.database_url)
    try:
        with session_factory(engine)() as session:
            return {t.__tablename__: session.scalar(select(func.count()).select_from(t)) or 0
                    for t in TABLES}  # fmt: skip
    finally:
        engine.dispose()


def _created(client: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    created = client.post("/api/checks", json=body)
    assert created.status_code == 202, created.text
    out: dict[str, Any] = created.json()
    return out


def test_a_fresh_team_checks_a_preset_under_an_inline_strategy(
    client: TestClient, settings: Settings
) -> None:
    """Nothing stored first: the check stores the model and strategy, plans and judges; the
    same request again (overrides as strings too) reuses both."""
    first = _created(client, {**INLINE, "budgets": {"max_fallback_ops": 0}})
    run_jobs(settings)
    out = client.get(f"/api/checks/{first['id']}").json()
    assert out["status"] == "succeeded" and out["passed"] is True, out
    assert (out["model_id"], out["strategy_id"]) == (first["model_id"], first["strategy_id"])
    model = client.get(f"/api/models/{out['model_id']}").json()
    assert model["name"] == "llama3-8b (" + ", ".join(f"{k}={v}" for k, v in TINY.items()) + ")"
    assert (model["preset"], model["overrides"]) == ("llama3-8b", TINY)
    strategy = client.get(f"/api/strategies/{out['strategy_id']}").json()
    assert (strategy["name"], strategy["version"]) == ("dp=4 dp", 1)
    as_text = {k: str(v) for k, v in TINY.items()}
    again = _created(client, {**INLINE, "model": {"preset": "llama3-8b", "overrides": as_text}})
    assert (again["model_id"], again["strategy_id"]) == (out["model_id"], out["strategy_id"])
    assert _rows(settings) == {"models": 1, "strategies": 1, "plans": 2, "checks": 2, "jobs": 2}


def test_an_inline_strategy_of_a_known_name_adds_a_version_when_it_differs(
    client: TestClient, settings: Settings
) -> None:
    named = {**INLINE, "strategy": {"name": "ci", "mesh": "dp=4", "templates": ["dp"]}}
    v1 = _created(client, named)["strategy_id"]
    assert _created(client, named)["strategy_id"] == v1
    wider = {"name": "ci", "mesh": "dp=2,tp=4", "templates": ["dp", "megatron_tp"]}
    v2 = _created(client, {**INLINE, "strategy": wider})["strategy_id"]
    out = client.get(f"/api/strategies/{v2}").json()
    assert (out["name"], out["version"], out["mesh"]) == ("ci", 2, "dp=2,tp=4")
    assert _created(client, {**INLINE, "strategy": wider})["strategy_id"] == v2
    v3 = _created(client, named)  # v1's content, but v2 is the latest: it adds v3
    assert v3["strategy_id"] not in (v1, v2)
    # a stored model by id mixes with an inline strategy; a model of another preset is new
    mixed = _created(client, {**named, "model": None, "model_id": v3["model_id"]})
    assert (mixed["model_id"], mixed["strategy_id"]) == (v3["model_id"], v3["strategy_id"])
    mlp = _created(client, {**INLINE, "model": {"preset": "mlp_demo"}})
    assert client.get(f"/api/models/{mlp['model_id']}").json()["name"] == "mlp_demo"
    assert _rows(settings)["strategies"] == 4  # 'ci' v1..v3 and 'dp=4 dp' (the mlp's)


def test_a_check_by_graph_document_stores_it_once(client: TestClient, settings: Settings) -> None:
    document = graph_to_json(build_model("llama3-8b", TINY))
    taken = client.post("/api/models", json={"name": document["name"], "preset": "mlp_demo"})
    assert taken.status_code == 201, taken.text
    body = {**INLINE, "model": None, "graph": document}
    first = _created(client, body)
    model = client.get(f"/api/models/{first['model_id']}").json()
    assert (model["name"], model["source"]) == (f"{document['name']} #2", "json")
    assert _created(client, body)["model_id"] == first["model_id"]
    assert _rows(settings)["models"] == 2


def test_bad_inline_checks_are_named_and_store_nothing(
    client: TestClient, settings: Settings
) -> None:
    stored = _created(client, INLINE)
    before = _rows(settings)
    preset = INLINE["model"]
    for body, status, code, field in (
        ({**INLINE, "model_id": stored["model_id"]}, 422, "invalid_check", "model"),
        ({**INLINE, "model": None}, 422, "invalid_check", "model"),
        ({**INLINE, "graph": {"name": "g"}}, 422, "invalid_check", "model"),
        ({**INLINE, "strategy_id": stored["strategy_id"]}, 422, "invalid_check", "strategy"),
        ({**INLINE, "strategy": None}, 422, "invalid_check", "strategy"),
        ({**INLINE, "model": {"preset": "llama9"}}, 404, "invalid_preset", "model"),
        ({**INLINE, "model": {"preset": "llama3-8b", "overrides": {**TINY, "depth": 3}}},
         422, "invalid_override", "depth"),
        ({**INLINE, "model": {**preset, "colour": 1}}, 422, "invalid_request", "colour"),
        ({**INLINE, "graph": {"name": "g"}, "model": None}, 422, "invalid_graph", "graph"),
        ({**INLINE, "strategy": {"mesh": "dp=four"}}, 422, "invalid_mesh", "strategy"),
        ({**INLINE, "model": {"preset": "mlp_demo"}, "strategy": {"name": "new", "mesh": "dp=64"}},
         422, "invalid_cluster", "strategy: mesh dp=64"),  # a new model and strategy: undone
        ({**INLINE, "strategy": {"mesh": "dp=4", "annotations": ["nothing*=dp:S(0)"]}},
         422, "invalid_strategy", "strategy: annotation 'nothing*=dp:S(0)'"),
        ({**INLINE, "cluster": "nowhere"}, 404, "not_found", "cluster: cluster 'nowhere'"),
        ({**INLINE, "budgets": {"max_step_time_s": -1}}, 422, "invalid_request", "max_step_time_s"),
    ):  # fmt: skip
        error = assert_error(client.post("/api/checks", json=body), status, code, field)
        if code != "invalid_request":
            assert error["detail"]["field"] in ("model", "graph", "strategy", "cluster"), error
    assert _rows(settings) == before
