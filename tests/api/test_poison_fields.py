"""Property: no field of any write takes poison or breaks a read, on SQLite and PostgreSQL
(issue 40).

For every POST and PUT of `/api/openapi.json` that takes a JSON body, every field its schema
declares (nested objects, list items, keys of free-form objects, and the first leaves of
what those hold: a graph document, a Hugging Face config, a cluster spec, strategy options)
gets each poison in turn: lone surrogates, NaN, Infinity, -Infinity, integers past 2^63 - 1
(10^400, 2^63), and a free-form object keyed by a lone surrogate. Each request must be a
4xx with `{code, message, detail}` and, per operation, leave every table as it was.

Then every string field gets a hostile name (code for the exported module, SQL, markup,
templates, paths, a right-to-left override; one a field, each in turn): answered below 500,
stored or refused. The worker then runs every job queued meanwhile (an import stores a model
with a hostile name) to a final state; every list and read of the API answers (200 for lists
and each stored row's read, below 500 for the views of plans that are not built); and the
worker, still alive, builds one more plan.

`bases` holds valid bodies of each operation (a test holds it to the spec, so a new write
endpoint must be added here); fields a base leaves out are added with the poison.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import select

from backend.orm import Check, Cluster, Job, Model, Plan, Search, Strategy, Team
from backend.settings import Settings
from shardlab.cost.clusters import load_cluster
from tests.api.test_bad_requests import GRAPH, row_counts
from tests.api.test_model_import import LLAMA
from tests.api.test_plans import run_jobs
from worker.main import Worker

#: Each poison and how it is sent (JSON text as `json.dumps` writes it: surrogates escaped,
#: NaN and Infinity as those tokens).
POISONS: dict[str, Any] = {
    "lone surrogate": "\ud800",
    "low surrogate in text": "model \udfff",
    "NaN": float("nan"),
    "Infinity": float("inf"),
    "-Infinity": float("-inf"),
    "10^400": 10**400,
    "2^63": 2**63,
    "surrogate key": {"\ud800": 1},
}
HOSTILE = [
    'x"""and __import__("os").system("id")or"""',
    "'; DROP TABLE models; --",
    '<img src=x onerror="alert(1)">',
    "{{7*7}}${7*7}",
    "../../../etc/passwd",
    "\u202egnp.exe",
]
#: free-form objects (a graph, a config): how many of the leaves they hold get each poison
FREE_LEAVES = 6
SPEC = load_cluster("h100-sxm-1x8").to_json()
CHECK = {"model": {"preset": "mlp_demo", "overrides": {"hidden": 16}},
         "strategy": {"mesh": "dp=2", "templates": ["dp"], "options": {"lr": 0.01}},
         "cluster": "cpu-local", "budgets": {"max_step_time_s": 10.0, "min_mfu": 0.0}}  # fmt: skip
STRATEGY = {"mesh": "dp=2", "templates": ["dp"], "annotations": ["w0=dp:R"],
            "options": {"lr": 0.01, "optimizer": "adamw",
                        "passes": {"dp_overlap": True}}}  # fmt: skip


def bases(ids: dict[str, Any]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """One or more valid bodies of each write operation, with the fixtures' `ids`."""
    return {
        ("post", "/api/tokens"): [{"name": "t", "expires_in_days": 30}],
        ("post", "/api/admin/users"): [{"name": "u", "team": "alpha", "is_admin": False}],
        ("post", "/api/models"): [
            {"name": "m", "preset": "mlp_demo", "overrides": {"hidden": 16}},
            {"name": "g", "graph": GRAPH},
        ],
        ("post", "/api/models/upload"): [GRAPH],
        ("post", "/api/models/import"): [{"config": LLAMA, "batch": 2, "seq": 8, "name": "i"}],
        ("post", "/api/strategies"): [{"name": "s", **STRATEGY}],
        ("put", "/api/strategies/{strategy_id}"): [STRATEGY],
        ("post", "/api/clusters"): [{"name": "lab", "spec": SPEC}],
        ("post", "/api/plans"): [
            {"model_id": ids["model"], "strategy_id": ids["strategy"], "cluster": "cpu-local"}
        ],
        ("post", "/api/plans/{plan_id}/review/requests"): [{"reviewers": ["ann"]}],
        ("post", "/api/plans/{plan_id}/review/decision"): [
            {"decision": "request_changes", "body": "why?"}
        ],
        ("post", "/api/plans/{plan_id}/comments"): [
            {"body": "b", "anchor": {"kind": "timeline", "start_s": 0.0, "end_s": 0.001}},
            {"body": "b", "thread_id": ids["thread"]},
        ],
        ("post", "/api/plans/{plan_id}/comments/{thread_id}/resolve"): [{"resolved": True}],
        ("post", "/api/baselines"): [{"plan_id": ids["plan"], "name": "b"}],
        ("post", "/api/verifications"): [{"plan_id": ids["plan"], "backend": "simulated"}],
        ("post", "/api/plans/{plan_id}/measurements"): [{"steps": 2, "device": "cpu"}],
        ("post", "/api/comparisons"): [{"plan_a_id": ids["plan"], "plan_b_id": ids["plan_b"]}],
        ("post", "/api/searches"): [{"model_id": ids["model"], "cluster": "cpu-local"}],
        ("post", "/api/searches/{search_id}/plans"): [{"candidate": 0}],
        ("post", "/api/checks"): [CHECK],
        ("put", "/api/admin/teams/{team}/limits"): [{"max_running_jobs": 2}],
    }


