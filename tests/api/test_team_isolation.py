"""Team isolation: another team's token gets 404 on every resource of the first team.

The sweep is driven by the OpenAPI document, so an endpoint added later with a path parameter
fails here until the test knows which of team alpha's resources to aim it at. Admin-only
paths (`/api/admin/...`, such as a team's limits) are swept apart: every non-admin gets 403
`forbidden` on them whichever team they name (its own, another one, or none at all), so
they tell a non-admin nothing about other teams either.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient

from backend.settings import Settings
from tests.api.test_clusters import create as create_cluster
from tests.api.test_plan_schedule import create_pipelined_plan
from tests.api.test_plans import _created, run_jobs, setup_plan
from tests.api.test_searches import create_search

STRATEGY_EDIT = {"mesh": "dp=4", "templates": ["dp"]}
#: request bodies of the writes addressed by path id (a body-less call would be a 422)
BODIES = {
    ("put", "/api/strategies/{strategy_id}"): STRATEGY_EDIT,
    ("post", "/api/plans/{plan_id}/review/requests"): {"reviewers": ["bob"]},
    ("post", "/api/plans/{plan_id}/review/decision"): {"decision": "approve"},
    ("post", "/api/plans/{plan_id}/comments"): {"body": "hello"},
    ("post", "/api/plans/{plan_id}/comments/{thread_id}/resolve"): {"resolved": True},
    ("post", "/api/plans/{plan_id}/measurements"): {"steps": 1},
    ("post", "/api/searches/{search_id}/plans"): {"candidate": 0},
    ("put", "/api/admin/teams/{team}/limits"): {"max_running_jobs": 1},
}
#: paths only administrators may use (403 for anyone else, whatever the path names)
ADMIN_PREFIX = "/api/admin/"


def _alpha_resources(client: TestClient, settings: Settings, bob: TestClient) -> dict[str, Any]:
    """Every kind of resource in team alpha, built; the value of each path parameter.
    `bob`, a member of alpha, reviews plan a and makes it a baseline."""
    plan_a = setup_plan(client, "h100-sxm-1x4", "a")
    plan_b = setup_plan(client, "h100-sxm-1x4", "b")
    verification = _created(client.post("/api/verifications", json={"plan_id": plan_a}))
    comparison = _created(
        client.post("/api/comparisons", json={"plan_a_id": plan_a, "plan_b_id": plan_b})
    )
    pipelined = create_pipelined_plan(client)
    search_id = create_search(client)
    create_cluster(client, "lab")
    token = _created(client.post("/api/tokens", json={"name": "ci"}))
    queued = client.get(f"/api/plans/{plan_a}").json()
    check = _created(client.post("/api/checks", json={
        "model_id": queued["model_id"], "strategy_id": queued["strategy_id"],
        "cluster": "h100-sxm-1x4"}))  # fmt: skip
    assert run_jobs(settings) == 7
    _created(client.post(f"/api/plans/{plan_a}/measurements", json={"steps": 1}))
    assert run_jobs(settings) == 1  # on torch ranks: the plan's `measured` views
    plan = client.get(f"/api/plans/{plan_a}").json()
    collective = client.get(f"/api/plans/{plan_a}/collectives").json()[0]["name"]
    thread = _created(bob.post(f"/api/plans/{plan_a}/comments", json={"body": "ok?"}))
    assert bob.post(f"/api/plans/{plan_a}/review/decision", json={"decision": "approve"}).is_success
    baseline = _created(bob.post("/api/baselines", json={"plan_id": plan_a}))
    return {
        "thread_id": str(thread["id"]),
        "comment_id": str(thread["id"]),
        "baseline_id": str(baseline["id"]),
        "model_id": str(plan["model_id"]),
        "strategy_id": str(plan["strategy_id"]),
        "plan_id": str(plan_a),
        "verification_id": str(verification["id"]),
        "comparison_id": str(comparison["id"]),
        "job_id": str(plan["job_id"]),
        "token_id": str(token["id"]),
        "search_id": str(search_id),
        "check_id": str(check["id"]),
        "value": "layers.0.mlp.down_proj.weight",
        "/api/clusters/{name}": "lab",
        "/api/plans/{plan_id}/collectives/{name}": collective,
        "/api/plans/{plan_id}/graph/ops/{name}": "embed",
        # a pipelined plan's views: its own plan id, a model chunk and a phase
        "/api/plans/{plan_id}/schedule": {"plan_id": str(pipelined)},
        "/api/plans/{plan_id}/schedule/units/{chunk}/{phase}": {
            "plan_id": str(pipelined),
            "chunk": "0",
            "phase": "F",
        },
    }


def _fill(path: str, ids: dict[str, Any]) -> str:
    """`path` with its parameters: the path's own values where it has some, else the
    resource of that name, else the path's one value."""
    own = ids.get(path)

    def value(match: re.Match[str]) -> str:
        param = match.group(1)
        if isinstance(own, dict) and param in own:
            return str(own[param])
        return str(ids.get(param) or own)

    return re.sub(r"\{(\w+)\}", value, path)


