"""SQLite and PostgreSQL accept and refuse the same inputs (issue 19).

- Control characters (C0 and DEL) in any string of a JSON body (dict keys included, at any
  depth), in graph documents and uploads, in path and query parameters: 422 naming where;
  free text (a comment's body) may hold tab, newline and carriage return.
- Every request string fits its column (walked over `backend.orm` and the request schemas),
  meshes have at most 8 axes and 2^20 devices, dims at most 2^31 - 1 and values at most
  2^60 - 1 elements, a model's graph has ops.
- Request types are strict (`"4"` is no id); an int still does for a float.
- A JSON body nested too deeply is a clear 422.

Each refused request stores nothing: every table has as many rows after it as before.
"""

from __future__ import annotations

import copy
import json
import typing
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel
from sqlalchemy import Column, String

from backend.app import create_app
from backend.orm import Base
from backend.schemas.auth import TokenCreate, UserCreate
from backend.schemas.common import StrictRequest
from backend.schemas.jobs import (
    CheckCreate,
    CheckModel,
    CheckStrategy,
    MeasurementCreate,
    PlanCreate,
    SearchCreate,
    VerificationCreate,
    VerifyOn,
)
from backend.schemas.model_import import HfImportCreate
from backend.schemas.resources import ClusterCreate, ModelCreate, StrategyCreate, StrategyUpdate
from backend.schemas.reviews import Anchor, BaselineCreate, CommentCreate, DecisionCreate
from backend.settings import Settings
from shardlab.ir import MAX_DIM, MAX_ELEMENTS
from shardlab.mesh import MAX_MESH_AXES, MAX_MESH_DEVICES
from shardlab.user_json import MAX_JSON_DEPTH
from tests.api.conftest import assert_error
from tests.api.test_bad_requests import GRAPH, SPEC, Case, Ref, make, refs, row_counts, send

NUL = "\x00"
CONTROL = "control character"


