"""`Idempotency-Key` on create POSTs: a retry replays the first answer and creates nothing; a
reused key with another body or route is a 409; concurrent first uses create once."""

from __future__ import annotations

import threading
from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from backend.idempotency import MAX_KEY_LENGTH
from backend.orm import IdempotencyKey, Job, Plan, Strategy
from tests.api.conftest import assert_error

TINY = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 256}
STRATEGY = {"name": "s", "mesh": "dp=2,tp=2", "templates": ["dp", "megatron_tp"]}


def _count(app: FastAPI, table: Any) -> int:
    with app.state.sessions() as session:
        return int(session.scalar(select(func.count()).select_from(table)) or 0)


def _key(value: str) -> dict[str, str]:
    return {"Idempotency-Key": value}


def test_retry_replays_the_answer_and_creates_nothing(client: TestClient, app: FastAPI) -> None:
    first = client.post("/api/strategies", json=STRATEGY, headers=_key("k-1"))
    assert first.status_code == 201, first.text
    assert "idempotent-replayed" not in first.headers
    again = client.post("/api/strategies", json=STRATEGY, headers=_key("k-1"))
    assert again.status_code == 201 and again.json() == first.json()
    assert again.headers["idempotent-replayed"] == "true"
    assert _count(app, Strategy) == 1
    # without the key, the same body is a new request (here: a name conflict)
    assert client.post("/api/strategies", json=STRATEGY).status_code == 409


def test_a_queued_plan_is_not_queued_twice(client: TestClient, app: FastAPI) -> None:
    model = client.post("/api/models", json={"name": "tiny", "preset": "llama3-8b",
                                             "overrides": TINY}, headers=_key("m"))  # fmt: skip
    assert model.status_code == 201, model.text
    strategy = client.post("/api/strategies", json=STRATEGY, headers=_key("s")).json()
    body = {"model_id": model.json()["id"], "strategy_id": strategy["id"], "cluster": None}
    first = client.post("/api/plans", json=body, headers=_key("p"))
    assert first.status_code == 202, first.text
    again = client.post("/api/plans", json=body, headers=_key("p"))
    assert again.status_code == 202 and again.json() == first.json()
    assert again.headers["idempotent-replayed"] == "true"
    assert _count(app, Plan) == 1 and _count(app, Job) == 1


def test_same_key_with_another_body_or_route_is_a_conflict(
    client: TestClient, app: FastAPI
) -> None:
    assert client.post("/api/strategies", json=STRATEGY, headers=_key("k")).status_code == 201
    other = {**STRATEGY, "name": "t"}
    response = client.post("/api/strategies", json=other, headers=_key("k"))
    assert_error(response, 409, "idempotency_conflict", "another request")
    response = client.post("/api/clusters", json={"name": "c"}, headers=_key("k"))
    body = assert_error(response, 409, "idempotency_conflict")
    assert body["detail"]["route"] == "POST /api/strategies"
    assert _count(app, Strategy) == 1


def test_keys_are_per_team(client: TestClient, other_client: TestClient, app: FastAPI) -> None:
    assert client.post("/api/strategies", json=STRATEGY, headers=_key("k")).status_code == 201
    response = other_client.post("/api/strategies", json=STRATEGY, headers=_key("k"))
    assert response.status_code == 201 and "idempotent-replayed" not in response.headers
    assert _count(app, Strategy) == 2


def test_key_length_is_checked(client: TestClient, app: FastAPI) -> None:
    too_long = "k" * (MAX_KEY_LENGTH + 1)
    response = client.post("/api/strategies", json=STRATEGY, headers=_key(too_long))
    assert_error(response, 422, "invalid_request", "Idempotency-Key")
    assert_error(client.post("/api/strategies", json=STRATEGY, headers=_key("")), 422,
                 "invalid_request")  # fmt: skip
    longest = "k" * MAX_KEY_LENGTH
    assert client.post("/api/strategies", json=STRATEGY, headers=_key(longest)).status_code == 201
    assert _count(app, Strategy) == 1


def test_a_failed_request_frees_its_key(client: TestClient, app: FastAPI) -> None:
    bad = client.post("/api/strategies", json={"name": "s"}, headers=_key("k"))
    assert bad.status_code == 422
    assert _count(app, IdempotencyKey) == 0
    good = client.post("/api/strategies", json=STRATEGY, headers=_key("k"))
    assert good.status_code == 201 and "idempotent-replayed" not in good.headers


def test_unauthenticated_requests_are_untouched(app: FastAPI) -> None:
    with TestClient(app) as anon:
        response = anon.post("/api/strategies", json=STRATEGY, headers=_key("k"))
    assert_error(response, 401, "unauthorized")
    assert _count(app, IdempotencyKey) == 0


def test_other_routes_ignore_the_header(client: TestClient, app: FastAPI) -> None:
    created = client.post("/api/strategies", json=STRATEGY).json()
    for _ in range(2):
        response = client.get(f"/api/strategies/{created['id']}", headers=_key("k"))
        assert response.status_code == 200 and "idempotent-replayed" not in response.headers
    assert _count(app, IdempotencyKey) == 0


def test_concurrent_first_uses_create_once(client: TestClient, app: FastAPI) -> None:
    answers: list[Any] = []
    start = threading.Barrier(4)

    def post() -> None:
        start.wait()
        answers.append(client.post("/api/strategies", json=STRATEGY, headers=_key("race")))

    threads = [threading.Thread(target=post) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _count(app, Strategy) == 1
    created = [a for a in answers if a.status_code == 201]
    # the winner created it; the others waited and replayed it (or, had they waited too
    # long, would have got 409 in progress)
    assert len(created) >= 1 and all(a.json() == created[0].json() for a in created)
    assert sum("idempotent-replayed" not in a.headers for a in created) == 1
    for a in answers:
        if a.status_code != 201:
            assert_error(a, 409, "idempotency_conflict")
