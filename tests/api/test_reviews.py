"""Reviews of plans over REST, on SQLite and PostgreSQL: requests, threads anchored to plan
objects with permalinks, resolve, decisions, history, roles, baselines, and bad input that
stores nothing."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from backend.settings import Settings
from tests.api.conftest import assert_error
from tests.api.test_plans import _created, run_jobs, setup_plan


def _review(c: TestClient, plan: int) -> dict[str, Any]:
    answer = c.get(f"/api/plans/{plan}/review")
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def _ops(c: TestClient, plan: int) -> tuple[str, str]:
    """A compute op and a collective of the plan's program."""
    ops = c.get(f"/api/plans/{plan}/program?limit=5000").json()["ops"]
    compute = next(op["name"] for op in ops if not op.get("comm") and op["scope"])
    comm = next(op["name"] for op in ops if op.get("comm"))
    return compute, comm


def _team(user_client: Any) -> tuple[TestClient, TestClient, TestClient]:
    """Ann (writes plans), Bob (reviews them) and Root (an admin) of team alpha."""
    return (
        user_client("alpha", "ann"),
        user_client("alpha", "bob"),
        user_client("alpha", "root", admin=True),
    )


def test_a_review_from_request_to_baseline(user_client: Any, settings: Settings) -> None:
    ann, bob, _ = _team(user_client)
    plan = setup_plan(ann, "h100-sxm-1x4")
    assert run_jobs(settings) == 1
    assert ann.get(f"/api/plans/{plan}").json()["author"] == "ann"
    assert _review(ann, plan)["state"] == "none"

    review = _created(ann.post(f"/api/plans/{plan}/review/requests", json={"reviewers": ["bob"]}))
    assert review["state"] == "pending"
    assert review["reviewers"] == [
        {"user": "bob", "state": "pending", "requested_by": "ann", "decided_at": None}
    ]
    # waiting for Bob's review, not for Ann's
    assert [p["id"] for p in bob.get("/api/plans?reviewer=me").json()] == [plan]
    assert ann.get("/api/plans?reviewer=me").json() == []
    waiting = bob.get("/api/reviews?reviewer=me&state=pending").json()
    assert [(w["plan_id"], w["plan_author"], w["model"]) for w in waiting] == [
        (plan, "ann", "tiny")
    ]

    op, _ = _ops(bob, plan)
    thread = _created(bob.post(f"/api/plans/{plan}/comments", json={
        "body": "Why is this replicated?", "anchor": {"kind": "op", "name": op}}))  # fmt: skip
    assert thread["anchor"]["name"] == op and thread["resolved"] is False
    scope = thread["anchor"]["scope"]
    assert thread["permalink"].startswith(f"#/plans/{plan}/graph?")
    assert f"op={op}" in thread["permalink"].replace("%2E", ".")
    assert op.startswith(scope)  # the graph opens on a scope that shows the op

    reply = _created(ann.post(f"/api/plans/{plan}/comments", json={
        "body": "It is small; see the collective.", "thread_id": thread["id"]}))  # fmt: skip
    assert [c["author"] for c in reply["comments"]] == ["bob", "ann"]
    resolved = ann.post(f"/api/plans/{plan}/comments/{thread['id']}/resolve", json={})
    assert resolved.json()["resolved"] is True and resolved.json()["resolved_by"] == "ann"

    changes = bob.post(f"/api/plans/{plan}/review/decision", json={"decision": "request_changes"})
    assert changes.json()["state"] == "changes_requested"
    assert ann.get("/api/plans?review_state=changes_requested").json()[0]["id"] == plan
    approved = bob.post(
        f"/api/plans/{plan}/review/decision", json={"decision": "approve", "body": "LGTM"}
    ).json()
    assert approved["state"] == "approved" and approved["open_threads"] == 0
    assert bob.get("/api/plans?reviewer=me").json() == []  # decided: no longer waiting
    assert [e["kind"] for e in approved["history"]] == [
        "requested", "commented", "replied", "resolved", "changes_requested", "approved"
    ]  # fmt: skip
    assert [(e["actor"], e["kind"]) for e in approved["history"]][:2] == [
        ("ann", "requested"), ("bob", "commented")
    ]  # fmt: skip

    baseline = _created(ann.post("/api/baselines", json={"plan_id": plan}))
    assert baseline["name"] == "tiny on h100-sxm-1x4" and baseline["set_by"] == "ann"
    assert _review(ann, plan)["history"][-1]["kind"] == "baseline_set"
    assert [b["plan_id"] for b in ann.get("/api/baselines").json()] == [plan]
    # the baseline plan is not compared with itself
    assert ann.get(f"/api/plans/{plan}").json()["baseline"] is None


