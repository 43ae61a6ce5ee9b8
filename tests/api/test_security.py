"""Security headers on every answer, and the Origin check on cookie-authenticated writes."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from backend.bootstrap import first_admin_link
from backend.security import CSP, DOCS_CSP
from backend.settings import Settings
from tests.api.conftest import assert_error

HEADERS = {
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
}
SITE = "http://testserver"  # the TestClient's own origin
STRATEGY = {"name": "s", "mesh": "dp=2", "templates": ["dp"]}


@pytest.fixture
def browser(app: FastAPI, settings: Settings) -> Iterator[TestClient]:
    """A client logged in through the first admin's login link (session cookie only)."""
    link = first_admin_link(app.state.sessions, settings)
    assert link is not None
    with TestClient(app, follow_redirects=False) as c:
        assert c.get(link).status_code == 303
        yield c


def _secured(response: object, csp: str = CSP) -> None:
    headers = response.headers  # type: ignore[attr-defined]
    assert headers["content-security-policy"] == csp
    for name, value in HEADERS.items():
        assert headers[name] == value, name


def test_csp_allows_only_the_service_s_own_scripts() -> None:
    directives = dict(d.split(" ", 1) for d in CSP.split("; "))
    assert directives["script-src"] == "'self'"
    assert directives["worker-src"] == "'self'"
    assert directives["frame-ancestors"] == "'none'"
    assert "unsafe-inline" not in directives["script-src"]
    assert "unsafe-eval" not in CSP


@pytest.mark.parametrize(
    "path", ["/", "/index.html", "/app.js", "/vendor/plotly.min.js", "/healthz", "/api/presets"]
)
def test_every_answer_has_the_security_headers(client: TestClient, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 200
    _secured(response)


def test_errors_have_the_security_headers(client: TestClient) -> None:
    _secured(client.get("/api/plans/999999"))  # 404
    _secured(client.get("/nope.js"))  # static 404
    _secured(client.post("/api/strategies", json={}))  # 422
    anon = TestClient(client.app)
    _secured(anon.get("/api/me"))  # 401


def test_docs_page_gets_its_own_policy(client: TestClient) -> None:
    response = client.get("/api/docs")
    assert response.status_code == 200
    _secured(response, DOCS_CSP)


def test_cookie_write_from_another_origin_is_refused(browser: TestClient) -> None:
    response = browser.post(
        "/api/strategies", json=STRATEGY, headers={"Origin": "https://evil.example"}
    )
    body = assert_error(response, 403, "forbidden_origin", "evil.example")
    assert body["detail"]["origin"] == "https://evil.example"
    _secured(response)
    assert browser.get("/api/strategies").json() == []  # nothing created
    for method in ("put", "patch", "delete"):
        response = browser.request(method, "/api/strategies/1", headers={"Origin": "null"})
        assert_error(response, 403, "forbidden_origin")


def test_cookie_write_from_the_site_itself_or_without_origin_is_allowed(
    browser: TestClient,
) -> None:
    same = browser.post("/api/strategies", json=STRATEGY, headers={"Origin": SITE})
    assert same.status_code == 201, same.text
    bare = browser.post("/api/strategies", json={**STRATEGY, "name": "t"})
    assert bare.status_code == 201, bare.text
    assert browser.get("/api/me", headers={"Origin": "https://evil.example"}).status_code == 200


def test_bearer_writes_are_not_checked(client: TestClient) -> None:
    response = client.post(
        "/api/strategies", json=STRATEGY, headers={"Origin": "https://evil.example"}
    )
    assert response.status_code == 201, response.text


def test_logout_from_another_origin_is_refused(browser: TestClient) -> None:
    response = browser.post("/api/auth/logout", headers={"Origin": "https://evil.example"})
    assert_error(response, 403, "forbidden_origin")
    assert browser.get("/api/me").status_code == 200  # still logged in


def test_an_unexpected_error_is_a_json_500_with_the_headers(
    app: FastAPI, client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    def boom() -> None:
        raise RuntimeError("a bug")

    app.router.routes.insert(0, APIRoute("/api/boom", boom))  # before the UI's mount at /
    with TestClient(app, raise_server_exceptions=False) as anon, caplog.at_level(logging.ERROR):
        response = anon.get("/api/boom")
    body = assert_error(response, 500, "internal_error", "report reference")
    assert response.headers["content-type"] == "application/json"
    _secured(response)
    reference = body["detail"]["reference"]
    assert any(reference in r.getMessage() and r.exc_info for r in caplog.records)


def test_an_empty_authorization_header_does_not_skip_the_origin_check(
    browser: TestClient,
) -> None:
    for header in ("", " ", "Bearer", "Bearer  "):
        response = browser.post("/api/strategies", json=STRATEGY,
                                headers={"Origin": "https://evil.example",
                                         "Authorization": header})  # fmt: skip
        assert_error(response, 403, "forbidden_origin")
    assert browser.get("/api/strategies").json() == []  # nothing created
    # nor does it fall back to the cookie where no Origin is sent: it is a bad header
    response = browser.post("/api/strategies", json=STRATEGY, headers={"Authorization": ""})
    assert_error(response, 401, "unauthorized", "Bearer")
    assert browser.get("/api/strategies").json() == []
