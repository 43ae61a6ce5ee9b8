"""Models API: presets with overrides, graph JSON (body and raw upload), limits, isolation."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import select

from backend.orm import Job, Model, Plan, Strategy
from shardlab.graph_json import graph_to_json
from shardlab.models import build_model
from shardlab.summary import model_summary
from tests.api.conftest import assert_error

SMALL = {
    "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 64, "seq": 8,
    "batch": 8,
}  # fmt: skip


def count(client: TestClient) -> int:
    """How many models team alpha lists."""
    return len(client.get("/api/models").json())


def create_small(client: TestClient, name: str = "tiny") -> dict[str, Any]:
    """Create the small llama (SMALL overrides); the 201 body."""
    body = {"name": name, "preset": "llama3-8b", "overrides": SMALL}
    response = client.post("/api/models", json=body)
    assert response.status_code == 201, response.text
    result: dict[str, Any] = response.json()
    return result


def test_preset_model_has_the_engine_summary(client: TestClient) -> None:
    expected = model_summary(build_model("llama3-8b", SMALL))
    created = create_small(client)
    assert created["params"] == expected["params"] == 82240
    assert created["flops_forward"] == expected["flops_forward"]
    assert created["layers"] == 2 and created["ops"] == expected["ops"] == 45
    assert (created["source"], created["preset"], created["overrides"]) == (
        "preset", "llama3-8b", SMALL,
    )  # fmt: skip
    detail = client.get(f"/api/models/{created['id']}").json()
    assert detail["summary"]["ops_by_kind"] == expected["ops_by_kind"]
    assert detail["summary"]["params"] == expected["params"]
    listed = client.get("/api/models").json()
    assert [m["name"] for m in listed] == ["tiny"] and "summary" not in listed[0]
    graph = client.get(f"/api/models/{created['id']}/graph").json()
    assert graph == graph_to_json(build_model("llama3-8b", SMALL))
    tree = client.get(f"/api/models/{created['id']}/tree").json()
    assert tree["params"] == expected["params"] and tree["ops"] == 45
    layers = [c for c in tree["children"] if c["path"] == "layers.*"]
    assert len(layers) == 1 and layers[0]["repeat"] == 2


def test_a_large_graph_comes_a_page_of_ops_at_a_time(client: TestClient) -> None:
    """`/graph` pages by ops (each page with the values its ops touch) and filters by scope;
    the pages put together are the document."""
    created = create_small(client)
    whole = graph_to_json(build_model("llama3-8b", SMALL))
    url = f"/api/models/{created['id']}/graph"
    first = client.get(f"{url}?limit=20")
    assert first.headers["X-Total-Count"] == "45" and 'rel="next"' in first.headers["Link"]
    pages = [first.json(), client.get(f"{url}?limit=20&offset=20").json(),
             client.get(f"{url}?limit=20&offset=40").json()]  # fmt: skip
    assert [op for page in pages for op in page["ops"]] == whole["ops"]
    for page in pages:
        touched = {n for op in page["ops"] for n in (*op["inputs"], *op["outputs"])}
        assert {v["name"] for v in page["values"]} == touched

    def under(op: dict[str, Any]) -> bool:  # not layers.0.attn_residual
        return bool(op["scope"] == "layers.0.attn" or op["scope"].startswith("layers.0.attn."))

    attn = client.get(f"{url}?scope=layers.0.attn").json()["ops"]
    assert attn == [op for op in whole["ops"] if under(op)] and len(attn) == 11


def test_graph_json_body_and_raw_upload(client: TestClient) -> None:
    document = graph_to_json(build_model("mlp_demo"))
    made = client.post("/api/models", json={"name": "from-json", "graph": document})
    assert made.status_code == 201, made.text
    assert (made.json()["source"], made.json()["params"]) == ("json", 1280)
    for i, kind in enumerate(("application/json", "application/octet-stream")):
        uploaded = client.post(
            f"/api/models/upload?name=up{i}",
            content=json.dumps(document).encode(),
            headers={"Content-Type": kind},
        )
        assert uploaded.status_code == 201, uploaded.text
        assert uploaded.json()["source"] == "upload" and uploaded.json()["ops"] == 3
    assert client.get(f"/api/models/{made.json()['id']}/graph").json() == document
    odd_meta = {**document, "meta": {"config": [1, 2]}}
    odd = client.post("/api/models", json={"name": "odd", "graph": odd_meta})
    assert odd.status_code == 201 and odd.json()["summary"]["config"] == {}


def test_bad_presets_and_overrides_name_the_culprit(client: TestClient) -> None:
    before = count(client)
    bad = client.post("/api/models", json={"name": "m", "preset": "llama9"})
    assert assert_error(bad, 404, "invalid_preset", "llama9")["detail"] == {"preset": "llama9"}
    key = client.post(
        "/api/models", json={"name": "m", "preset": "llama3-8b", "overrides": {"depth": 3}}
    )
    assert assert_error(key, 422, "invalid_override", "depth")["detail"]["key"] == "depth"
    value = client.post(
        "/api/models", json={"name": "m", "preset": "mlp_demo", "overrides": {"hidden": "lots"}}
    )
    assert assert_error(value, 422, "invalid_override", "hidden", "lots")["detail"]["key"] == (
        "hidden"
    )
    both = client.post("/api/models", json={"name": "m", "preset": "mlp_demo", "graph": {}})
    assert_error(both, 422, "invalid_request", "exactly one")
    extra = client.post("/api/models", json={"name": "m", "preset": "mlp_demo", "colour": 1})
    assert_error(extra, 422, "invalid_request", "colour")
    assert count(client) == before


def test_bad_graphs_name_the_field_op_or_line(client: TestClient) -> None:
    before = count(client)
    document = graph_to_json(build_model("mlp_demo"))
    no_ops = {k: v for k, v in document.items() if k != "ops"}
    missing = client.post("/api/models", json={"name": "g", "graph": no_ops})
    assert assert_error(missing, 422, "invalid_graph", "'ops'")["detail"] == {"field": "ops"}
    broken = json.loads(json.dumps(document))
    broken["ops"][0]["kind"] = "frobnicate"
    bad_op = client.post("/api/models", json={"name": "g", "graph": broken})
    assert assert_error(bad_op, 422, "invalid_graph", "'y'", "frobnicate")["detail"]["op"] == "y"
    text = json.dumps(document, indent=1).replace('"ops"', '"ops" :: ')
    syntax = client.post(
        "/api/models/upload?name=g", content=text, headers={"Content-Type": "application/json"}
    )
    line = text[: text.index("::")].count("\n") + 1
    assert assert_error(syntax, 422, "invalid_graph", f"line {line}")["detail"]["line"] == line
    wrong_type = client.post(
        "/api/models/upload?name=g", content=b"x", headers={"Content-Type": "text/csv"}
    )
    assert_error(wrong_type, 415, "unsupported_media_type", "text/csv")
    assert count(client) == before


def test_graph_over_the_op_limit_is_413(client: TestClient) -> None:
    app: Any = client.app
    app.state.settings = dataclasses.replace(app.state.settings, max_graph_ops=40)
    preset = client.post(
        "/api/models", json={"name": "big", "preset": "llama3-8b", "overrides": SMALL}
    )
    assert assert_error(preset, 413, "graph_too_large", "45", "40")["detail"] == {
        "ops": 45,
        "limit": 40,
    }
    deep = client.post(
        "/api/models",
        json={"name": "big", "preset": "llama3-8b", "overrides": {**SMALL, "layers": 10**6}},
    )
    assert assert_error(deep, 413, "graph_too_large", "40")["detail"]["ops"] > 10**7
    document = graph_to_json(build_model("llama3-8b", SMALL))
    body = client.post("/api/models", json={"name": "big", "graph": document})
    assert_error(body, 413, "graph_too_large", "45 ops", "40")
    upload = client.post("/api/models/upload?name=big", content=json.dumps(document))
    assert_error(upload, 413, "graph_too_large", "45 ops")
    assert count(client) == 0


def test_duplicate_name_is_a_conflict(client: TestClient, other_client: TestClient) -> None:
    create_small(client, "dup")
    again = client.post("/api/models", json={"name": "dup", "preset": "mlp_demo"})
    assert_error(again, 409, "conflict", "'dup'")
    assert count(client) == 1
    assert other_client.post("/api/models", json={"name": "dup", "preset": "mlp_demo"}).is_success


def test_another_teams_model_is_not_found(client: TestClient, other_client: TestClient) -> None:
    model_id = create_small(client)["id"]
    for path in ("", "/graph", "/tree"):
        assert_error(other_client.get(f"/api/models/{model_id}{path}"), 404, "not_found")
    assert_error(other_client.delete(f"/api/models/{model_id}"), 404, "not_found", str(model_id))
    assert other_client.get("/api/models").json() == []
    assert client.get(f"/api/models/{model_id}").status_code == 200


def test_delete_is_refused_while_a_plan_uses_the_model(client: TestClient) -> None:
    model_id = create_small(client)["id"]
    app: Any = client.app
    with app.state.sessions() as session:
        team_id = session.scalar(select(Model.team_id).where(Model.id == model_id))
        strategy = Strategy(team_id=team_id, name="s", mesh="dp=2")
        job = Job(team_id=team_id, kind="plan")
        session.add_all([strategy, job])
        session.flush()
        plan = Plan(team_id=team_id, model_id=model_id, strategy_id=strategy.id, job_id=job.id)
        session.add(plan)
        session.commit()
        plan_id = plan.id
    refused = client.delete(f"/api/models/{model_id}")
    assert assert_error(refused, 409, "conflict", "'tiny'", "plan")["detail"]["plans"] == 1
    with app.state.sessions() as session:
        session.delete(session.get(Plan, plan_id))
        session.commit()
    assert client.delete(f"/api/models/{model_id}").status_code == 204
    assert_error(client.get(f"/api/models/{model_id}"), 404, "not_found")
    assert count(client) == 0
