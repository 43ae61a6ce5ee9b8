"""Per-team limits on both databases: a service admin reads and sets them (defaults otherwise), and
each is enforced: jobs queued (429 `too_many_jobs`), requests a minute (429 `rate_limited`),
the job deadline, the engine's memory (`out_of_memory`), and the cost estimate at POST that
refuses a plan which could not be built within the deadline (422 `too_expensive`)."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from backend.settings import Settings
from shardlab.cost.clusters import load_cluster
from tests.api.conftest import assert_error
from tests.api.test_plans import TINY, _created, run_jobs, setup_plan

GIB = 1024**3
DEFAULTS = {
    "max_running_jobs": 2,
    "max_queued_jobs": 50,
    "requests_per_minute": 600,
    "job_deadline_s": 900.0,
    "job_memory_bytes": 8 * GIB,
}


def _admin(user_client: Any) -> TestClient:
    """A service administrator in a team of its own (its requests count against team `ops`)."""
    admin: TestClient = user_client("ops", "root", service_admin=True)
    return admin


def _set(admin: TestClient, team: str, **limits: Any) -> dict[str, Any]:
    answer = admin.put(f"/api/admin/teams/{team}/limits", json=limits)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def _model(client: TestClient, name: str, **overrides: Any) -> int:
    body = {"name": name, "preset": "llama3-8b", "overrides": {**TINY, **overrides}}
    return int(_created(client.post("/api/models", json=body))["id"])


def _strategy(client: TestClient, name: str, mesh: str, templates: list[str]) -> int:
    body = {"name": name, "mesh": mesh, "templates": templates}
    return int(_created(client.post("/api/strategies", json=body))["id"])


def test_defaults_then_an_admins_limits_with_their_source(
    client: TestClient, user_client: Any, settings: Settings
) -> None:
    admin = _admin(user_client)
    assert client.get("/api/me").status_code == 200  # team alpha exists
    shown = admin.get("/api/admin/teams/alpha/limits").json()
    assert shown["team"] == "alpha" and shown["updated_at"] is None
    for name, value in DEFAULTS.items():
        assert shown[name] == {"value": value, "source": "default", "default": value}, name

    after = _set(admin, "alpha", max_running_jobs=3, job_deadline_s=120)
    assert after["max_running_jobs"] == {"value": 3, "source": "team", "default": 2}
    assert after["job_deadline_s"] == {"value": 120.0, "source": "team", "default": 900.0}
    assert after["max_queued_jobs"]["source"] == "default" and after["updated_at"]
    assert admin.get("/api/admin/teams/alpha/limits").json() == after

    # null returns one limit to the default; what is left out keeps its value
    again = _set(admin, "alpha", max_running_jobs=None)
    assert again["max_running_jobs"] == {"value": 2, "source": "default", "default": 2}
    assert again["job_deadline_s"]["value"] == 120.0

    for bad, field in (
        ({"max_queued_jobs": 0}, "body.max_queued_jobs"),
        ({"job_memory_bytes": 1024}, "body.job_memory_bytes"),
        ({"job_deadline_s": 10**9}, "body.job_deadline_s"),
        ({"requests_per_minute": "600"}, "body.requests_per_minute"),
        ({"max_jobs": 3}, "body.max_jobs"),
    ):
        answer = admin.put("/api/admin/teams/alpha/limits", json=bad)
        assert_error(answer, 422, "invalid_request", field)
    assert_error(admin.get("/api/admin/teams/nobody/limits"), 404, "not_found", "nobody")
    assert_error(client.put("/api/admin/teams/alpha/limits", json={}), 403, "forbidden")


def test_queued_jobs_beyond_the_teams_limit_are_429_with_retry_after(
    client: TestClient, other_client: TestClient, user_client: Any, settings: Settings
) -> None:
    _set(_admin(user_client), "alpha", max_queued_jobs=2)
    setup_plan(client, "h100-sxm-1x4", "a")
    plan_b = setup_plan(client, "h100-sxm-1x4", "b")
    third = client.post("/api/verifications", json={"plan_id": plan_b})
    body = assert_error(third, 429, "too_many_jobs", "2 jobs queued or running", "limit is 2")
    assert body["detail"] == {"limit": 2, "active": 2}
    assert third.headers["retry-after"] == "30"
    assert len(client.get("/api/verifications").json()) == 0, "nothing was stored"
    setup_plan(other_client, "h100-sxm-1x4", "b")  # another team is not held back

    assert run_jobs(settings) == 3
    assert _created(client.post("/api/verifications", json={"plan_id": plan_b}))["job_id"]


def test_requests_beyond_the_teams_rate_are_429_and_other_teams_go_on(
    client: TestClient, other_client: TestClient, user_client: Any
) -> None:
    _set(_admin(user_client), "alpha", requests_per_minute=5)
    answers = [client.get("/api/models") for _ in range(6)]
    assert [a.status_code for a in answers[:5]] == [200] * 5
    body = assert_error(answers[5], 429, "rate_limited", "limit is 5 a minute")
    retry = int(answers[5].headers["retry-after"])
    assert 1 <= retry <= 12 and body["detail"] == {"limit": 5, "retry_after_s": retry}
    assert other_client.get("/api/models").status_code == 200


def test_a_jobs_deadline_is_its_teams_limit_else_the_default(
    client: TestClient, other_client: TestClient, user_client: Any
) -> None:
    _set(_admin(user_client), "alpha", job_deadline_s=120)
    ours = client.get(f"/api/plans/{setup_plan(client, 'h100-sxm-1x4')}").json()
    theirs = other_client.get(f"/api/plans/{setup_plan(other_client, 'h100-sxm-1x4')}").json()
    assert client.get(f"/api/jobs/{ours['job_id']}").json()["deadline_s"] == 120.0
    assert other_client.get(f"/api/jobs/{theirs['job_id']}").json()["deadline_s"] == 900.0


def test_the_engine_process_is_capped_at_the_teams_memory(
    client: TestClient, user_client: Any, settings: Settings
) -> None:
    """Under a 512 MiB cap a plan and a tiny verification still run (numpy and the engine
    need about 150 MiB), while verifying a model of about 39 M parameters (a vocab of 2^15 x
    hidden 512; in float64 its parameters, gradients and moments alone are 1.2 GiB, within
    the 4 GiB the service lets a verification start with) fails with `out_of_memory` naming
    the limit."""
    _set(_admin(user_client), "alpha", job_memory_bytes=512 * 1024**2)
    big = _model(client, "wide", vocab=1 << 15, hidden=512, heads=8, kv_heads=8, ffn=1024)
    tiny = _model(client, "tiny")
    strategy = _strategy(client, "dp2", "dp=2", ["dp"])
    plans = {
        name: _created(client.post("/api/plans", json={"model_id": model, "strategy_id": strategy}))
        for name, model in (("big", big), ("tiny", tiny))
    }
    assert run_jobs(settings) == 2
    for name, plan in plans.items():
        assert client.get(f"/api/plans/{plan['id']}").json()["status"] == "succeeded", name
    checks = {
        name: _created(client.post("/api/verifications", json={"plan_id": plan["id"]}))
        for name, plan in plans.items()
    }
    assert run_jobs(settings) == 2
    tiny_job = client.get(f"/api/jobs/{checks['tiny']['job_id']}").json()
    assert tiny_job["status"] == "succeeded", tiny_job["error"]
    job = client.get(f"/api/jobs/{checks['big']['job_id']}").json()
    assert job["status"] == "failed"
    assert job["error"]["code"] == "out_of_memory"
    assert "at most 0.5 GiB" in job["error"]["message"]
    assert job["error"]["detail"]["limit_bytes"] == 512 * 1024**2


def _big_cluster(client: TestClient, name: str, devices_per_node: int) -> None:
    """A team cluster of a billion nodes of `devices_per_node` H100s."""
    spec = {**load_cluster("h100-sxm-8x8").to_json(), "name": name, "nodes": 10**9,
            "devices_per_node": devices_per_node}  # fmt: skip
    assert client.post("/api/clusters", json={"name": name, "spec": spec}).status_code == 201


def test_a_hopeless_plan_is_refused_at_post_and_an_expensive_one_accepted(
    client: TestClient, user_client: Any
) -> None:
    _big_cluster(client, "uneven", 3)
    _big_cluster(client, "huge", 8)
    wide = _model(client, "b4096", batch=4096)
    # dp x tp=2 on nodes of 3: tp groups straddle nodes unevenly, so the ranks have several
    # roles and every one of the 8192 ranks is simulated: most of an hour
    mixed = _strategy(client, "mixed", "dp=4096,tp=2", ["dp", "megatron_tp"])
    answer = client.post(
        "/api/plans", json={"model_id": wide, "strategy_id": mixed, "cluster": "uneven"}
    )
    body = assert_error(answer, 422, "too_expensive", "8192 devices", "job deadline of 900 s")
    assert body["detail"]["estimate_s"] > 900 and body["detail"]["mixed_roles"] is True
    assert body["detail"]["devices"] == 8192 and body["detail"]["deadline_s"] == 900.0
    assert client.get("/api/plans").json() == [], "nothing was queued"

    # the plan: llama3-70b (80 layers) on dp=2^20 of a billion-node cluster. Every
    # rank has the same role: about a minute of work, accepted
    seventy = _created(
        client.post(
            "/api/models",
            json={
                "name": "70b",
                "preset": "llama3-70b",
                "overrides": {"batch": 1 << 20, "seq": 16},
            },
        )
    )
    huge_dp = _strategy(client, "dp20", "dp=1048576", ["dp"])
    plan = {"model_id": seventy["id"], "strategy_id": huge_dp, "cluster": "huge"}
    assert _created(client.post("/api/plans", json=plan))["status"] == "queued"

    # ... but not for a team whose deadline is 30 s
    _set(_admin(user_client), "alpha", job_deadline_s=30)
    refused = assert_error(
        client.post("/api/plans", json=plan), 422, "too_expensive", "deadline of 30 s"
    )
    assert 30 < refused["detail"]["estimate_s"] < 900
    assert refused["detail"]["ops"] > 6000 and refused["detail"]["mixed_roles"] is False
