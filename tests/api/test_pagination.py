"""Lists page through `?limit=&offset=` with the total in `X-Total-Count` and the next page
in `Link`; plans and searches filter by model (plans also by strategy and cluster); other
teams' rows never count."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.api.conftest import assert_error
from tests.api.test_plans import setup_plan


def test_plans_page_with_a_total_and_a_next_link(
    client: TestClient, other_client: TestClient
) -> None:
    ids = [setup_plan(client, name=f"s{i}") for i in range(5)]  # newest last
    first = client.get("/api/plans", params={"limit": 2})
    assert first.status_code == 200, first.text
    assert [p["id"] for p in first.json()] == ids[::-1][:2]  # newest first
    assert first.headers["X-Total-Count"] == "5"
    link = first.headers["Link"]
    assert link.endswith('>; rel="next"') and "offset=2" in link and "limit=2" in link
    following = client.get(link[1 : link.index(">")])
    assert [p["id"] for p in following.json()] == ids[::-1][2:4]
    last = client.get("/api/plans", params={"limit": 2, "offset": 4})
    assert [p["id"] for p in last.json()] == [ids[0]] and "Link" not in last.headers
    assert len(client.get("/api/plans").json()) == 5  # the default page holds them all
    # filters: one strategy version's plans, a cluster, a model
    strategy = client.get(f"/api/plans/{ids[2]}").json()["strategy_id"]
    only = client.get("/api/plans", params={"strategy_id": strategy})
    assert [p["id"] for p in only.json()] == [ids[2]] and only.headers["X-Total-Count"] == "1"
    assert client.get("/api/plans", params={"cluster": "h200-8x8"}).json() == []
    model = client.get(f"/api/plans/{ids[0]}").json()["model_id"]
    assert len(client.get("/api/plans", params={"model_id": model}).json()) == 5
    # another team sees none of them, and counts none
    theirs = other_client.get("/api/plans")
    assert theirs.json() == [] and theirs.headers["X-Total-Count"] == "0"


def test_models_and_strategies_page_too(client: TestClient) -> None:
    for i in range(3):
        setup_plan(client, name=f"t{i}")
    models = client.get("/api/models", params={"limit": 1})
    assert len(models.json()) == 1 and models.headers["X-Total-Count"] == "1"
    strategies = client.get("/api/strategies", params={"limit": 2, "offset": 1})
    assert [s["name"] for s in strategies.json()] == ["t1", "t2"]
    assert strategies.headers["X-Total-Count"] == "3" and "Link" not in strategies.headers
    searches = client.get("/api/searches", params={"limit": 5})
    assert searches.json() == [] and searches.headers["X-Total-Count"] == "0"


def test_bad_pages_are_named(client: TestClient) -> None:
    for params, field in (({"limit": 0}, "limit"), ({"limit": 1001}, "limit"),
                          ({"offset": -1}, "offset"), ({"model_id": 0}, "model_id")):  # fmt: skip
        assert_error(client.get("/api/plans", params=params), 422, "invalid_request", field)
    assert_error(client.get("/api/models", params={"limit": "many"}), 422, "invalid_request",
                 "limit")  # fmt: skip