def test_a_new_plan_of_the_model_shows_its_baseline_comparison(
    user_client: Any, settings: Settings
) -> None:
    ann, bob, _ = _team(user_client)
    base = setup_plan(ann, "h100-sxm-1x4", "base")
    other = setup_plan(ann, "h100-sxm-1x4", "other")
    assert run_jobs(settings) == 2
    bob.post(f"/api/plans/{base}/review/decision", json={"decision": "approve"})
    _created(bob.post("/api/baselines", json={"plan_id": base, "name": "prod"}))
    shown = ann.get(f"/api/plans/{other}").json()
    compared = shown["baseline"]
    assert (compared["name"], compared["plan_id"]) == ("prod", base)
    before = ann.get(f"/api/plans/{base}").json()["summary"]["cost"]["step_time_s"]
    after = shown["summary"]["cost"]["step_time_s"]
    assert compared["step_change_pct"] == (after / before - 1) * 100
    step = next(f for f in compared["figures"] if f["figure"] == "step_time_s")
    assert (step["baseline"], step["plan"]) == (before, after)


def test_every_anchor_kind_and_its_permalink(user_client: Any, settings: Settings) -> None:
    ann, bob, _ = _team(user_client)
    plan = setup_plan(ann, "h100-sxm-1x4")
    assert run_jobs(settings) == 1
    summary = ann.get(f"/api/plans/{plan}").json()["summary"]
    _, comm = _ops(ann, plan)
    step = summary["cost"]["step_time_s"]
    pass_name = summary["passes"][0]["name"]
    anchors = {
        "value": ({"kind": "value", "name": "layers.0.mlp.down_proj.weight"},
                  f"#/plans/{plan}/sharding?value=layers.0.mlp.down_proj.weight"),
        "collective": ({"kind": "collective", "name": comm}, f"#/plans/{plan}/graph?"),
        "scope": ({"kind": "scope", "name": "layers.0.attn"},
                  f"#/plans/{plan}/graph?scope=layers.0.attn"),
        "pass": ({"kind": "pass", "name": pass_name}, f"#/plans/{plan}/passes?b="),
        "timeline": ({"kind": "timeline", "start_s": step / 4, "end_s": step / 2},
                     f"#/plans/{plan}/timeline?t0={step / 4}&t1={step / 2}"),
    }  # fmt: skip
    for kind, (anchor, link) in anchors.items():
        thread = _created(bob.post(f"/api/plans/{plan}/comments", json={
            "body": f"about this {kind}", "anchor": anchor}))  # fmt: skip
        assert thread["permalink"].startswith(link), (kind, thread["permalink"])
    general = _created(bob.post(f"/api/plans/{plan}/comments", json={"body": "Overall fine."}))
    assert general["anchor"] is None and general["permalink"] == f"#/plans/{plan}"
    assert len(_review(ann, plan)["threads"]) == 6


