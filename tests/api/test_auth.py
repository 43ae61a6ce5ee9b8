"""Login links, browser sessions, /api/me, API tokens and the admin endpoint."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import select, update

from backend.auth import SESSION_COOKIE, digest
from backend.bootstrap import first_admin_link
from backend.orm import ApiToken, BrowserSession, LoginLink
from backend.settings import Settings


def _is_error(body: dict[str, object], code: str) -> None:
    assert set(body) == {"code", "message", "detail"}, body
    assert body["code"] == code and body["message"], body


@pytest.fixture
def anon(app: FastAPI) -> Iterator[TestClient]:
    """A client without credentials (it keeps cookies it is given)."""
    with TestClient(app, follow_redirects=False) as c:
        yield c


@pytest.fixture
def admin_link(app: FastAPI, settings: Settings) -> str:
    link = first_admin_link(app.state.sessions, settings)
    assert link is not None and link.startswith("/api/auth/login?link=")
    return link


def test_first_admin_link_only_on_an_empty_database(
    app: FastAPI, settings: Settings, admin_link: str
) -> None:
    assert first_admin_link(app.state.sessions, settings) is None


def test_login_link_gives_a_cookie_session(anon: TestClient, admin_link: str) -> None:
    response = anon.get(admin_link)
    assert response.status_code == 303 and response.headers["location"] == "/"
    cookie = response.headers["set-cookie"]
    assert cookie.startswith(f"{SESSION_COOKIE}=")
    assert "HttpOnly" in cookie and "samesite=lax" in cookie.lower()
    me = anon.get("/api/me")
    assert me.status_code == 200
    assert me.json() == {"user": "admin", "team": "default", "is_admin": True,
                         "is_service_admin": True, "via": "session"}  # fmt: skip


def test_session_secret_is_stored_hashed(anon: TestClient, admin_link: str, app: FastAPI) -> None:
    anon.get(admin_link)
    secret = anon.cookies[SESSION_COOKIE]
    with app.state.sessions() as session:
        hashes = list(session.scalars(select(BrowserSession.session_hash)))
    assert hashes == [digest(secret)]


def test_login_link_reuse_is_401(anon: TestClient, app: FastAPI, admin_link: str) -> None:
    assert anon.get(admin_link).status_code == 303
    with TestClient(app, follow_redirects=False) as other:
        again = other.get(admin_link)
        assert again.status_code == 401
        _is_error(again.json(), "invalid_login_link")
        assert "already used" in again.json()["message"]
        assert again.json()["detail"] == {"reason": "used"}
        assert SESSION_COOKIE not in other.cookies


def test_unknown_and_expired_links_are_401(anon: TestClient, app: FastAPI, admin_link: str) -> None:
    unknown = anon.get("/api/auth/login", params={"link": "nope"})
    assert unknown.status_code == 401 and unknown.json()["detail"] == {"reason": "unknown"}
    with app.state.sessions() as session:
        session.execute(
            update(LoginLink).values(expires_at=datetime.now(UTC) - timedelta(seconds=1))
        )
        session.commit()
    expired = anon.get(admin_link)
    assert expired.status_code == 401 and "expired" in expired.json()["message"]


def test_logout_ends_the_session(anon: TestClient, admin_link: str) -> None:
    anon.get(admin_link)
    secret = anon.cookies[SESSION_COOKIE]
    assert anon.post("/api/auth/logout").status_code == 204
    anon.cookies.set(SESSION_COOKIE, secret)  # a stolen copy of the cookie no longer works
    assert anon.get("/api/me").status_code == 401


@pytest.mark.parametrize("path", ["/api/me", "/api/tokens"])
def test_unauthenticated_requests_are_401_with_a_body(anon: TestClient, path: str) -> None:
    response = anon.get(path)
    assert response.status_code == 401
    _is_error(response.json(), "unauthorized")
    bad = anon.get(path, headers={"Authorization": "Bearer shl_not-a-token"})
    assert bad.status_code == 401
    _is_error(bad.json(), "unauthorized")


def test_me_with_a_team_token(client: TestClient) -> None:
    assert client.get("/api/me").json() == {
        "user": None,
        "team": "alpha",
        "is_admin": False,
        "is_service_admin": False,
        "via": "token",
    }


def test_tokens_create_list_revoke(client: TestClient, app: FastAPI) -> None:
    created = client.post("/api/tokens", json={"name": "ci"})
    assert created.status_code == 201
    body = created.json()
    assert set(body) == {"id", "name", "prefix", "token", "created_at", "expires_at"}
    # a token made through the API expires: by default at the cap (its parent never does)
    cap = datetime.now(UTC) + timedelta(days=3650)
    assert abs(datetime.fromisoformat(body["expires_at"]) - cap) < timedelta(minutes=1)
    assert body["token"].startswith(body["prefix"]) and body["name"] == "ci"
    with TestClient(app) as ci:
        ci.headers["Authorization"] = f"Bearer {body['token']}"
        assert ci.get("/api/me").json()["team"] == "alpha"
        listed = client.get("/api/tokens").json()
        assert [t["name"] for t in listed] == ["test", "ci"]
        for token in listed:
            assert set(token) == {"id", "name", "prefix", "created_at", "revoked_at", "expires_at"}
            assert token["revoked_at"] is None
        assert [t["expires_at"] is None for t in listed] == [True, False]
        assert body["token"] not in client.get("/api/tokens").text
        assert client.delete(f"/api/tokens/{body['id']}").status_code == 204
        revoked = ci.get("/api/me")
        assert revoked.status_code == 401
        _is_error(revoked.json(), "unauthorized")
        after = {t["id"]: t for t in client.get("/api/tokens").json()}
        assert after[body["id"]]["revoked_at"] is not None
    with app.state.sessions() as session:
        stored = session.scalar(select(ApiToken).where(ApiToken.id == body["id"]))
        assert stored is not None and stored.token_hash == digest(body["token"])


def test_another_team_cannot_see_or_revoke_a_token(
    client: TestClient, other_client: TestClient
) -> None:
    token_id = client.post("/api/tokens", json={"name": "mine"}).json()["id"]
    assert "mine" not in [t["name"] for t in other_client.get("/api/tokens").json()]
    response = other_client.delete(f"/api/tokens/{token_id}")
    assert response.status_code == 404
    _is_error(response.json(), "not_found")
    assert client.delete("/api/tokens/999999").status_code == 404
    assert all(t["revoked_at"] is None for t in client.get("/api/tokens").json())


def test_token_with_an_expiry_works_until_it_expires(client: TestClient, app: FastAPI) -> None:
    created = client.post("/api/tokens", json={"name": "ci", "expires_in_days": 30})
    assert created.status_code == 201, created.text
    body = created.json()
    expires = datetime.fromisoformat(body["expires_at"])
    assert abs(expires - (datetime.now(UTC) + timedelta(days=30))) < timedelta(minutes=1)
    listed = {t["id"]: t for t in client.get("/api/tokens").json()}
    assert datetime.fromisoformat(listed[body["id"]]["expires_at"]) == expires
    with TestClient(app) as ci:
        ci.headers["Authorization"] = f"Bearer {body['token']}"
        assert ci.get("/api/me").status_code == 200
        with app.state.sessions() as session, session.begin():
            session.execute(
                update(ApiToken)
                .where(ApiToken.id == body["id"])
                .values(expires_at=datetime.now(UTC) - timedelta(seconds=1))
            )
        expired = ci.get("/api/me")
        assert expired.status_code == 401
        _is_error(expired.json(), "token_expired")
        assert "token expired" in expired.json()["message"]
        assert ci.post("/api/strategies", json={"name": "s", "mesh": "dp=2"}).status_code == 401
    # a revoked token stays "unknown or revoked", expired or not
    assert client.delete(f"/api/tokens/{body['id']}").status_code == 204
    with TestClient(app) as ci:
        ci.headers["Authorization"] = f"Bearer {body['token']}"
        _is_error(ci.get("/api/me").json(), "unauthorized")


def test_token_expiry_at_a_moment(client: TestClient) -> None:
    moment = (datetime.now(UTC) + timedelta(hours=2)).replace(microsecond=0)
    created = client.post("/api/tokens", json={"name": "ci", "expires_at": moment.isoformat()})
    assert created.status_code == 201, created.text
    assert datetime.fromisoformat(created.json()["expires_at"]) == moment


@pytest.mark.parametrize(
    "body",
    [
        {"expires_in_days": 0},
        {"expires_in_days": 3651},
        {"expires_in_days": 1, "expires_at": "2999-01-01T00:00:00Z"},
        {"expires_at": "2000-01-01T00:00:00Z"},
    ],
)
def test_token_expiry_is_validated(client: TestClient, body: dict[str, object]) -> None:
    response = client.post("/api/tokens", json={"name": "ci", **body})
    assert response.status_code == 422, response.text
    _is_error(response.json(), "invalid_request")


def test_token_name_is_validated(client: TestClient) -> None:
    response = client.post("/api/tokens", json={"name": ""})
    assert response.status_code == 422
    _is_error(response.json(), "invalid_request")


def test_admin_endpoint_is_403_for_non_admins(client: TestClient) -> None:
    response = client.post("/api/admin/users", json={"name": "eve", "team": "alpha"})
    assert response.status_code == 403
    _is_error(response.json(), "forbidden")


def test_admin_creates_a_user_who_logs_in(anon: TestClient, app: FastAPI, admin_link: str) -> None:
    anon.get(admin_link)
    created = anon.post("/api/admin/users", json={"name": "bob", "team": "gamma"})
    assert created.status_code == 201
    body = created.json()
    assert body["team"] == "gamma" and body["is_admin"] is False
    assert body["login_link"].startswith("/api/auth/login?link=")
    duplicate = anon.post("/api/admin/users", json={"name": "bob", "team": "gamma"})
    assert duplicate.status_code == 409
    _is_error(duplicate.json(), "conflict")
    with TestClient(app, follow_redirects=False) as bob:
        assert bob.get(body["login_link"]).status_code == 303
        assert bob.get("/api/me").json() == {
            "user": "bob",
            "team": "gamma",
            "is_admin": False,
            "is_service_admin": False,
            "via": "session",
        }
        forbidden = bob.post("/api/admin/users", json={"name": "x", "team": "gamma"})
        assert forbidden.status_code == 403