def graph_with(path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    """GRAPH (mlp_demo) with the item at `path` set to `value`."""
    document = copy.deepcopy(GRAPH)
    holder: Any = document
    for part in path[:-1]:
        holder = holder[part]
    holder[path[-1]] = value
    return document


def nested(levels: int) -> Any:
    """`levels` objects, one inside the other: {"a": {"a": ... {} }}."""
    inner: Any = {}
    for _ in range(levels - 1):
        inner = {"a": inner}
    return inner


def raw(document: Any) -> bytes:
    return json.dumps(document).encode()


def deep_text(levels: int) -> str:
    """A JSON object nested `levels` deep, as text (too deep for Python's parser to build)."""
    return '{"a":' * (levels - 1) + "{}" + "}" * (levels - 1)


EMPTY_GRAPH = {**GRAPH, "ops": [], "values": [GRAPH["values"][0]], "outputs": []}
NINE_AXES = ",".join(f"a{i}=1" for i in range(MAX_MESH_AXES + 1))
#: 150,000 axes, a megabyte: SQLite would store it, PostgreSQL's varchar(200) would not
MEGA_MESH = ",".join(f"a{i}=1" for i in range(150_000))
CHECK = {"model": {"preset": "mlp_demo"}, "strategy": {"mesh": "dp=2"}, "cluster": "cpu-local"}
PLAN = {"model_id": Ref("model"), "strategy_id": Ref("strategy")}


def upload(name: str, content: bytes, status: int, code: str, named: str, **more: Any) -> Case:
    return Case(name, "POST", "/api/models/upload?name=up", status, code, named,
                content=content, **more)  # fmt: skip


CASES = [
    # -- control characters in JSON bodies, at any depth, keys included -----------------------
    Case("model-name-nul", "POST", "/api/models", 422, "invalid_request", "body.name: 'a\\x00b'",
         {"name": "a\x00b", "preset": "mlp_demo"}),
    Case("model-name-tab", "POST", "/api/models", 422, "invalid_request", "U+0009",
         {"name": "a\tb", "preset": "mlp_demo"}),
    Case("model-preset-del", "POST", "/api/models", 422, "invalid_request", "body.preset",
         {"name": "m", "preset": "mlp_demo\x7f"}),
    Case("override-key-nul", "POST", "/api/models", 422, "invalid_request",
         "body.overrides: the key 'hid\\x00den'",
         {"name": "m", "preset": "mlp_demo", "overrides": {"hid\x00den": 4}}),
    Case("override-value-nul", "POST", "/api/models", 422, "invalid_request",
         "body.overrides.dtype", {"name": "m", "preset": "mlp_demo",
                                  "overrides": {"dtype": "float32\x00"}}),
    Case("graph-op-name-nul", "POST", "/api/models", 422, "invalid_request",
         "body.graph.ops.0.name", {"name": "g", "graph": graph_with(("ops", 0, "name"), "y\x00")}),
    Case("graph-meta-key-nul", "POST", "/api/models", 422, "invalid_request",
         "body.graph.meta: the key", {"name": "g", "graph": graph_with(("meta",), {NUL: 1})}),
    Case("strategy-name-nul", "POST", "/api/strategies", 422, "invalid_request", "body.name",
         {"name": NUL, "mesh": "dp=2"}),
    Case("strategy-mesh-nul", "POST", "/api/strategies", 422, "invalid_request", "body.mesh",
         {"name": "s", "mesh": "dp=2\x00"}),
    Case("strategy-template-nul", "POST", "/api/strategies", 422, "invalid_request",
         "body.templates.0", {"name": "s", "mesh": "dp=2", "templates": ["dp\x00"]}),
    Case("strategy-option-key-nul", "POST", "/api/strategies", 422, "invalid_request",
         "body.options.passes: the key 'dp_overlap\\x00'",
         {"name": "s", "mesh": "dp=2", "options": {"passes": {"dp_overlap\x00": True}}}),
    Case("strategy-edit-mesh-nul", "PUT", "/api/strategies/{strategy}", 422, "invalid_request",
         "body.mesh", {"mesh": "dp=\x002"}),
    Case("cluster-spec-nul", "POST", "/api/clusters", 422, "invalid_request",
         "body.spec.description", {"name": "x", "spec": {**SPEC, "description": "a\x00"}}),
    Case("plan-cluster-nul", "POST", "/api/plans", 422, "invalid_request", "body.cluster",
         {**PLAN, "cluster": "a\x00b"}),
    Case("search-cluster-nul", "POST", "/api/searches", 422, "invalid_request", "body.cluster",
         {"model_id": Ref("model"), "cluster": "a\x00b"}),
    Case("check-mesh-nul", "POST", "/api/checks", 422, "invalid_request", "body.strategy.mesh",
         {**CHECK, "strategy": {"mesh": "dp=2\x00"}}),
    Case("check-override-key-nul", "POST", "/api/checks", 422, "invalid_request",
         "body.model.overrides: the key", {**CHECK, "model": {"preset": "mlp_demo",
                                                              "overrides": {NUL: 1}}}),
    # -- graph uploads ---------------------------------------------------------------------------
    upload("upload-op-name-nul", raw(graph_with(("ops", 0, "name"), "y\x00")), 422,
           "invalid_graph", "ops.0.name: 'y\\x00'", detail={"field": "ops.0.name"}),
    upload("upload-value-name-nul", raw(graph_with(("values", 0, "name"), "x\x00")), 422,
           "invalid_graph", "values.0.name", detail={"field": "values.0.name"}),
    # -- path and query parameters ---------------------------------------------------------------
    Case("upload-name-nul", "POST", "/api/models/upload?name=a%00b", 422, "invalid_request",
         "query.name: 'a\\x00b'", content=raw(GRAPH)),
    Case("cluster-get-nul", "GET", "/api/clusters/a%00b", 422, "invalid_request",
         "path.name: 'a\\x00b'"),
    Case("cluster-delete-nul", "DELETE", "/api/clusters/a%00b", 422, "invalid_request",
         "path.name"),
    Case("baselines-query-nul", "GET", "/api/baselines?cluster=a%00b", 422, "invalid_request",
         "query.cluster"),
    Case("unknown-query-name-control", "GET", "/api/models?x%01=1", 422, "invalid_request",
         "the parameter name 'x\\x01'"),
    # -- lengths and meshes ----------------------------------------------------------------------
    Case("strategy-mesh-over-column", "POST", "/api/strategies", 422, "invalid_request",
         "body.mesh: String should have at most 200 characters",
         {"name": "s", "mesh": "dp=2" + ",x=1" * 50}),
    Case("strategy-mesh-megabyte", "POST", "/api/strategies", 422, "invalid_request",
         "body.mesh: String should have at most 200 characters", {"name": "s", "mesh": MEGA_MESH}),
    Case("model-preset-over-column", "POST", "/api/models", 422, "invalid_request",
         "body.preset", {"name": "m", "preset": "p" * 101}),
    Case("strategy-mesh-nine-axes", "POST", "/api/strategies", 422, "invalid_mesh",
         "has 9 axes, more than the limit of 8", {"name": "s", "mesh": NINE_AXES},
         detail={"axes": 9, "limit": MAX_MESH_AXES}),
    Case("strategy-mesh-too-many-devices", "POST", "/api/strategies", 422, "invalid_mesh",
         f"has 1048577 devices, more than the limit of {MAX_MESH_DEVICES}",
         {"name": "s", "mesh": "dp=1048577"}, detail={"devices": MAX_MESH_DEVICES + 1}),
    Case("check-mesh-nine-axes", "POST", "/api/checks", 422, "invalid_mesh",
         "strategy: mesh 'a0=1", {**CHECK, "strategy": {"mesh": NINE_AXES}},
         detail={"axes": 9, "field": "strategy"}),
    # -- shapes ----------------------------------------------------------------------------------
    Case("graph-dim-2-62", "POST", "/api/models", 422, "invalid_graph",
         "value 'x' has dim 1 of size 4611686018427387904; dims must be at most 2147483647",
         {"name": "g", "graph": graph_with(("values", 0, "shape"), [16, 2**62])},
         detail={"value": "x", "dim": 1, "limit": MAX_DIM}),
    Case("graph-too-many-elements", "POST", "/api/models", 422, "invalid_graph",
         f"value 'x' of shape [{MAX_DIM}, {MAX_DIM}] has",
         {"name": "g", "graph": graph_with(("values", 0, "shape"), [MAX_DIM, MAX_DIM])},
         detail={"value": "x", "limit": MAX_ELEMENTS}),
    upload("upload-dim-2-62", raw(graph_with(("values", 0, "shape"), [2**62, 32])), 422,
           "invalid_graph", "dim 0 of size 4611686018427387904", detail={"dim": 0}),
    Case("override-hidden-2-62", "POST", "/api/models", 422, "invalid_override",
         "hidden must be at most 2147483647 (2^31 - 1), got 4611686018427387904",
         {"name": "m", "preset": "llama3-8b", "overrides": {"hidden": 2**62}},
         detail={"key": "hidden", "limit": MAX_DIM}),
    Case("override-values-too-large", "POST", "/api/models", 422, "invalid_override",
         "overrides of preset 'mlp_demo': value 'x'",
         {"name": "m", "preset": "mlp_demo", "overrides": {"batch": MAX_DIM, "hidden": MAX_DIM}},
         detail={"value": "x", "limit": MAX_ELEMENTS}),
    Case("check-override-hidden-2-62", "POST", "/api/checks", 422, "invalid_override",
         "model: hidden must be at most 2147483647",
         {**CHECK, "model": {"preset": "mlp_demo", "overrides": {"hidden": 2**62}}}),
    # -- graphs without ops ----------------------------------------------------------------------
    Case("graph-no-ops", "POST", "/api/models", 422, "invalid_graph", "graph 'mlp_demo' has no ops",
         {"name": "g", "graph": EMPTY_GRAPH}, detail={"field": "graph"}),
    upload("upload-no-ops", raw(EMPTY_GRAPH), 422, "invalid_graph", "has no ops",
           detail={"field": "graph"}),
    Case("check-graph-no-ops", "POST", "/api/checks", 422, "invalid_graph", "graph: graph",
         {"graph": EMPTY_GRAPH, "strategy": {"mesh": "dp=2"}, "cluster": "cpu-local"},
         detail={"field": "graph"}),
    # -- strict types ----------------------------------------------------------------------------
    Case("plan-model-id-string", "POST", "/api/plans", 422, "invalid_request",
         "body.model_id: Input should be a valid integer",
         {"model_id": "4", "strategy_id": Ref("strategy")}),
    Case("plan-strategy-id-float", "POST", "/api/plans", 422, "invalid_request",
         "body.strategy_id: Input should be a valid integer",
         {"model_id": Ref("model"), "strategy_id": 1.0}),
    Case("verify-plan-id-string", "POST", "/api/verifications", 422, "invalid_request",
         "body.plan_id", {"plan_id": "1"}),
    Case("search-gpus-string", "POST", "/api/searches", 422, "invalid_request", "body.gpus",
         {"model_id": Ref("model"), "cluster": "cpu-local", "gpus": "2"}),
    Case("check-verify-string", "POST", "/api/checks", 422, "invalid_request",
         "body.budgets.verify: Input should be a valid boolean",
         {**CHECK, "budgets": {"verify": "true"}}),
    # -- nesting ---------------------------------------------------------------------------------
    Case("body-nested-past-the-limit", "POST", "/api/strategies", 422, "invalid_request",
         f"body: the JSON body is nested too deeply (more than {MAX_JSON_DEPTH} levels)",
         {"name": "s", "mesh": "dp=2", "options": nested(MAX_JSON_DEPTH)}),  # 1 + 64 levels
    Case("body-nested-past-the-parser", "POST", "/api/strategies", 422, "invalid_request",
         f"body: the JSON body is nested too deeply (more than {MAX_JSON_DEPTH} levels)",
         content=deep_text(100_000).encode()),
    upload("upload-nested-past-the-limit", raw(graph_with(("meta",), nested(MAX_JSON_DEPTH))), 422,
           "invalid_graph", f"nested too deeply (more than {MAX_JSON_DEPTH} levels)"),
    upload("upload-nested-past-the-parser", deep_text(100_000).encode(), 422, "invalid_graph",
           f"the upload's JSON is nested too deeply (more than {MAX_JSON_DEPTH} levels)"),
]  # fmt: skip


def test_the_cases_are_named_uniquely() -> None:
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_refused_alike_and_nothing_stored(case: Case, client: TestClient, app: FastAPI) -> None:
    ids: dict[str, Any] = {}
    for name in refs(case):
        make(client, name, ids)
    before = row_counts(app)
    body = assert_error(send(client, case, ids), case.status, case.code, case.named)
    for key, value in case.detail.items():
        assert body["detail"].get(key) == value, (key, body["detail"])
    assert row_counts(app) == before


def test_a_body_at_the_nesting_limit_reaches_the_engine(client: TestClient) -> None:
    # the body's own object, options, then 62 more: 64 levels in all
    options = nested(MAX_JSON_DEPTH - 1)
    answer = client.post("/api/strategies", json={"name": "s", "mesh": "dp=2", "options": options})
    assert_error(answer, 422, "invalid_strategy", "unknown strategy option 'a'")


def test_comments_may_hold_tabs_and_newlines_but_no_other_control(
    user_client: Any, app: FastAPI
) -> None:
    ann = user_client("alpha", "ann")
    ids: dict[str, Any] = {}
    make(ann, "plan", ids)
    path = f"/api/plans/{ids['plan']}/comments"
    made = ann.post(path, json={"body": "first line\n\tindented\r\nlast"})
    assert made.status_code == 201, made.text
    assert made.json()["comments"][0]["body"] == "first line\n\tindented\r\nlast"
    before = row_counts(app)
    for bad in ("a\x00b", "bell\x07", "del\x7f"):
        assert_error(ann.post(path, json={"body": bad}), 422, "invalid_request", "body.body")
    anchored = {"body": "ok", "anchor": {"kind": "op", "name": "y\tz"}}
    assert_error(ann.post(path, json=anchored), 422, "invalid_request", "body.anchor.name")
    decision = {"decision": "request_changes", "body": "a\x00"}
    review = f"/api/plans/{ids['plan']}/review/decision"
    assert_error(ann.post(review, json=decision), 422, "invalid_request", "body.body")
    assert row_counts(app) == before


def test_ints_still_do_for_float_fields(client: TestClient) -> None:
    budgets = {"max_step_time_s": 10, "min_mfu": 0, "max_regression_pct": None}
    made = client.post("/api/checks", json={**CHECK, "budgets": budgets})
    assert made.status_code == 202, made.text
    stored = client.get(f"/api/checks/{made.json()['id']}").json()["budgets"]
    assert (stored["max_step_time_s"], stored["min_mfu"]) == (10.0, 0.0)


def test_a_mesh_at_the_limits_is_accepted(client: TestClient) -> None:
    eight = ",".join(f"a{i}=1" for i in range(MAX_MESH_AXES - 1)) + ",dp=2"
    made = client.post("/api/strategies", json={"name": "eight", "mesh": eight})
    assert made.status_code == 201, made.text
    assert made.json()["mesh"] == eight


# -- what the schemas declare, against the tables -------------------------------------------

#: Request string fields stored in (or compared with) a String column: the field's
#: max_length must be at most the column's length, or PostgreSQL refuses what SQLite stores.
STORED: dict[tuple[type[BaseModel], str], str] = {
    (ModelCreate, "name"): "models.name",
    (ModelCreate, "preset"): "models.preset",
    (HfImportCreate, "name"): "models.name",
    (CheckModel, "preset"): "models.preset",
    (StrategyCreate, "name"): "strategies.name",
    (StrategyCreate, "mesh"): "strategies.mesh",
    (StrategyUpdate, "mesh"): "strategies.mesh",
    (CheckStrategy, "name"): "strategies.name",
    (CheckStrategy, "mesh"): "strategies.mesh",
    (ClusterCreate, "name"): "clusters.name",
    (PlanCreate, "cluster"): "plans.cluster",
    (CheckCreate, "cluster"): "plans.cluster",
    (SearchCreate, "cluster"): "searches.cluster",
    (VerificationCreate, "compute_dtype"): "verifications.compute_dtype",
    (VerificationCreate, "device"): "jobs.requires_device",
    (VerifyOn, "device"): "jobs.requires_device",
    (MeasurementCreate, "device"): "jobs.requires_device",
    (BaselineCreate, "name"): "baselines.name",
    (CheckCreate, "baseline"): "baselines.name",
    (TokenCreate, "name"): "api_tokens.name",
    (UserCreate, "name"): "users.name",
    (UserCreate, "team"): "teams.name",
}
#: Request string fields kept elsewhere: Text or JSON columns, or mapped to a state.
ELSEWHERE: dict[tuple[type[BaseModel], str], str] = {
    (Anchor, "kind"): "review_comments.anchor (JSON)",
    (Anchor, "name"): "review_comments.anchor (JSON)",
    (DecisionCreate, "decision"): "review_requests.state, as approved or changes_requested",
    (CommentCreate, "body"): "review_comments.body (Text)",
    (DecisionCreate, "body"): "review_comments.body (Text)",
    (VerificationCreate, "backend"): "jobs.payload (JSON)",
    (VerifyOn, "backend"): "jobs.payload (JSON)",
}
#: Query parameters stored in a String column (the others only filter).
STORED_PARAMS = {("/api/models/upload", "name"): "models.name"}
#: Bounded String columns no request field writes: what the service derives, hashes, states.
DERIVED = {
    "api_tokens.token_hash", "api_tokens.prefix", "browser_sessions.session_hash",
    "login_links.link_hash", "models.source", "jobs.kind", "jobs.status", "jobs.worker_id",
    "plans.review_state", "artifacts.owner", "artifacts.kind", "review_requests.state",
    "review_events.kind", "baselines.cluster", "idempotency_keys.route",
    "idempotency_keys.request_hash", "workers.id", "workers.engine",
    # the Idempotency-Key header, at most as long as the column (backend.idempotency)
    "idempotency_keys.key",
}  # fmt: skip


def _request_models() -> list[type[StrictRequest]]:
    """Every request body model with fields (subclasses of StrictRequest)."""
    found: list[type[StrictRequest]] = []
    todo = list(StrictRequest.__subclasses__())
    while todo:
        model = todo.pop()
        todo.extend(model.__subclasses__())
        if model.model_fields:
            found.append(model)
    return found


def _longest(annotation: Any) -> int | None:
    """The longest string a str or Literal (or optional one) annotation lets through: None
    for an unbounded str (max_length decides), 0 for no string at all."""
    if annotation is str:
        return None
    if typing.get_origin(annotation) is typing.Literal:
        return max(len(v) for v in typing.get_args(annotation) if isinstance(v, str))
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, type(str | None)) and str in args:
        return None
    return 0


