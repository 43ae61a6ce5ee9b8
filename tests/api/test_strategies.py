"""Strategies API: engine validation, versions on edit, listing, isolation."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from backend.db import make_engine, session_factory, transaction
from backend.orm import Strategy as StrategyRow
from backend.settings import Settings
from tests.api.conftest import assert_error

DP_TP = {
    "name": "dp-tp",
    "mesh": "dp=2,tp=2",
    "templates": ["dp", "megatron_tp:tp"],
    "annotations": ["tokens=dp:S(0)"],
    "options": {"passes": {"dp_overlap": False}},
}


def create(client: TestClient, **changes: Any) -> dict[str, Any]:
    """Create DP_TP with `changes`; the 201 body."""
    response = client.post("/api/strategies", json={**DP_TP, **changes})
    assert response.status_code == 201, response.text
    result: dict[str, Any] = response.json()
    return result


def count(client: TestClient) -> int:
    """How many strategy versions the client's team has."""
    return len(client.get("/api/strategies", params={"all_versions": True}).json())


def test_create_returns_version_one_with_the_engine_description(client: TestClient) -> None:
    made = create(client)
    assert made["version"] == 1 and made["name"] == "dp-tp"
    assert made["describe"] == (
        "mesh dp=2,tp=2; template dp:dp; template megatron_tp:tp; annotate tokens=dp:S(0)"
    )
    assert {k: made[k] for k in DP_TP} == DP_TP
    assert client.get(f"/api/strategies/{made['id']}").json() == made
    assert client.get("/api/strategies").json() == [made]


def test_edit_adds_a_version_and_keeps_the_old_one(client: TestClient) -> None:
    first = create(client)
    create(client, name="other", mesh="dp=4", templates=["dp"], annotations=[], options={})
    edit = {"mesh": "dp=4", "templates": ["dp", "zero1"], "annotations": [], "options": {}}
    second = client.put(f"/api/strategies/{first['id']}", json=edit).json()
    assert (second["name"], second["version"], second["mesh"]) == ("dp-tp", 2, "dp=4")
    assert second["describe"] == "mesh dp=4; template dp:dp; template zero1:dp"
    third = client.put(f"/api/strategies/{first['id']}", json=edit).json()
    assert third["version"] == 3  # editing an old version still appends after the latest
    assert client.get(f"/api/strategies/{first['id']}").json() == first
    latest = client.get("/api/strategies").json()
    assert [(s["name"], s["version"]) for s in latest] == [("dp-tp", 3), ("other", 1)]
    versions = client.get(f"/api/strategies/{second['id']}/versions").json()
    assert [v["version"] for v in versions] == [1, 2, 3] and versions[0] == first
    assert count(client) == 4


def test_invalid_strategies_name_the_culprit_and_write_nothing(client: TestClient) -> None:
    made = create(client)
    cases: list[tuple[dict[str, Any], str, list[str]]] = [
        ({"mesh": "dp=two"}, "invalid_mesh", ["'two'"]),
        ({"templates": ["megatron_tp:zz"]}, "invalid_strategy", ["'zz'", "megatron_tp"]),
        ({"templates": ["pipeline_magic"]}, "invalid_strategy", ["'pipeline_magic'"]),
        ({"annotations": ["w=sp:S(0)"]}, "invalid_mesh", ["'sp'", "w=sp:S(0)"]),
        ({"annotations": ["no equals"]}, "invalid_strategy", ["'no equals'"]),
        ({"options": {"passes": {"dp_turbo": True}}}, "invalid_pass", ["'dp_turbo'"]),
        ({"options": {"passes": {"dp_overlap": {"speed": 2}}}}, "invalid_pass", ["'speed'"]),
        ({"options": {"passes": 3}}, "invalid_pass", ["passes"]),
        ({"mesh": "dp=100000,tp=100000", "templates": []}, "invalid_mesh", ["more than"]),
    ]
    for changes, code, named in cases:
        bad = client.post("/api/strategies", json={**DP_TP, "name": "bad", **changes})
        assert_error(bad, 422, code, *named)
        edit = {k: v for k, v in {**DP_TP, **changes}.items() if k != "name"}
        assert_error(client.put(f"/api/strategies/{made['id']}", json=edit), 422, code, *named)
    extra = client.post("/api/strategies", json={**DP_TP, "name": "bad", "mesh_shape": [2]})
    assert_error(extra, 422, "invalid_request", "mesh_shape")
    assert count(client) == 1


def test_duplicate_name_is_a_conflict(client: TestClient) -> None:
    create(client)
    assert_error(client.post("/api/strategies", json=DP_TP), 409, "conflict", "'dp-tp'")
    assert count(client) == 1


def test_another_teams_strategy_is_not_found(client: TestClient, other_client: TestClient) -> None:
    made = create(client)
    sid = made["id"]
    for path in (f"/api/strategies/{sid}", f"/api/strategies/{sid}/versions"):
        assert_error(other_client.get(path), 404, "not_found", str(sid))
    edit = {"mesh": "dp=2"}
    assert_error(other_client.put(f"/api/strategies/{sid}", json=edit), 404, "not_found")
    assert other_client.get("/api/strategies?all_versions=true").json() == []
    assert other_client.post("/api/strategies", json=DP_TP).status_code == 201
    assert client.get("/api/strategies").json() == [made]


def test_a_version_stored_before_a_stricter_check_still_reads(
    client: TestClient, settings: Settings
) -> None:
    """An option that was accepted once (an unknown key) is refused now: the version still
    lists, saying why, and planning with it is a 422 naming the option."""
    made = create(client, name="old")
    engine = make_engine(settings.database_url)
    try:
        with transaction(session_factory(engine)) as session:
            row = session.get(StrategyRow, made["id"])
            assert row is not None
            row.options = {"optimiser": "sgd"}
    finally:
        engine.dispose()
    listed = {s["name"]: s for s in client.get("/api/strategies").json()}
    assert listed["old"]["describe"].startswith("no longer valid: unknown strategy option")
    model = client.post("/api/models", json={"name": "m", "preset": "mlp_demo"}).json()
    plan = client.post("/api/plans", json={"model_id": model["id"], "strategy_id": made["id"]})
    assert_error(plan, 422, "invalid_strategy", "'optimiser'")
