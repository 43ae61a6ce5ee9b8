"""The service skeleton: health, presets, error bodies, the UI (on a migrated database).

The real `shardlab serve` process is tested in test_cli_service.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient


@pytest.fixture
def anon(app: FastAPI) -> Iterator[TestClient]:
    """A client without credentials: these endpoints are public."""
    with TestClient(app) as c:
        yield c


def test_healthz(anon: TestClient) -> None:
    assert anon.get("/healthz").json() == {"status": "ok"}


def test_presets_listing_and_detail(anon: TestClient) -> None:
    names = [p["name"] for p in anon.get("/api/presets").json()]
    assert "llama3-8b" in names and "mlp_demo" in names
    detail = anon.get("/api/presets/gpt2").json()
    assert detail["params"] == 124_439_808 and detail["layers"] == 12


def test_unknown_preset_is_a_404_with_code_message_detail(anon: TestClient) -> None:
    response = anon.get("/api/presets/llama9")
    assert response.status_code == 404
    assert response.json() == {
        "code": "invalid_preset",
        "message": response.json()["message"],
        "detail": {"preset": "llama9"},
    }
    assert "unknown model preset 'llama9'" in response.json()["message"]


def test_ui_page_and_openapi(anon: TestClient) -> None:
    page = anon.get("/")
    assert page.status_code == 200 and '<script type="module" src="/app.js">' in page.text
    plotly = anon.get("/vendor/plotly.min.js")
    assert plotly.status_code == 200 and "javascript" in plotly.headers["content-type"]
    paths = anon.get("/api/openapi.json").json()["paths"]
    assert "/api/presets" in paths and "/api/me" in paths and "/api/tokens" in paths


def test_authenticated_client_reaches_its_team(client: TestClient) -> None:
    assert client.get("/api/me").json()["team"] == "alpha"
