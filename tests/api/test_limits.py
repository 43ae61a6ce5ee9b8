"""Request size limit: 413 `request_too_large` for declared and streamed bodies, nothing stored."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, MutableMapping
from dataclasses import replace
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from backend.app import create_app
from backend.auth import create_token, ensure_team
from backend.db import transaction
from backend.limits import BodyLimitMiddleware
from backend.orm import ApiToken
from backend.settings import Settings

LIMIT = 1000


@pytest.fixture
def small_app(settings: Settings) -> Iterator[FastAPI]:
    application = create_app(replace(settings, max_request_bytes=LIMIT))
    yield application
    application.state.engine.dispose()


@pytest.fixture
def small_client(small_app: FastAPI) -> Iterator[TestClient]:
    with transaction(small_app.state.sessions) as session:
        secret = create_token(session, ensure_team(session, "alpha").id, "test")
    with TestClient(small_app) as c:
        c.headers["Authorization"] = f"Bearer {secret}"
        yield c


def _token_count(app: FastAPI) -> int:
    with app.state.sessions() as session:
        return int(session.scalar(select(func.count()).select_from(ApiToken)) or 0)


def _check_413(body: dict[str, Any]) -> None:
    assert set(body) == {"code", "message", "detail"}
    assert body["code"] == "request_too_large"
    assert str(LIMIT) in body["message"]
    assert body["detail"]["limit_bytes"] == LIMIT


def test_declared_oversized_body_is_413_and_nothing_is_stored(
    small_client: TestClient, small_app: FastAPI
) -> None:
    before = _token_count(small_app)
    response = small_client.post("/api/tokens", json={"name": "x" * 2 * LIMIT})
    assert response.status_code == 413
    _check_413(response.json())
    assert str(len(response.request.content)) in response.json()["message"]
    assert _token_count(small_app) == before


def test_streamed_oversized_body_is_413_and_nothing_is_stored(
    small_client: TestClient, small_app: FastAPI
) -> None:
    before = _token_count(small_app)

    def chunks() -> Iterator[bytes]:  # no Content-Length: sent chunked
        yield b'{"name": "'
        for _ in range(10):
            yield b"y" * 200
        yield b'"}'

    response = small_client.post(
        "/api/tokens", content=chunks(), headers={"content-type": "application/json"}
    )
    assert response.status_code == 413
    _check_413(response.json())
    assert response.json()["detail"]["declared"] is False
    assert _token_count(small_app) == before


def test_bodies_within_the_limit_pass(small_client: TestClient) -> None:
    assert small_client.post("/api/tokens", json={"name": "ok"}).status_code == 201


def test_default_limit_comes_from_settings(app: FastAPI, settings: Settings) -> None:
    limits = [m for m in app.user_middleware if getattr(m, "cls", None) is BodyLimitMiddleware]
    assert len(limits) == 1 and limits[0].kwargs["max_bytes"] == settings.max_request_bytes


def test_middleware_alone_with_a_lying_content_length() -> None:
    """A body longer than its declared length is cut off as it streams."""
    seen: list[bytes] = []

    async def echo(scope: Any, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            seen.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    middleware = BodyLimitMiddleware(echo, max_bytes=10)
    incoming = [
        {"type": "http.request", "body": b"12345", "more_body": True},
        {"type": "http.request", "body": b"678901", "more_body": False},
    ]
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return incoming.pop(0)

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "headers": [(b"content-length", b"5")]}
    asyncio.run(middleware(scope, receive, send))
    assert sent[0]["status"] == 413
    assert b"request_too_large" in sent[1]["body"]
    assert seen == [b"12345"]