# -- the schema's fields ---------------------------------------------------------------------

Path = tuple[str | int, ...]


def _resolve(spec: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` with its `$ref` followed and a nullable `anyOf` reduced to its non-null."""
    while True:
        if "$ref" in schema:
            schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
        elif "anyOf" in schema:
            options = [s for s in schema["anyOf"] if s.get("type") != "null"]
            schema = options[0] if options else {}
        else:
            return schema


def fields(spec: dict[str, Any], schema: dict[str, Any], base: Any, path: Path = ()) -> Iterator[
    tuple[Path, bool]
]:  # fmt: skip
    """Every field path the schema declares under `path` (list items as index 0), with
    whether it is a string field; free-form objects: a new key and the first leaves of what
    the base holds there."""
    schema = _resolve(spec, schema)
    kind = schema.get("type")
    if kind == "object" and "properties" in schema:
        for name, sub in schema["properties"].items():
            here = base.get(name) if isinstance(base, dict) else None
            yield (*path, name), _resolve(spec, sub).get("type") == "string"
            yield from fields(spec, sub, here, (*path, name))
    elif kind == "array":
        item = base[0] if isinstance(base, list) and base else None
        yield (*path, 0), _resolve(spec, schema.get("items", {})).get("type") == "string"
        yield from fields(spec, schema.get("items", {}), item, (*path, 0))
    elif kind == "object" or (not kind and path and isinstance(base, dict)):
        yield (*path, "poisoned"), False
        yield from list(_leaves(base, path))[:FREE_LEAVES]


def _leaves(value: Any, path: Path) -> Iterator[tuple[Path, bool]]:
    """The leaves of free-form content, depth first (strings flagged)."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value[:2]):
            yield from _leaves(item, (*path, index))
    else:
        yield path, isinstance(value, str)


def put(body: Any, path: Path, value: Any) -> Any:
    """A copy of `body` with `value` at `path` (missing objects and list items made)."""
    out = copy.deepcopy(body)
    if not path:
        return value
    holder = out
    for part, following in itertools.pairwise(path):
        empty: Any = [] if isinstance(following, int) else {}
        if isinstance(holder, list):
            while len(holder) <= int(part):
                holder.append(copy.deepcopy(empty))
            holder = holder[int(part)]
        else:
            if not isinstance(holder.get(part), dict | list):
                holder[part] = empty
            holder = holder[part]
    last = path[-1]
    if isinstance(holder, list):
        while len(holder) <= int(last):
            holder.append(None)
    holder[last] = value
    return out


# -- the app and its fixtures ----------------------------------------------------------------


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """conftest's, with room for thousands of requests a minute and few queued jobs (each
    job the hostile names queue is run by the worker afterwards)."""
    return replace(settings, team_requests_per_minute=1_000_000, team_max_queued_jobs=12)


def _fixtures(
    app: FastAPI, user_client: Any, settings: Settings
) -> tuple[TestClient, dict[str, Any]]:
    """A service admin of team alpha (`root`) with two built plans, a thread and a member."""
    root: TestClient = user_client("alpha", "root", service_admin=True)
    user_client("alpha", "ann")
    model = root.post("/api/models", json={"name": "base", "preset": "mlp_demo"}).json()["id"]
    strategy = root.post("/api/strategies", json={"name": "base", **STRATEGY}).json()["id"]
    plans = [root.post("/api/plans", json={"model_id": model, "strategy_id": strategy,
                                            "cluster": "cpu-local"}).json()["id"]
             for _ in range(2)]  # fmt: skip
    assert run_jobs(settings) == 2
    thread = root.post(f"/api/plans/{plans[0]}/comments", json={"body": "t"}).json()["id"]
    ids = {"model": model, "strategy": strategy, "plan": plans[0], "plan_b": plans[1],
           "thread": thread, "team": "alpha"}  # fmt: skip
    return root, ids


def _url(path: str, ids: dict[str, Any]) -> str:
    names = {"strategy_id": ids["strategy"], "plan_id": ids["plan"], "thread_id": ids["thread"],
             "team": ids["team"], "search_id": 1}  # fmt: skip
    url = path.format(**names)
    return url + "?name=up" if path == "/api/models/upload" else url


def _send(client: TestClient, method: str, url: str, body: Any) -> Any:
    content = json.dumps(body).encode()  # surrogates escaped, NaN and Infinity as tokens
    headers = {"Content-Type": "application/json"}
    return client.request(method, url, content=content, headers=headers)


def _error_shaped(answer: Any) -> bool:
    body = answer.json()
    return set(body) == {"code", "message", "detail"} and isinstance(body["detail"], dict)


def _operations(spec: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """Every write with a JSON body: (method, path) -> its body schema."""
    out = {}
    for path, item in spec["paths"].items():
        for method, operation in item.items():
            content = operation.get("requestBody", {}).get("content", {})
            if method in ("post", "put", "patch") and content:
                schema = content.get("application/json", {}).get("schema", {"type": "object"})
                out[(method, path)] = schema
    return out


def test_every_write_refuses_poison_and_every_read_survives_hostile_names(
    app: FastAPI, user_client: Any, settings: Settings
) -> None:
    root, ids = _fixtures(app, user_client, settings)
    spec = app.openapi()
    operations = _operations(spec)
    table = bases(ids)
    assert set(table) == set(operations), "every write with a body has a base body here"
    limits = root.get("/api/admin/teams/alpha/limits").json()
    sent = 0
    for (method, path), schema in operations.items():
        url = _url(path, ids)
        before = row_counts(app)
        for base in table[(method, path)]:
            for field, _ in fields(spec, schema, base):
                for name, poison in POISONS.items():
                    answer = _send(root, method, url, put(base, field, poison))
                    sent += 1
                    where = (method, path, field, name, answer.text[:300])
                    assert 400 <= answer.status_code < 500 and _error_shaped(answer), where
        assert row_counts(app) == before, (method, path)
    assert root.get("/api/admin/teams/alpha/limits").json() == limits
    assert sent > 1000, sent

    serial = itertools.count()
    for (method, path), schema in operations.items():
        url = _url(path, ids)
        hostile = itertools.cycle(HOSTILE)  # one name a string field, every name in turn
        for base in table[(method, path)]:
            for field, is_string in fields(spec, schema, base):
                if not is_string:
                    continue
                name = f"{next(hostile)} {next(serial)}"  # unique: a name taken is a 409
                answer = _send(root, method, url, put(base, field, name))
                where = (method, path, field, name, answer.text[:300])
                assert answer.status_code < 500, where
                assert answer.status_code < 400 or _error_shaped(answer), where

    worker = Worker(settings, "survivor")
    try:
        worker.run_until_empty()  # what the hostile names queued: all to a final state
        with app.state.sessions() as session:
            open_jobs = session.scalars(select(Job).where(Job.status.in_(("queued", "running"))))
            assert list(open_jobs) == []
        _every_read_answers(app, root, spec)  # what the worker stored too
        plan = root.post("/api/plans", json={"model_id": ids["model"],
                                             "strategy_id": ids["strategy"]})  # fmt: skip
        assert plan.status_code == 202, plan.text
        assert worker.run_until_empty() == 1  # and the worker is still alive
    finally:
        worker.close()
    assert root.get(f"/api/plans/{plan.json()['id']}").json()["status"] == "succeeded"


#: a read's path parameter -> the table whose rows fill it
PATH_IDS: dict[str, Any] = {"model_id": Model, "strategy_id": Strategy, "plan_id": Plan,
                             "job_id": Job, "check_id": Check, "search_id": Search}  # fmt: skip


def _every_read_answers(app: FastAPI, root: TestClient, spec: dict[str, Any]) -> None:
    """Lists and each stored row's read: 200; every other read of each row: below 500."""
    with app.state.sessions() as session:
        rows = {name: list(session.scalars(select(table.id))) for name, table in PATH_IDS.items()}
        rows["name"] = list(session.scalars(select(Cluster.name)))  # a cluster's name
        rows["team"] = list(session.scalars(select(Team.name)))
    for path, item in spec["paths"].items():
        if "get" not in item or path in ("/api/auth/login",) or path.endswith("/events"):
            continue
        params = re.findall(r"\{(\w+)\}", path)
        if not params:
            answer = root.get(path)
            assert answer.status_code == 200, (path, answer.text[:300])
            continue
        if any(p not in rows for p in params) or len(params) > 1 or path == "/api/presets/{name}":
            continue  # a value, an op, a unit of a plan: read through the plan's own views
        for row in rows[params[0]]:
            answer = root.get(path.replace(f"{{{params[0]}}}", str(row)))
            where = (path, row, answer.text[:300])
            assert answer.status_code < 500, where
            if re.fullmatch(r"/api/\w+/\{\w+\}", path):
                assert answer.status_code == 200, where