def _string_fields(model: type[BaseModel]) -> dict[str, int | None]:
    """Fields holding one string, with their most characters (None: unbounded)."""
    out: dict[str, int | None] = {}
    for name, field in model.model_fields.items():
        longest = _longest(field.annotation)
        if longest == 0:
            continue
        lengths = [m.max_length for m in field.metadata if hasattr(m, "max_length")]
        out[name] = longest if longest is not None else min(lengths, default=None)
    return out


def _column(name: str) -> Column[Any]:
    """The column `table.column` of backend.orm."""
    table, column = name.split(".")
    found: Column[Any] = Base.metadata.tables[table].c[column]
    return found


def _openapi(tmp_path: Path) -> dict[str, Any]:
    """The service's OpenAPI document (the app's database is never opened)."""
    env = {
        "SHARDLAB_DATA_DIR": str(tmp_path),
        "SHARDLAB_DATABASE_URL": f"sqlite:///{tmp_path}/u.db",
    }
    app = create_app(Settings.from_env(env))
    try:
        spec: dict[str, Any] = app.openapi()
        return spec
    finally:
        app.state.engine.dispose()


def test_every_request_body_is_a_strict_request(tmp_path: Path) -> None:
    names = {model.__name__ for model in _request_models()}
    bodies = [
        (path, op["requestBody"]["content"]["application/json"]["schema"])
        for path, item in _openapi(tmp_path)["paths"].items()
        for op in item.values()
        if isinstance(op, dict) and "requestBody" in op
    ]
    assert len(bodies) >= 15
    for path, schema in bodies:
        if path != "/api/models/upload":  # the raw graph file: the engine checks it
            assert schema["$ref"].rsplit("/", 1)[1] in names, path