def _operations(app: FastAPI) -> list[tuple[str, str]]:
    """(method, path template) of every operation addressing one resource by a path id."""
    return [
        (method, path)
        for path, item in app.openapi()["paths"].items()
        if "{" in path
        and not path.startswith("/api/presets")  # presets are a shared catalog
        and not path.startswith(ADMIN_PREFIX)
        for method in item
    ]


def _admin_operations(app: FastAPI) -> list[tuple[str, str]]:
    """(method, path template) of every admin-only operation with a path parameter."""
    return [
        (method, path)
        for path, item in app.openapi()["paths"].items()
        if "{" in path and path.startswith(ADMIN_PREFIX)
        for method in item
    ]


def _call(client: TestClient, method: str, path: str, url: str) -> Any:
    return client.request(method.upper(), url, json=BODIES.get((method, path)))


def test_another_team_gets_404_on_every_resource(
    app: FastAPI,
    client: TestClient,
    other_client: TestClient,
    user_client: Any,
    settings: Settings,
) -> None:
    ids = _alpha_resources(client, settings, user_client("alpha", "bob"))
    operations = _operations(app)
    assert len(operations) >= 18, operations
    reads = [(m, p) for m, p in operations if m == "get"]
    before = {p: client.get(_fill(p, ids)) for _, p in reads}
    for path, answer in before.items():
        assert answer.status_code == 200, (path, answer.text)

    for method, path in operations:
        url = _fill(path, ids)
        answer = _call(other_client, method, path, url)
        assert answer.status_code == 404, (method, url, answer.status_code, answer.text)
        body = answer.json()
        assert set(body) == {"code", "message", "detail"} and body["code"] == "not_found"

    # nothing alpha owns changed, and beta's listings show none of it
    for path, answer in before.items():
        if path.endswith(("/junit", "/export")):  # an XML report, an exported file
            assert client.get(_fill(path, ids)).text == answer.text, path
        elif not path.endswith("/events"):  # a stream, not a stored view
            assert client.get(_fill(path, ids)).json() == answer.json(), path
    assert client.get("/api/me").status_code == 200  # alpha's token was not revoked
    for listing in (
        "models",
        "strategies",
        "plans",
        "verifications",
        "comparisons",
        "jobs",
        "searches",
        "baselines",
        "reviews",
    ):
        assert other_client.get(f"/api/{listing}").json() == [], listing
    assert [c for c in other_client.get("/api/clusters").json() if c["source"] == "user"] == []
    assert [t["name"] for t in other_client.get("/api/tokens").json()] == ["test"]


def test_admin_paths_are_403_for_every_non_admin_whatever_team_they_name(
    app: FastAPI, client: TestClient, other_client: TestClient, user_client: Any
) -> None:
    operations = _admin_operations(app)
    assert ("put", "/api/admin/teams/{team}/limits") in operations, operations
    member = user_client("beta", "carol")  # a person, not an admin
    for method, path in operations:
        for team in ("alpha", "beta", "no-such-team"):
            url = re.sub(r"\{\w+\}", team, path)
            for caller in (client, other_client, member):
                answer = _call(caller, method, path, url)
                assert answer.status_code == 403, (method, url, answer.text)
                assert answer.json()["code"] == "forbidden"
    admin = user_client("alpha", "root", service_admin=True)
    limits = admin.get("/api/admin/teams/alpha/limits").json()
    assert limits["max_running_jobs"]["source"] == "default", "nothing was changed"
    assert admin.get("/api/admin/teams/no-such-team/limits").status_code == 404
