"""Who may do what, per role, on SQLite and PostgreSQL (issue 40, finding 5; the rules are
`backend.ownership`, stated in the README's "Security").

Roles: a service admin (`root`, team ops), a team admin (`ada`, team alpha), two members of
alpha (`ann`, `bob`), alpha's team token, and a member of beta (`ben`).

- Team admins add people to their own team only; service admins to any team, and only
  they make service admins and set teams' limits (a team admin reads their own team's).
- A new token never outlives the token that made it, nor 3650 days; `expires_at` with an
  offset is stored as the instant it names (SQLite once stored the wall time as UTC), and a
  date past the last UTC datetime is a 422, not a 500.
- Deleting a model, cluster or plan and revoking a token: its author or a team admin. A
  team token's rows belong to the team's tokens; no member's token removes a person's.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from itertools import count
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import func, select, update

from backend.orm import ApiToken, User
from shardlab.cost.clusters import load_cluster
from tests.api.conftest import assert_error

SPEC = load_cluster("h100-sxm-1x8").to_json()


@pytest.fixture
def people(user_client: Any, client: TestClient) -> dict[str, TestClient]:
    """Every role's client; `token` is alpha's team token."""
    return {
        "root": user_client("ops", "root", service_admin=True),
        "ada": user_client("alpha", "ada", admin=True),
        "ann": user_client("alpha", "ann"),
        "bob": user_client("alpha", "bob"),
        "token": client,
        "ben": user_client("beta", "ben"),
    }


def _users(app: FastAPI) -> int:
    with app.state.sessions() as session:
        return int(session.scalar(select(func.count()).select_from(User)) or 0)


# -- admins ----------------------------------------------------------------------------------


def test_team_admins_add_people_to_their_own_team_only(
    people: dict[str, TestClient], app: FastAPI
) -> None:
    ada, root = people["ada"], people["root"]
    before = _users(app)
    refusals = [
        (ada.post("/api/admin/users", json={"name": "eve", "team": "beta", "is_admin": True}),
         "only a service admin may add people to team 'beta'"),
        (ada.post("/api/admin/users", json={"name": "eve", "team": "new-team"}),
         "only a service admin may add people to team 'new-team'"),
        (ada.post("/api/admin/users", json={"name": "eve", "team": "alpha",
                                            "is_service_admin": True}),
         "only a service admin may make a service admin"),
        (people["ann"].post("/api/admin/users", json={"name": "eve", "team": "alpha"}),
         "only an admin may add people to team 'alpha'"),
        (people["token"].post("/api/admin/users", json={"name": "eve", "team": "alpha"}),
         "only an admin"),
    ]  # fmt: skip
    for answer, message in refusals:
        assert_error(answer, 403, "forbidden", message)
    assert _users(app) == before  # nothing stored, no team created
    made = ada.post("/api/admin/users", json={"name": "eve", "team": "alpha", "is_admin": True})
    assert made.status_code == 201, made.text
    assert (made.json()["team"], made.json()["is_admin"]) == ("alpha", True)
    assert made.json()["is_service_admin"] is False
    other = root.post("/api/admin/users", json={"name": "zed", "team": "gamma", "is_admin": True})
    assert other.status_code == 201 and other.json()["team"] == "gamma"
    sa = root.post("/api/admin/users", json={"name": "sam", "team": "ops",
                                             "is_service_admin": True})  # fmt: skip
    assert sa.status_code == 201 and sa.json()["is_service_admin"] is True
    assert sa.json()["is_admin"] is True


def test_only_service_admins_set_limits_and_team_admins_read_their_own(
    people: dict[str, TestClient],
) -> None:
    ada, root = people["ada"], people["root"]
    people["ben"].get("/api/me")  # team beta exists
    assert_error(ada.put("/api/admin/teams/beta/limits", json={"max_running_jobs": 99}),
                 403, "forbidden", "service admin")  # fmt: skip
    assert_error(ada.put("/api/admin/teams/alpha/limits", json={"max_running_jobs": 99}),
                 403, "forbidden", "service admin")  # fmt: skip
    assert_error(ada.get("/api/admin/teams/beta/limits"), 403, "forbidden")
    own = ada.get("/api/admin/teams/alpha/limits")
    assert own.status_code == 200 and own.json()["max_running_jobs"]["source"] == "default"
    for name in ("ann", "token", "ben"):
        assert_error(people[name].get("/api/admin/teams/alpha/limits"), 403, "forbidden")
    set_ = root.put("/api/admin/teams/beta/limits", json={"max_running_jobs": 3})
    assert set_.status_code == 200 and set_.json()["max_running_jobs"]["value"] == 3
    assert root.get("/api/admin/teams/alpha/limits").status_code == 200


# -- tokens ----------------------------------------------------------------------------------


def _token(creator: TestClient, **expiry: Any) -> dict[str, Any]:
    answer = creator.post("/api/tokens", json={"name": "t", **expiry})
    assert answer.status_code == 201, answer.text
    body: dict[str, Any] = answer.json()
    return body


def _client_of(app: FastAPI, secret: str) -> TestClient:
    client = TestClient(app)
    client.headers["Authorization"] = f"Bearer {secret}"
    return client


def test_a_token_never_outlives_its_parent_or_the_cap(
    people: dict[str, TestClient], app: FastAPI
) -> None:
    hour = _token(people["ann"], expires_in_days=1)
    with app.state.sessions() as session, session.begin():
        soon = datetime.now(UTC) + timedelta(hours=1)
        session.execute(update(ApiToken).where(ApiToken.id == hour["id"]).values(expires_at=soon))
    short = _client_of(app, hour["token"])
    child = _token(short)  # no expiry asked: the parent's
    assert abs(datetime.fromisoformat(child["expires_at"]) - soon) < timedelta(seconds=1)
    tokens_before = len(people["ann"].get("/api/tokens").json())
    later = (soon + timedelta(minutes=5)).isoformat()
    assert_error(short.post("/api/tokens", json={"name": "t", "expires_in_days": 30}), 422,
                 "invalid_request", "body.expires_in_days", "never outlives")  # fmt: skip
    assert_error(short.post("/api/tokens", json={"name": "t", "expires_at": later}), 422,
                 "invalid_request", "body.expires_at")  # fmt: skip
    for creator in (people["ann"], short):
        far = creator.post("/api/tokens", json={"name": "t", "expires_at": "9999-01-01T00:00Z"})
        assert_error(far, 422, "invalid_request", "more than 3650 days ahead")
        beyond = creator.post("/api/tokens", json={"name": "t", "expires_in_days": 3651})
        assert_error(beyond, 422, "invalid_request", "expires_in_days")
    assert len(people["ann"].get("/api/tokens").json()) == tokens_before
    capped = _token(people["ann"])  # a parent that never expires: the cap
    cap = datetime.now(UTC) + timedelta(days=3650)
    assert abs(datetime.fromisoformat(capped["expires_at"]) - cap) < timedelta(minutes=1)


def test_an_expiry_with_an_offset_is_the_instant_it_names(
    people: dict[str, TestClient], app: FastAPI
) -> None:
    moment = (datetime.now(UTC) + timedelta(days=2)).replace(microsecond=0)
    at_minus_five = moment.astimezone(timezone(timedelta(hours=-5)))
    made = _token(people["ann"], expires_at=at_minus_five.isoformat())
    assert at_minus_five.isoformat().endswith("-05:00")
    assert datetime.fromisoformat(made["expires_at"]) == moment
    listed = {t["id"]: t for t in people["ann"].get("/api/tokens").json()}
    assert datetime.fromisoformat(listed[made["id"]]["expires_at"]) == moment  # as stored
    assert _client_of(app, made["token"]).get("/api/me").status_code == 200


def test_the_last_utc_datetime_with_an_offset_is_a_422(people: dict[str, TestClient]) -> None:
    late = people["ann"].post(
        "/api/tokens", json={"name": "t", "expires_at": "9999-12-31T23:00:00-14:00"}
    )
    assert_error(late, 422, "invalid_request", "expires_at")


# -- who removes what ------------------------------------------------------------------------

_names = count()


def _model(creator: TestClient) -> str:
    body = {"name": f"m{next(_names)}", "preset": "mlp_demo"}
    answer = creator.post("/api/models", json=body)
    assert answer.status_code == 201, answer.text
    return f"/api/models/{answer.json()['id']}"


def _cluster(creator: TestClient) -> str:
    name = f"c{next(_names)}"
    answer = creator.post("/api/clusters", json={"name": name, "spec": SPEC})
    assert answer.status_code == 201, answer.text
    return f"/api/clusters/{name}"


def _plan(creator: TestClient) -> str:
    model = int(_model(creator).rsplit("/", 1)[1])
    strategy = creator.post("/api/strategies", json={"name": f"s{next(_names)}", "mesh": "dp=2"})
    assert strategy.status_code == 201, strategy.text
    plan = creator.post("/api/plans", json={"model_id": model,
                                            "strategy_id": strategy.json()["id"]})  # fmt: skip
    assert plan.status_code == 202, plan.text
    creator.post(f"/api/jobs/{plan.json()['job_id']}/cancel")  # not while it is queued
    return f"/api/plans/{plan.json()['id']}"


def _token_path(creator: TestClient) -> str:
    return f"/api/tokens/{_token(creator)['id']}"


MAKERS = {"model": _model, "cluster": _cluster, "plan": _plan, "token": _token_path}
#: (what, made by, removed by) -> may remove
RULES = {
    ("ann", "ann"): True,  # the author
    ("ann", "bob"): False,  # another member
    ("ann", "ada"): True,  # a team admin
    ("ann", "token"): False,  # a team token does not remove a person's
    ("ada", "ann"): False,  # a member does not remove an admin's
    ("token", "token"): True,  # the team's tokens own what a team token made
    ("token", "ann"): False,
    ("token", "ada"): True,
}


@pytest.mark.parametrize("what", list(MAKERS))
def test_one_rule_removes_every_resource(what: str, people: dict[str, TestClient]) -> None:
    for (maker, remover), allowed in RULES.items():
        path = MAKERS[what](people[maker])
        answer = people[remover].delete(path)
        if allowed:
            assert answer.status_code == 204, (what, maker, remover, answer.text)
            assert not _exists(people[maker], path), (what, maker, remover)
        else:
            assert_error(answer, 403, "forbidden", "only an admin of the team or the author")
            assert _exists(people[maker], path), (what, maker, remover)
    # another team's rows are not found, whatever its role
    path = MAKERS[what](people["ann"])
    assert_error(people["ben"].delete(path), 404, "not_found")
    assert _exists(people["ann"], path)


def _exists(reader: TestClient, path: str) -> bool:
    """Whether the resource at `path` is still there (a token: not revoked)."""
    if path.startswith("/api/tokens/"):
        token_id = int(path.rsplit("/", 1)[1])
        (token,) = [t for t in reader.get("/api/tokens").json() if t["id"] == token_id]
        return token["revoked_at"] is None
    return bool(reader.get(path).status_code == 200)