def test_bad_review_input_names_the_field_and_stores_nothing(
    user_client: Any, client: TestClient, settings: Settings
) -> None:
    ann, bob, _ = _team(user_client)
    plan = setup_plan(ann, "h100-sxm-1x4")
    # a plan not yet built has no objects to anchor to
    assert_error(bob.post(f"/api/plans/{plan}/comments", json={
        "body": "x", "anchor": {"kind": "op", "name": "embed"}}), 409, "not_ready")  # fmt: skip
    assert run_jobs(settings) == 1
    _, comm = _ops(ann, plan)
    before = _review(ann, plan)
    url = f"/api/plans/{plan}/comments"
    cases = [
        (bob.post(url, json={"body": "x", "anchor": {"kind": "op", "name": "no.such.op"}}),
         422, "invalid_anchor", "no.such.op"),
        (bob.post(url, json={"body": "x", "anchor": {"kind": "op", "name": comm}}),
         422, "invalid_anchor", comm),  # a collective is not a compute op
        (bob.post(url, json={"body": "x", "anchor": {"kind": "value", "name": "nope"}}),
         422, "invalid_anchor", "nope"),
        (bob.post(url, json={"body": "x", "anchor": {"kind": "scope", "name": "layers.9"}}),
         422, "invalid_anchor", "layers.9"),
        (bob.post(url, json={"body": "x", "anchor": {"kind": "pass", "name": "warp"}}),
         422, "invalid_anchor", "warp"),
        (bob.post(url, json={"body": "x", "anchor": {"kind": "timeline", "start_s": 2,
                                                      "end_s": 1}}),
         422, "invalid_anchor", "start_s"),
        (bob.post(url, json={"body": "x", "anchor": {"kind": "timeline", "start_s": 1e6,
                                                      "end_s": 2e6}}),
         422, "invalid_anchor", "after the step ends"),
        (bob.post(url, json={"body": "", "anchor": None}), 422, "invalid_request", "body"),
        (bob.post(url, json={"body": "   "}), 422, "invalid_request", "body"),
        (bob.post(url, json={"body": "x", "thread_id": 999}), 422, "invalid_comment", "999"),
        (bob.post(url, json={"body": "x", "anchor": {"kind": "oops", "name": "a"}}),
         422, "invalid_request", "anchor.kind"),
        (client.post(url, json={"body": "from a team token"}), 403, "forbidden", "people"),
        (ann.post(f"/api/plans/{plan}/review/requests", json={"reviewers": ["zed"]}),
         422, "invalid_review", "zed"),
        (ann.post(f"/api/plans/{plan}/review/requests", json={"reviewers": ["ann"]}),
         422, "invalid_review", "ann"),
        (ann.post(f"/api/plans/{plan}/review/requests", json={"reviewers": []}),
         422, "invalid_request", "reviewers"),
        (ann.post(f"/api/plans/{plan}/review/decision", json={"decision": "approve"}),
         403, "forbidden", "author"),
        (bob.post(f"/api/plans/{plan}/review/decision", json={"decision": "merge"}),
         422, "invalid_request", "decision"),
        (bob.post("/api/baselines", json={"plan_id": plan}), 422, "invalid_baseline", "approved"),
        (bob.post("/api/baselines", json={"plan_id": 999}), 404, "not_found", "999"),
        (bob.get("/api/plans?author=zed"), 422, "invalid_request", "zed"),
    ]  # fmt: skip
    for answer, status, code, named in cases:
        body = assert_error(answer, status, code, named)
        if status == 422 and code != "invalid_request":
            assert "field" in body["detail"], body
    assert _review(ann, plan) == before  # nothing stored: no thread, request or event
    assert ann.get("/api/baselines").json() == []
    assert ann.get(f"/api/plans/{plan}").json()["review_state"] == "none"


def test_roles_who_may_delete(user_client: Any, settings: Settings) -> None:
    ann, bob, root = _team(user_client)
    plan = setup_plan(ann, "h100-sxm-1x4")
    assert run_jobs(settings) == 1
    first = _created(bob.post(f"/api/plans/{plan}/comments", json={"body": "one"}))
    second = _created(bob.post(f"/api/plans/{plan}/comments", json={"body": "two"}))
    # a member comments and approves, but may not delete, even their own comment
    assert_error(bob.delete(f"/api/plans/{plan}/comments/{first['id']}"), 403, "forbidden")
    assert_error(bob.delete(f"/api/plans/{plan}"), 403, "forbidden", "admin")
    # the plan's author and an admin may
    assert ann.delete(f"/api/plans/{plan}/comments/{first['id']}").status_code == 204
    assert root.delete(f"/api/plans/{plan}/comments/{second['id']}").status_code == 204
    review = _review(ann, plan)
    assert review["threads"] == []
    assert [(e["actor"], e["kind"]) for e in review["history"]][-2:] == [
        ("ann", "comment_deleted"), ("root", "comment_deleted")
    ]  # fmt: skip
    assert root.delete(f"/api/plans/{plan}").status_code == 204
    assert_error(ann.get(f"/api/plans/{plan}"), 404, "not_found")
    assert_error(ann.get(f"/api/plans/{plan}/review"), 404, "not_found")