def test_request_strings_fit_their_columns() -> None:
    models = _request_models()
    assert {ModelCreate, CheckCreate, CommentCreate, TokenCreate} <= set(models)
    for model in models:
        for name, longest in _string_fields(model).items():
            where = (model, name)
            assert where in STORED or where in ELSEWHERE, f"{model.__name__}.{name}: where?"
            if where in STORED:
                column = _column(STORED[where])
                assert isinstance(column.type, String), column
                assert longest is not None, f"{model.__name__}.{name} has no max_length"
                assert longest <= column.type.length, (model.__name__, name, column)


def test_stored_query_strings_fit_their_columns(tmp_path: Path) -> None:
    paths = _openapi(tmp_path)["paths"]
    for (path, param), column in STORED_PARAMS.items():
        (spec,) = [p for op in paths[path].values() for p in op["parameters"]
                   if p["name"] == param]  # fmt: skip
        assert spec["schema"]["maxLength"] <= _column(column).type.length == 200


def test_every_string_column_is_written_by_a_bounded_field_or_derived() -> None:
    columns = {
        f"{table.name}.{column.name}": column
        for table in Base.metadata.sorted_tables
        for column in table.columns
        if isinstance(column.type, String) and column.type.length is not None  # not Text
    }
    written = {*STORED.values(), *STORED_PARAMS.values()}
    assert written.isdisjoint(DERIVED)
    assert set(columns) == written | DERIVED
