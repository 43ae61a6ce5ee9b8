"""Poison input, on SQLite and PostgreSQL (issue 40, findings 2 to 4).

- At the door: a lone surrogate (`"\\ud800"`, a valid JSON escape that no UTF-8 text can
  hold) in any string or key, NaN, Infinity and `1e309` (which parses as infinity), integers
  past 2^63 - 1, offsets past any list, absurd micro-batches and a Hugging Face config with
  zero heads or -1 layers are each a 422 naming the field, and nothing is stored.
- Records that got stored anyway (before the door refused them, or written by hand) are
  readable for good: a job whose config holds lone surrogates, a cluster whose description
  does, a model whose graph is named so, a check whose budgets hold 1e400 and 10^400, and a
  check whose baseline plan was deleted all answer 200 on every read.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, field
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import text

from backend import blobs, ledger
from backend.orm import Check, Cluster, Job, Model
from backend.settings import Settings
from shardlab.cost.clusters import load_cluster
from tests.api.conftest import assert_error
from tests.api.test_bad_requests import GRAPH, Ref, body_refs, make, resolve, row_counts
from tests.api.test_model_import import LLAMA
from tests.api.test_plans import run_jobs

SURROGATE = "\ud800"
NAN, INF = float("nan"), float("inf")
SPEC = load_cluster("h100-sxm-1x8").to_json()
CHECK = {"model": {"preset": "mlp_demo"}, "strategy": {"mesh": "dp=2"}, "cluster": "cpu-local"}
TOO_BIG = 2**63  # one past the largest signed 64-bit integer
LISTS = ("plans", "models", "strategies", "searches", "reviews", "baselines")


@dataclass(frozen=True)
class Poison:
    """A request whose body (JSON text as `json.dumps` writes it: lone surrogates escaped,
    NaN and Infinity as those tokens; or `raw`, as given) must be refused."""

    id: str
    method: str
    path: str
    named: str
    body: Any = None
    raw: str | None = None
    code: str = "invalid_request"
    needs: tuple[str, ...] = field(default_factory=tuple)


DOOR = [
    Poison("import-name-lone-surrogate", "POST", "/api/models/import",
           "body.config._name_or_path: '\\ud800' is not valid Unicode",
           {"config": {**LLAMA, "_name_or_path": SURROGATE}}),
    Poison("import-config-key-lone-surrogate", "POST", "/api/models/import",
           "body.config: the key '\\ud800' is not valid Unicode",
           {"config": {**LLAMA, SURROGATE: 1}}),
    Poison("import-config-value-lone-surrogate", "POST", "/api/models/import",
           "body.config.architectures.0", {"config": {**LLAMA, "architectures": [SURROGATE]}}),
    Poison("cluster-description-lone-surrogate", "POST", "/api/clusters",
           "body.spec.description", {"name": "lab", "spec": {**SPEC, "description": SURROGATE}}),
    Poison("graph-name-lone-surrogate", "POST", "/api/models", "body.graph.name",
           {"name": "g", "graph": {**GRAPH, "name": SURROGATE}}),
    Poison("upload-graph-name-lone-surrogate", "POST", "/api/models/upload?name=up",
           "the graph document at name", raw=json.dumps({**GRAPH, "name": SURROGATE}),
           code="invalid_graph"),
    Poison("model-name-low-surrogate", "POST", "/api/models", "body.name: 'a\\udfff'",
           {"name": "a\udfff", "preset": "mlp_demo"}),
    Poison("strategy-name-lone-surrogate", "POST", "/api/strategies", "body.name",
           {"name": f"s{SURROGATE}", "mesh": "dp=2"}),
    Poison("check-max-step-infinity", "POST", "/api/checks",
           "body.budgets.max_step_time_s: Infinity is not a number JSON can hold",
           {**CHECK, "budgets": {"max_step_time_s": INF}}),
    Poison("check-max-step-1e309", "POST", "/api/checks", "body.budgets.max_step_time_s",
           raw='{"model": {"preset": "mlp_demo"}, "strategy": {"mesh": "dp=2"}, '
               '"cluster": "cpu-local", "budgets": {"max_step_time_s": 1e309}}'),
    Poison("check-max-fallback-10-400", "POST", "/api/checks",
           "body.budgets.max_fallback_ops: an integer of 401 digits is out of range",
           {**CHECK, "budgets": {"max_fallback_ops": 10**400}}),
    Poison("strategy-lr-nan", "POST", "/api/strategies", "body.options.lr: NaN",
           {"name": "s", "mesh": "dp=2", "options": {"lr": NAN}}),
    Poison("strategy-lr-infinity", "POST", "/api/strategies", "body.options.lr: Infinity",
           {"name": "s", "mesh": "dp=2", "options": {"lr": INF}}),
    Poison("strategy-edit-lr-minus-infinity", "PUT", "/api/strategies/{strategy}",
           "body.options.lr: -Infinity", {"mesh": "dp=2", "options": {"lr": -INF}},
           needs=("strategy",)),
    Poison("strategy-microbatches-2-63", "POST", "/api/strategies",
           "body.options.pipeline.microbatches: an integer of 19 digits is out of range",
           {"name": "p", "mesh": "pp=2", "options": {"pipeline": {"microbatches": TOO_BIG}}}),
    Poison("strategy-microbatches-2-62", "POST", "/api/strategies",
           "pipeline option 'microbatches' is 4611686018427387904, more than the limit of 65536",
           {"name": "p", "mesh": "pp=2", "options": {"pipeline": {"microbatches": 2**62}}},
           code="invalid_pipeline"),
    Poison("check-microbatches-2-63", "POST", "/api/checks",
           "body.strategy.options.pipeline.microbatches",
           {**CHECK, "strategy": {"mesh": "pp=2",
                                  "options": {"pipeline": {"microbatches": TOO_BIG}}}}),
    Poison("plan-model-id-2-63", "POST", "/api/plans", "body.model_id",
           {"model_id": TOO_BIG, "strategy_id": Ref("strategy")}),
    Poison("import-zero-heads", "POST", "/api/models/import",
           "config.num_attention_heads: num_attention_heads must be a positive integer, got 0",
           {"config": {**LLAMA, "num_attention_heads": 0}}, code="invalid_hf_config"),
    Poison("import-minus-one-layers", "POST", "/api/models/import",
           "config.num_hidden_layers: num_hidden_layers must be a positive integer, got -1",
           {"config": {**LLAMA, "num_hidden_layers": -1}}, code="invalid_hf_config"),
    Poison("import-head-dim-bool", "POST", "/api/models/import", "config.head_dim",
           {"config": {**LLAMA, "head_dim": True}}, code="invalid_hf_config"),
    *(Poison(f"offset-2-63-{name}", "GET", f"/api/{name}?offset={TOO_BIG}", "query.offset")
      for name in LISTS),
    Poison("offset-2-63-graph", "GET", f"/api/models/{{model}}/graph?offset={TOO_BIG}",
           "query.offset", needs=("model",)),
    Poison("offset-2-63-program", "GET", f"/api/plans/{{plan}}/program?offset={TOO_BIG}",
           "query.offset", needs=("plan",)),
]  # fmt: skip


def _send(client: TestClient, case: Poison, ids: dict[str, Any]) -> Any:
    path = case.path.format(**ids)
    if case.body is None and case.raw is None:
        return client.request(case.method, path)
    content = case.raw if case.raw is not None else json.dumps(resolve(case.body, ids))
    headers = {"Content-Type": "application/json"}
    return client.request(case.method, path, content=content.encode(), headers=headers)


def test_the_cases_are_named_uniquely() -> None:
    assert len({c.id for c in DOOR}) == len(DOOR)


@pytest.mark.parametrize("case", DOOR, ids=[c.id for c in DOOR])
def test_refused_at_the_door_naming_the_field(
    case: Poison, client: TestClient, app: FastAPI
) -> None:
    ids: dict[str, Any] = {}
    for name in (*case.needs, *body_refs(case.body)):
        make(client, name, ids)
    before = row_counts(app)
    assert_error(_send(client, case, ids), 422, case.code, case.named)
    assert row_counts(app) == before
    assert client.get("/api/jobs").status_code == 200


# -- what got stored anyway reads for good ---------------------------------------------------


def _team(app: FastAPI, client: TestClient) -> int:
    """The id of the client's team (the model `make` creates is the team's)."""
    ids: dict[str, Any] = {}
    make(client, "model", ids)
    with app.state.sessions() as session:
        model = session.get(Model, ids["model"])
        assert model is not None
        return int(model.team_id)


def test_a_job_whose_config_holds_lone_surrogates_reads_and_cancels(
    client: TestClient, app: FastAPI, settings: Settings
) -> None:
    team = _team(app, client)
    config = {**LLAMA, SURROGATE: SURROGATE, "_name_or_path": f"x{SURROGATE}"}
    with app.state.sessions() as session, session.begin():
        job = ledger.enqueue(session, settings, team, "import", {"config": config})
        job_id = job.id
    jobs = client.get("/api/jobs")
    assert jobs.status_code == 200, jobs.text
    assert jobs.json()[0]["payload"]["config"]["\ufffd"] == "\ufffd"
    assert client.get(f"/api/jobs/{job_id}").status_code == 200
    cancelled = client.post(f"/api/jobs/{job_id}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"


def test_a_cluster_whose_spec_holds_poison_reads(client: TestClient, app: FastAPI) -> None:
    team = _team(app, client)
    with app.state.sessions() as session, session.begin():
        session.add(Cluster(team_id=team, name="lab", spec={**SPEC, "description": "x"}))
    poisoned = json.dumps({**SPEC, "description": SURROGATE, "straggle": 1e400})
    poisoned = poisoned.replace('"straggle": Infinity', '"straggle": 1e400')
    with app.state.engine.begin() as conn:  # as a record written before the door held
        conn.execute(text("UPDATE clusters SET spec = :spec"), {"spec": poisoned})
    listed = client.get("/api/clusters")
    assert listed.status_code == 200, listed.text
    read = client.get("/api/clusters/lab")
    assert read.status_code == 200, read.text
    assert read.json()["spec"]["description"] == "\ufffd"


def test_a_model_whose_graph_is_named_with_a_lone_surrogate_reads(
    client: TestClient, app: FastAPI
) -> None:
    ids: dict[str, Any] = {}
    make(client, "model", ids)
    model_id = ids["model"]
    document = {**GRAPH, "name": f"g{SURROGATE}"}
    blob = zlib.compress(json.dumps(document).encode())  # as `blobs.pack` wrote it then
    with app.state.sessions() as session, session.begin():
        row = session.get(Model, model_id)
        assert row is not None
        row.graph_blob = blob
        row.summary = {**row.summary, "name": f"g{SURROGATE}"}
    for path in ("", "/graph", "/tree"):
        answer = client.get(f"/api/models/{model_id}{path}")
        assert answer.status_code == 200, (path, answer.text)
    assert client.get(f"/api/models/{model_id}/graph").json()["name"] == "g\ufffd"
    assert client.get("/api/models").status_code == 200
    assert blobs.unpack(blob)["name"] == "g\ufffd"


def _built_check(client: TestClient, settings: Settings, **more: Any) -> dict[str, Any]:
    answer = client.post("/api/checks", json={**CHECK, **more})
    assert answer.status_code == 202, answer.text
    assert run_jobs(settings) >= 1
    body: dict[str, Any] = answer.json()
    return body


def test_a_check_whose_budgets_hold_numbers_past_any_column_reads(
    client: TestClient, app: FastAPI, settings: Settings
) -> None:
    check = _built_check(client, settings, budgets={"max_step_time_s": 1.0})
    digits = "1" + "0" * 400
    poisoned = f'{{"must_fit": true, "max_step_time_s": 1e400, "max_fallback_ops": {digits}}}'
    with app.state.engine.begin() as conn:
        conn.execute(text("UPDATE checks SET budgets = :b WHERE id = :i"),
                     {"b": poisoned, "i": check["id"]})  # fmt: skip
    read = client.get(f"/api/checks/{check['id']}")
    assert read.status_code == 200, read.text
    assert read.json()["budgets"]["max_step_time_s"] is None
    assert client.get(f"/api/checks/{check['id']}/junit").status_code == 200


def test_a_check_whose_baseline_plan_was_deleted_reads_and_fails_saying_why(
    client: TestClient, app: FastAPI, settings: Settings
) -> None:
    baseline = _built_check(client, settings)
    with app.state.sessions() as session:
        row = session.get(Check, baseline["id"])
        assert row is not None
        baseline_plan = row.plan_id
    check = _built_check(client, settings, baseline_plan_id=baseline_plan,
                         budgets={"max_regression_pct": 5})  # fmt: skip
    assert client.get(f"/api/checks/{check['id']}").json()["passed"] is True
    assert client.delete(f"/api/plans/{baseline_plan}").status_code == 204
    read = client.get(f"/api/checks/{check['id']}")
    assert read.status_code == 200, read.text
    body = read.json()
    assert body["passed"] is False and body["baseline_plan_id"] is None
    (regression,) = [r for r in body["verdict"]["results"] if r["budget"] == "max_regression_pct"]
    assert "its plan was deleted" in regression["figure"]
    junit = client.get(f"/api/checks/{check['id']}/junit")
    assert junit.status_code == 200 and "its plan was deleted" in junit.text
    with app.state.sessions() as session:
        assert session.get(Job, body["job_id"]) is not None
