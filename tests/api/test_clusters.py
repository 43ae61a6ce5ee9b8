"""Clusters API: presets and team clusters, engine validation, resolve_cluster, isolation."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from backend.errors import ApiError
from backend.orm import Team
from backend.routers.clusters import resolve_cluster
from shardlab.cost.clusters import load_cluster, preset_names
from tests.api.conftest import assert_error

SPEC = load_cluster("h100-sxm-1x8").to_json() | {"nodes": 2, "devices_per_node": 4}


def user_clusters(client: TestClient) -> list[dict[str, Any]]:
    """The team's own clusters as listed."""
    return [c for c in client.get("/api/clusters").json() if c["source"] == "user"]


def create(client: TestClient, name: str = "lab") -> dict[str, Any]:
    """Create a team cluster from SPEC; the 201 body."""
    response = client.post("/api/clusters", json={"name": name, "spec": SPEC})
    assert response.status_code == 201, response.text
    result: dict[str, Any] = response.json()
    return result


def test_presets_are_listed_with_headline_figures(client: TestClient) -> None:
    listed = client.get("/api/clusters").json()
    assert [c["name"] for c in listed] == preset_names()
    h100 = next(c for c in listed if c["name"] == "h100-sxm-8x8")
    assert h100 == {
        "name": "h100-sxm-8x8", "source": "preset", "description": h100["description"],
        "devices": 64, "nodes": 8, "devices_per_node": 8, "peak_flops_bf16": 989e12,
        "hbm_bytes": 80e9, "intra_node_bandwidth": 360e9, "inter_node_bandwidth": 40e9,
    }  # fmt: skip
    detail = client.get("/api/clusters/h100-sxm-2x4").json()
    assert detail["devices"] == 8 and detail["spec"] == load_cluster("h100-sxm-2x4").to_json()


def test_team_cluster_round_trip_and_delete(client: TestClient) -> None:
    made = create(client)
    assert (made["source"], made["devices"], made["peak_flops_bf16"]) == ("user", 8, 989e12)
    assert made["spec"] == {**SPEC, "name": "lab"}
    assert client.get("/api/clusters/lab").json() == made
    assert [c["name"] for c in user_clusters(client)] == ["lab"]
    assert client.delete("/api/clusters/lab").status_code == 204
    assert_error(client.get("/api/clusters/lab"), 404, "not_found", "'lab'")
    assert user_clusters(client) == []


def test_invalid_specs_name_the_field_and_write_nothing(client: TestClient) -> None:
    missing = {k: v for k, v in SPEC.items() if k != "hbm_bytes"}
    body = assert_error(
        client.post("/api/clusters", json={"name": "x", "spec": missing}),
        422, "invalid_cluster", "'hbm_bytes'",
    )  # fmt: skip
    assert body["detail"]["field"] == "hbm_bytes"
    bad_link = copy.deepcopy(SPEC)
    bad_link["inter_node"]["bandwidth"] = -1
    assert_error(
        client.post("/api/clusters", json={"name": "x", "spec": bad_link}),
        422, "invalid_cluster", "inter_node.bandwidth",
    )  # fmt: skip
    unknown = SPEC | {"peak_flops": {"int4": 1e15}}
    assert_error(
        client.post("/api/clusters", json={"name": "x", "spec": unknown}),
        422, "invalid_cluster", "'int4'",
    )  # fmt: skip
    path_name = client.post("/api/clusters", json={"name": "../etc/x.json", "spec": SPEC})
    assert_error(path_name, 422, "invalid_cluster", "../etc/x.json")
    no_spec = client.post("/api/clusters", json={"name": "x"})
    assert_error(no_spec, 422, "invalid_request", "spec")
    assert user_clusters(client) == []


def test_name_clashes_and_preset_deletion_are_conflicts(client: TestClient) -> None:
    create(client)
    for name in ("lab", "cpu-local", "h100-sxm-8x8", "a100-80g-3x2"):
        clash = client.post("/api/clusters", json={"name": name, "spec": SPEC})
        assert_error(clash, 409, "conflict", repr(name))
    refused = client.delete("/api/clusters/h100-sxm-8x8")
    assert_error(refused, 409, "conflict", "'h100-sxm-8x8'", "preset")
    assert_error(client.delete("/api/clusters/nope"), 404, "not_found", "'nope'")
    assert len(user_clusters(client)) == 1


def test_another_teams_cluster_is_not_found(client: TestClient, other_client: TestClient) -> None:
    create(client)
    assert_error(other_client.get("/api/clusters/lab"), 404, "not_found", "'lab'")
    assert_error(other_client.delete("/api/clusters/lab"), 404, "not_found", "'lab'")
    assert user_clusters(other_client) == []
    assert other_client.post("/api/clusters", json={"name": "lab", "spec": SPEC}).is_success
    assert client.get("/api/clusters/lab").status_code == 200


def test_resolve_cluster_for_the_plan_router(client: TestClient) -> None:
    create(client)
    app: Any = client.app
    with app.state.sessions() as session:
        alpha = session.scalar(select(Team.id).where(Team.name == "alpha"))
        assert resolve_cluster(session, alpha, "lab") == {**SPEC, "name": "lab"}
        assert resolve_cluster(session, alpha, "h200-1x8") == load_cluster("h200-1x8").to_json()
        with pytest.raises(ApiError) as caught:
            resolve_cluster(session, alpha + 1000, "lab")
        assert caught.value.status == 404 and "'lab'" in caught.value.message
