"""The strategy catalog: templates and passes as the engine registers them."""

from __future__ import annotations

from fastapi.testclient import TestClient

from shardlab.passes.manager import PASSES
from shardlab.templates import TEMPLATES


def test_templates_list_the_engines_registry(client: TestClient) -> None:
    answer = client.get("/api/templates")
    assert answer.status_code == 200
    listed = answer.json()
    assert [t["name"] for t in listed] == list(TEMPLATES)
    tp = next(t for t in listed if t["name"] == "megatron_tp")
    assert tp["default_axis"] == "tp" and tp["description"]


def test_passes_list_the_engines_registry_in_run_order(client: TestClient) -> None:
    listed = client.get("/api/passes").json()
    assert [p["name"] for p in listed] == list(PASSES)
    fuse = next(p for p in listed if p["name"] == "dp_fuse_allreduce")
    assert fuse["default_on"] is True and "bucket_mb" in fuse["options"]


def test_the_catalog_needs_a_login(client: TestClient) -> None:
    del client.headers["Authorization"]
    for path in ("/api/templates", "/api/passes"):
        answer = client.get(path)
        assert answer.status_code == 401 and answer.json()["code"] == "unauthorized"