def test_another_team_sees_no_review(user_client: Any, settings: Settings) -> None:
    ann, bob, _ = _team(user_client)
    eve = user_client("beta", "eve")
    plan = setup_plan(ann, "h100-sxm-1x4")
    assert run_jobs(settings) == 1
    thread = _created(bob.post(f"/api/plans/{plan}/comments", json={"body": "ok"}))
    for answer in (
        eve.get(f"/api/plans/{plan}/review"),
        eve.post(f"/api/plans/{plan}/comments", json={"body": "hi"}),
        eve.post(f"/api/plans/{plan}/review/decision", json={"decision": "approve"}),
        eve.post(f"/api/plans/{plan}/comments/{thread['id']}/resolve", json={}),
        eve.post("/api/baselines", json={"plan_id": plan}),
    ):
        assert_error(answer, 404, "not_found")
    # a member of another team cannot be asked for a review
    assert_error(ann.post(f"/api/plans/{plan}/review/requests", json={"reviewers": ["eve"]}),
                 422, "invalid_review", "eve")  # fmt: skip
    assert (
        eve.get("/api/reviews").json() == [] and eve.get("/api/members").json()[0]["name"] == "eve"
    )
    assert [m["name"] for m in ann.get("/api/members").json()] == ["ann", "bob", "root"]
    assert _review(ann, plan)["state"] == "none"


def test_a_new_strategy_version_is_planned_against_the_baseline(
    user_client: Any, settings: Settings
) -> None:
    """Editing a strategy whose earlier version made a baseline queues the new version's plan
    on the baseline's model and cluster; once built it shows the comparison. A version that
    cannot plan there says why, and is saved all the same."""
    ann, bob, _ = _team(user_client)
    plan = setup_plan(ann, "h100-sxm-1x4", "prod")
    assert run_jobs(settings) == 1
    bob.post(f"/api/plans/{plan}/review/decision", json={"decision": "approve"})
    _created(bob.post("/api/baselines", json={"plan_id": plan}))
    strategy = ann.get(f"/api/plans/{plan}").json()["strategy_id"]

    edit = ann.put(f"/api/strategies/{strategy}", json={"mesh": "dp=4", "templates": ["dp"]})
    assert edit.status_code == 200, edit.text
    [queued] = edit.json()["baseline_plans"]
    assert (queued["baseline"], queued["baseline_plan_id"]) == ("tiny on h100-sxm-1x4", plan)
    assert run_jobs(settings) == 1
    new = ann.get(f"/api/plans/{queued['plan_id']}").json()
    assert new["strategy_id"] == edit.json()["id"] and new["author"] == "ann"
    compared = new["baseline"]
    assert compared["plan_id"] == plan
    before = ann.get(f"/api/plans/{plan}").json()["summary"]["cost"]["step_time_s"]
    after = new["summary"]["cost"]["step_time_s"]
    assert compared["step_change_pct"] == (after / before - 1) * 100

    # a mesh larger than the baseline's cluster (4 GPUs) cannot be planned there
    too_big = ann.put(f"/api/strategies/{strategy}", json={"mesh": "dp=8", "templates": ["dp"]})
    assert too_big.status_code == 200, too_big.text
    [refused] = too_big.json()["baseline_plans"]
    assert refused["plan_id"] is None and "8" in refused["error"]
    assert too_big.json()["version"] == 3
    assert run_jobs(settings) == 0
