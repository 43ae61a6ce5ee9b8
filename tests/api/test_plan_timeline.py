"""The per-stage views of a costed plan: stages, timeline (window, rank, aggregation),
memory per rank, and one stage against another."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest
from fastapi.testclient import TestClient

from backend.settings import Settings
from shardlab.cost.clusters import load_cluster
from tests.api.test_plans import run_jobs, setup_plan

VIEWS = ("/stages", "/timeline", "/memory", "/stages/compare")


def _get(client: TestClient, path: str, **params: Any) -> Any:
    answer = client.get(path, params=params)
    assert answer.status_code == 200, answer.text
    return answer.json()


def _lanes(events: list[dict[str, Any]]) -> dict[tuple[int, str], float]:
    busy: dict[tuple[int, str], float] = defaultdict(float)
    for e in events:
        busy[(e["rank"], e["stream"])] += e["busy"]
    return dict(busy)


def test_stages_and_timeline(client: TestClient, settings: Settings) -> None:
    plan_id = setup_plan(client)
    early = client.get(f"/api/plans/{plan_id}/timeline")
    assert early.status_code == 409 and early.json()["code"] == "not_ready"
    assert run_jobs(settings) == 1
    summary = _get(client, f"/api/plans/{plan_id}")["summary"]
    base = f"/api/plans/{plan_id}"

    stages = _get(client, f"{base}/stages")
    assert stages[0]["name"] == "lowered"
    assert [s["name"] for s in stages[1:]] == [p["name"] for p in summary["passes"]]
    for stage, passed in zip(stages[1:], summary["passes"], strict=True):
        assert stage["step_time_s"] == passed["step_time_s"]
        assert stage["peak_memory_bytes"] == passed["peak_memory_bytes"]
        assert stage["message"] == passed["message"] and stage["ops"] == passed["ops_after"]
        # the cost guard: a declined pass keeps the step before it and says why
        assert stage["declined"] is passed["declined"]
        assert stage["declined_reason"] == passed["declined_reason"]
        assert passed["step_time_s"] <= passed["step_before_s"]
    assert stages[0]["declined"] is False
    last = stages[-1]
    assert last["step_time_s"] == summary["cost"]["step_time_s"]
    assert last["mfu"] == summary["cost"]["mfu"] and last["exposed_comm_s"] >= 0

    whole = _get(client, f"{base}/timeline")
    step = whole["step_time_s"]
    assert whole["stage"] == last["name"] and step == last["step_time_s"]
    assert whole["aggregated"] is False and whole["t0"] == 0 and whole["t1"] == step
    assert whole["ranks"] and all(r["stands_for"] for r in whole["ranks"])
    covered = sorted(r for rank in whole["ranks"] for r in rank["stands_for"])
    assert covered == [0, 1, 2, 3]
    events = whole["events"]
    assert len(events) == whole["total_events"] == last["ops"] * len(whole["ranks"])
    assert all(0 <= e["start"] <= e["end"] <= step * (1 + 1e-12) for e in events)
    assert max(e["end"] for e in events) == step
    assert {e["role"] for e in events} >= {"forward", "backward", "optimizer", "comm"}
    comm = [e for e in events if e["stream"] != "compute"]
    assert comm and all(e["exposed"] >= 0 and e["role"] == "comm" for e in comm)
    assert all(e["bytes"] > 0 for e in comm if e["kind"] == "all_reduce")
    assert any(e["deps"] for e in events)
    for rank in whole["ranks"]:  # busy seconds per op kind over the whole step
        mine = [e for e in events if e["rank"] == rank["rank"]]
        kinds = rank["kinds"]
        assert [k["busy_s"] for k in kinds] == sorted((k["busy_s"] for k in kinds), reverse=True)
        assert sum(k["count"] for k in kinds) == len(mine)
        assert {k["kind"] for k in kinds} == {e["kind"] for e in mine}
        assert sum(k["busy_s"] for k in kinds) == pytest.approx(sum(e["busy"] for e in mine))
        for k in kinds:
            assert set(k["streams"]) == {e["stream"] for e in mine if e["kind"] == k["kind"]}
    names = {e["name"] for e in events}
    assert all(d in names for e in events for d in e["deps"])

    first = _get(client, f"{base}/timeline", stage="lowered")
    assert first["stage"] == "lowered" and first["step_time_s"] == stages[0]["step_time_s"]
    one = _get(client, f"{base}/timeline", rank=3)
    assert one["rank"] == 3 and len(one["ranks"]) == 1 and 3 in one["ranks"][0]["stands_for"]
    assert one["representatives"] == whole["representatives"] == whole["ranks"]
    assert {e["rank"] for e in one["events"]} == {one["ranks"][0]["rank"]}

    t0, t1 = step * 0.25, step * 0.5
    window = _get(client, f"{base}/timeline", t0=t0, t1=t1)
    assert window["t0"] == t0 and window["t1"] == t1
    inside = [e for e in events if e["end"] >= t0 and e["start"] <= t1]
    assert 0 < len(window["events"]) == len(inside) < len(events)
    assert all(e["end"] >= t0 and e["start"] <= t1 for e in window["events"])

    small = _get(client, f"{base}/timeline", max_events=10)
    assert small["aggregated"] is True and small["total_events"] == len(events)
    assert len(small["events"]) <= 10 < len(events)
    assert sum(e["count"] for e in small["events"]) == len(events)
    merged, exact = _lanes(small["events"]), _lanes(events)
    assert merged.keys() == exact.keys()
    for lane, busy in exact.items():
        assert merged[lane] == pytest.approx(busy, rel=1e-9), lane
    assert any(e["count"] > 1 for e in small["events"])
    zoomed = _get(client, f"{base}/timeline", max_events=10, t0=t0, t1=t0 + step * 1e-4)
    assert all(e["count"] == 1 for e in zoomed["events"]) and zoomed["aggregated"] is False

    unknown = client.get(f"{base}/timeline", params={"stage": "nope"})
    assert unknown.status_code == 404 and "'nope'" in unknown.json()["message"]
    assert "lowered" in unknown.json()["message"]
    assert unknown.json()["detail"]["stages"] == [s["name"] for s in stages]
    assert client.get(f"{base}/timeline", params={"rank": 4}).status_code == 404
    backwards = client.get(f"{base}/timeline", params={"t0": 0.5, "t1": 0.1})
    assert backwards.status_code == 422 and "t1" in backwards.json()["message"]
    assert client.get(f"{base}/timeline", params={"t0": "nan"}).status_code == 422


def test_memory_and_stage_comparison(client: TestClient, settings: Settings) -> None:
    plan_id = setup_plan(client)
    assert run_jobs(settings) == 1
    base = f"/api/plans/{plan_id}"
    summary = _get(client, base)["summary"]
    stages = _get(client, f"{base}/stages")

    memory = _get(client, f"{base}/memory")
    capacity = load_cluster("h100-sxm-8x8").hbm_bytes
    assert memory["stage"] == stages[-1]["name"] and memory["capacity_bytes"] == capacity
    labels = ["parameters", "gradients", "optimizer state", "activations", "buffers"]
    assert list(memory["categories"]) == labels
    (rank,) = memory["ranks"]
    assert rank["rank"] == 0 and rank["stands_for"] == [0, 1, 2, 3]
    assert list(rank["breakdown"]) == labels
    assert sum(rank["breakdown"].values()) == rank["peak_bytes"]
    assert sum(rank["breakdown_detail"].values()) == rank["peak_bytes"]
    assert rank["peak_bytes"] == summary["cost"]["peak_memory_bytes"]
    assert rank["fits"] is True and rank["headroom_bytes"] == capacity - rank["peak_bytes"]
    assert rank["breakdown"]["parameters"] > 0 and rank["breakdown"]["optimizer state"] > 0
    buffers = rank["largest_buffers"]
    assert buffers and all(b["label"] in labels for b in buffers)
    assert [b["bytes"] for b in buffers] == sorted((b["bytes"] for b in buffers), reverse=True)
    series = rank["series"]
    assert max(series["bytes"]) == rank["peak_bytes"] and rank["peak_op"] in series["op"]
    assert len(series["op"]) == len(series["t"]) == len(series["bytes"])
    lowered = _get(client, f"{base}/memory", stage="lowered")
    assert lowered["ranks"][0]["peak_bytes"] == stages[0]["peak_memory_bytes"]
    assert client.get(f"{base}/memory", params={"stage": "nope"}).status_code == 404

    a, b = stages[0]["name"], stages[-1]["name"]
    compared = _get(client, f"{base}/stages/compare")
    assert compared["a"]["stage"] == a and compared["b"]["stage"] == b
    for key in ("step_time_s", "mfu", "peak_memory_bytes", "exposed_comm_s"):
        assert compared["delta"][key] == compared["b"][key] - compared["a"][key]
    assert compared["a"]["step_time_s"] == stages[0]["step_time_s"]
    assert compared["b"]["step_time_s"] == stages[-1]["step_time_s"]
    by_kind = {c["kind"]: c for c in compared["collectives"]}
    assert by_kind["all_reduce"]["a"]["count"] > by_kind["all_reduce"]["b"]["count"]  # fused
    for c in compared["collectives"]:
        assert c["delta_count"] == c["b"]["count"] - c["a"]["count"]
        assert c["delta_bytes_per_rank"] == c["b"]["bytes_per_rank"] - c["a"]["bytes_per_rank"]
    scopes = {s["scope"]: s for s in compared["scopes"]}
    assert {"layers.0", "layers.1", "lm_head"} <= set(scopes)
    for s in compared["scopes"]:
        for key in ("compute", "comm", "exposed_comm"):
            assert s[f"{key}_delta"] == s["b"][key] - s["a"][key]
        assert s["delta"] == s["compute_delta"] + s["exposed_comm_delta"]
    total = sum(s["b"]["compute"] for s in compared["scopes"])
    assert total == pytest.approx(stages[-1]["compute_s"], rel=1e-9)

    same = _get(client, f"{base}/stages/compare", a=b, b=b)
    assert all(v == 0 for v in same["delta"].values())
    assert all(s["delta"] == 0 for s in same["scopes"])
    missing = client.get(f"{base}/stages/compare", params={"a": "lowered", "b": "dp_nothing"})
    assert missing.status_code == 404 and "'dp_nothing'" in missing.json()["message"]


def test_plans_without_cost_and_other_teams(
    client: TestClient, other_client: TestClient, settings: Settings
) -> None:
    uncosted = setup_plan(client, None, "uncosted")
    costed = setup_plan(client, name="costed")
    for path in VIEWS:
        answer = client.get(f"/api/plans/{costed}{path}")
        assert answer.status_code == 409 and answer.json()["code"] == "not_ready", path
    assert run_jobs(settings) == 2
    for path in VIEWS:
        answer = client.get(f"/api/plans/{uncosted}{path}")
        assert answer.status_code == 404, path
        body = answer.json()
        assert body["code"] == "not_found"
        assert body["message"] == (
            f"plan {uncosted} has no cost: it was planned without a cluster"
        ), path
        other = other_client.get(f"/api/plans/{costed}{path}")
        assert other.status_code == 404 and other.json()["code"] == "not_found", path
        assert client.get(f"/api/plans/{costed}{path}").status_code == 200, path
