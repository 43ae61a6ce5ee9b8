"""A corpus of bad requests, on SQLite and PostgreSQL.

Each case is refused with its 4xx status and a `{code, message, detail}` body whose message
(and, where given, detail) names the culprit: the field, value, dim, mesh axis or line. And
each stores nothing: every table of `backend.orm` has as many rows after it as before.

What a case needs first (a model, strategies, a plan, a cancelled job, a team cluster) is
created through the API before the rows are counted; `Ref("model")` in a body and `{model}`
in a path stand for its id, `needs` names what must merely exist.
"""

from __future__ import annotations

import copy
import json
import string
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from backend.orm import Base
from backend.settings import Settings
from shardlab.cost.clusters import load_cluster
from shardlab.graph_json import graph_to_json
from shardlab.models import build_model
from tests.api.test_plans import run_jobs

#: Request and graph limits of these tests (the defaults are far larger).
MAX_BYTES = 65_536
MAX_OPS = 40


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """conftest's settings with small request and graph limits, for the 413 cases."""
    return replace(settings, max_request_bytes=MAX_BYTES, max_graph_ops=MAX_OPS)


# -- the raw material -----------------------------------------------------------------------

#: mlp_demo: x [16, 32] -> y = x @ w0 [32, 32] -> z = y @ w1 [32, 8] -> loss (3 ops)
GRAPH = graph_to_json(build_model("mlp_demo"))
#: llama3-8b with these overrides: 45 ops, over MAX_OPS
SMALL = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 64}
SPEC = load_cluster("h100-sxm-1x8").to_json()


def graph_with(change: Any) -> dict[str, Any]:
    """GRAPH with `change(document)` applied to a deep copy."""
    document = copy.deepcopy(GRAPH)
    change(document)
    return document


def _set(obj: Any, key: Any, value: Any) -> None:
    obj[key] = value


NO_OPS = {k: v for k, v in GRAPH.items() if k != "ops"}
GHOST_INPUT = graph_with(lambda g: _set(g["ops"][1], "inputs", ["ghost", "w1"]))
CYCLE = graph_with(lambda g: _set(g["ops"][0], "inputs", ["z", "w0"]))
DUPLICATE = graph_with(lambda g: g["values"].append(dict(g["values"][4])))
BAD_DTYPE = graph_with(lambda g: _set(g["values"][2], "dtype", "float13"))
BAD_KIND = graph_with(lambda g: _set(g["ops"][0], "kind", "frobnicate"))

#: the upload with a syntax error on line BROKEN_LINE
BROKEN_TEXT = json.dumps(GRAPH, indent=1).replace('"ops"', '"ops" :: ')
BROKEN_LINE = BROKEN_TEXT[: BROKEN_TEXT.index("::")].count("\n") + 1
#: an upload over MAX_BYTES: valid JSON, padded with blanks
HUGE_TEXT = json.dumps(GRAPH) + " " * MAX_BYTES

BAD_BANDWIDTH = copy.deepcopy(SPEC)
BAD_BANDWIDTH["inter_node"]["bandwidth"] = -1
MISSING = 999_999


@dataclass(frozen=True)
class Ref:
    """In a case's body: the id of the resource `name` (see RESOURCES)."""

    name: str


#: What cases refer to: where to POST what to create it (Refs: what it needs first). Besides
#: these, `cancelled_job` is the job of `plan`, cancelled.
RESOURCES: dict[str, tuple[str, dict[str, Any]]] = {
    "model": ("/api/models", {"name": "mlp", "preset": "mlp_demo"}),
    "strategy": ("/api/strategies", {"name": "dp2", "mesh": "dp=2", "templates": ["dp"]}),
    # 4 devices: more than cpu-local's 2
    "wide": ("/api/strategies", {"name": "wide", "mesh": "dp=2,tp=2", "templates": ["dp"]}),
    # w1 is [32, 8]: it has no dim 2 (uneven splits, even empty blocks, are fine: DTensor's)
    "out_of_range": (
        "/api/strategies",
        {"name": "out-of-range", "mesh": "tp=16", "annotations": ["w1=tp:S(2)"]},
    ),
    # mlp_demo has no layers: the annotation matches no value, serial or training
    "ghost": (
        "/api/strategies",
        {"name": "ghost", "mesh": "dp=2", "annotations": ["layers.*.weight=dp:S(0)"]},
    ),
    # w1.exp_avg (AdamW's state of w1, in the training graph only) is [32, 8]
    "out_of_range_state": (
        "/api/strategies",
        {"name": "out-of-range-state", "mesh": "tp=16", "annotations": ["w1.exp_avg=tp:S(2)"]},
    ),
    # the dp template shards the batch of x [16, 16]: 16 does not divide over 32 ranks
    "uneven_template": (
        "/api/strategies",
        {"name": "uneven-template", "mesh": "dp=32", "templates": ["dp"]},
    ),
    "plan": ("/api/plans", {"model_id": Ref("model"), "strategy_id": Ref("strategy")}),
    "cluster": ("/api/clusters", {"name": "lab", "spec": SPEC}),
}


@dataclass(frozen=True)
class Case:
    """One bad request and how it must be answered."""

    id: str
    method: str
    path: str
    status: int
    code: str
    named: str  # a substring of the message that names the culprit
    body: Any = None  # JSON body
    content: bytes | None = None  # raw upload body instead (Content-Type application/json)
    chunked: bool = False  # send `content` without a Content-Length
    headers: dict[str, str] = field(default_factory=dict)
    detail: dict[str, Any] = field(default_factory=dict)  # detail entries it must hold
    needs: tuple[str, ...] = ()  # resources that must exist (beyond those it refers to)


def upload(name: str, content: bytes, status: int, code: str, named: str, **more: Any) -> Case:
    """A case that uploads `content` as a graph file."""
    path = "/api/models/upload?name=up"
    return Case(name, "POST", path, status, code, named, content=content, **more)


CASES = [
    # -- models: graph JSON --------------------------------------------------------------------
    Case("graph-missing-field", "POST", "/api/models", 422, "invalid_graph", "'ops'",
         {"name": "g", "graph": NO_OPS}, detail={"field": "ops"}),
    Case("graph-op-reads-unknown-value", "POST", "/api/models", 422, "invalid_graph", "'ghost'",
         {"name": "g", "graph": GHOST_INPUT}, detail={"op": "z", "value": "ghost"}),
    Case("graph-cycle", "POST", "/api/models", 422, "invalid_graph", "cycle: y -> z -> y",
         {"name": "g", "graph": CYCLE}),
    Case("graph-duplicate-value", "POST", "/api/models", 422, "invalid_graph", "'y'",
         {"name": "g", "graph": DUPLICATE}, detail={"value": "y"}),
    Case("graph-unknown-dtype", "POST", "/api/models", 422, "invalid_graph", "'float13'",
         {"name": "g", "graph": BAD_DTYPE}, detail={"value": "w0"}),
    Case("graph-unknown-op-kind", "POST", "/api/models", 422, "invalid_graph", "'frobnicate'",
         {"name": "g", "graph": BAD_KIND}, detail={"op": "y"}),
    Case("graph-over-op-limit", "POST", "/api/models", 413, "graph_too_large", "45 ops",
         {"name": "big", "graph": graph_to_json(build_model("llama3-8b", SMALL))},
         detail={"ops": 45, "limit": MAX_OPS}),
    Case("graph-and-preset", "POST", "/api/models", 422, "invalid_request", "exactly one",
         {"name": "g", "preset": "mlp_demo", "graph": GRAPH}),
    # -- models: raw uploads ---------------------------------------------------------------------
    upload("upload-not-json", b"shardlab graph, trust me", 422, "invalid_graph", "line 1",
           detail={"line": 1, "column": 1}),
    upload("upload-bad-line", BROKEN_TEXT.encode(), 422, "invalid_graph", f"line {BROKEN_LINE}",
           detail={"line": BROKEN_LINE}),
    upload("upload-not-utf8", b'{"name": "\xff"}', 422, "invalid_graph", "UTF-8"),
    upload("upload-not-an-object", b"[1, 2]", 422, "invalid_graph", "an array"),
    upload("upload-too-large", HUGE_TEXT.encode(), 413, "request_too_large", str(MAX_BYTES),
           detail={"limit_bytes": MAX_BYTES, "declared": True}),
    upload("upload-too-large-streamed", HUGE_TEXT.encode(), 413, "request_too_large",
           str(MAX_BYTES), chunked=True, detail={"limit_bytes": MAX_BYTES, "declared": False}),
    upload("upload-wrong-media-type", json.dumps(GRAPH).encode(), 415,
           "unsupported_media_type", "text/csv", headers={"Content-Type": "text/csv"}),
    Case("upload-without-name", "POST", "/api/models/upload", 422, "invalid_request",
         "query.name", content=json.dumps(GRAPH).encode()),
    # -- models: presets and overrides -----------------------------------------------------------
    Case("unknown-preset", "POST", "/api/models", 404, "invalid_preset", "'llama9'",
         {"name": "m", "preset": "llama9"}, detail={"preset": "llama9"}),
    Case("unknown-override-key", "POST", "/api/models", 422, "invalid_override", "depth",
         {"name": "m", "preset": "llama3-8b", "overrides": {"depth": 3}}, detail={"key": "depth"}),
    Case("override-heads-not-dividing-hidden", "POST", "/api/models", 422, "invalid_override",
         "hidden (64) must be divisible by heads (5)",
         {"name": "m", "preset": "llama3-8b", "overrides": {**SMALL, "heads": 5}}),
    Case("override-wrong-type", "POST", "/api/models", 422, "invalid_override", "'lots'",
         {"name": "m", "preset": "mlp_demo", "overrides": {"hidden": "lots"}},
         detail={"key": "hidden"}),
    Case("preset-over-op-limit", "POST", "/api/models", 413, "graph_too_large", "45 ops",
         {"name": "big", "preset": "llama3-8b", "overrides": SMALL}, detail={"ops": 45}),
    Case("model-unknown-field", "POST", "/api/models", 422, "invalid_request", "colour",
         {"name": "m", "preset": "mlp_demo", "colour": "red"}),
    Case("model-duplicate-name", "POST", "/api/models", 409, "conflict", "'mlp'",
         {"name": "mlp", "preset": "mlp_demo"}, needs=("model",)),
    Case("model-id-zero", "GET", "/api/models/0", 422, "invalid_request", "path.model_id"),
    Case("model-id-huge", "GET", "/api/models/4294967296", 422, "invalid_request",
         "path.model_id"),
    Case("model-missing", "DELETE", f"/api/models/{MISSING}", 404, "not_found",
         f"model {MISSING}"),
    # -- strategies ------------------------------------------------------------------------------
    Case("strategy-unknown-template", "POST", "/api/strategies", 422, "invalid_strategy",
         "'pipeline_magic'", {"name": "s", "mesh": "dp=2", "templates": ["pipeline_magic"]},
         detail={"template": "pipeline_magic"}),
    Case("strategy-template-unknown-axis", "POST", "/api/strategies", 422, "invalid_strategy",
         "'tp'", {"name": "s", "mesh": "dp=2", "templates": ["megatron_tp:tp"]},
         detail={"axis": "tp"}),
    Case("mesh-malformed", "POST", "/api/strategies", 422, "invalid_mesh", "'dp2'",
         {"name": "s", "mesh": "dp2,tp=2"}, detail={"token": "dp2"}),
    Case("mesh-axis-size-zero", "POST", "/api/strategies", 422, "invalid_mesh", "'dp' has size 0",
         {"name": "s", "mesh": "dp=0,tp=2"}, detail={"axis": "dp"}),
    Case("mesh-duplicate-axis", "POST", "/api/strategies", 422, "invalid_mesh", "'dp'",
         {"name": "s", "mesh": "dp=2,dp=4"}, detail={"axis": "dp"}),
    Case("mesh-too-many-devices", "POST", "/api/strategies", 422, "invalid_mesh",
         "has 10000000000 devices, more than the limit of 1048576",
         {"name": "s", "mesh": "dp=100000,tp=100000"},
         detail={"devices": 10**10, "limit": 1 << 20}),
    Case("annotation-unknown-mesh-axis", "POST", "/api/strategies", 422, "invalid_mesh", "'sp'",
         {"name": "s", "mesh": "dp=2", "annotations": ["w0=sp:S(0)"]}, detail={"axis": "sp"}),
    Case("annotation-bad-placement", "POST", "/api/strategies", 422, "invalid_placement",
         "'X(0)'", {"name": "s", "mesh": "dp=2", "annotations": ["w0=dp:X(0)"]}),
    Case("strategy-unknown-pass", "POST", "/api/strategies", 422, "invalid_pass", "'dp_turbo'",
         {"name": "s", "mesh": "dp=2", "options": {"passes": {"dp_turbo": True}}}),
    Case("strategy-unknown-option", "POST", "/api/strategies", 422, "invalid_strategy",
         "unknown strategy option 'optimiser'",
         {"name": "s", "mesh": "dp=2", "options": {"optimiser": "sgd"}},
         detail={"option": "optimiser"}),
    Case("strategy-unknown-optimizer", "POST", "/api/strategies", 422, "invalid_strategy",
         "got 'adam'", {"name": "s", "mesh": "dp=2", "options": {"optimizer": "adam"}},
         detail={"option": "optimizer"}),
    Case("strategy-negative-lr", "POST", "/api/strategies", 422, "invalid_strategy",
         "option 'lr' must be a positive number, got -0.1",
         {"name": "s", "mesh": "dp=2", "options": {"lr": -0.1}}, detail={"option": "lr"}),
    Case("strategy-unknown-field", "POST", "/api/strategies", 422, "invalid_request",
         "mesh_shape", {"name": "s", "mesh": "dp=2", "mesh_shape": [2]}),
    Case("strategy-duplicate-name", "POST", "/api/strategies", 409, "conflict", "'dp2'",
         {"name": "dp2", "mesh": "dp=4"}, needs=("strategy",)),
    Case("strategy-edit-missing", "PUT", f"/api/strategies/{MISSING}", 404, "not_found",
         f"strategy {MISSING}", {"mesh": "dp=2"}),
    Case("strategy-edit-bad-mesh", "PUT", "/api/strategies/{strategy}", 422, "invalid_mesh",
         "'dp' has size 0", {"mesh": "dp=0"}),
    # -- clusters --------------------------------------------------------------------------------
    Case("cluster-negative-bandwidth", "POST", "/api/clusters", 422, "invalid_cluster",
         "inter_node.bandwidth", {"name": "x", "spec": BAD_BANDWIDTH},
         detail={"field": "inter_node.bandwidth"}),
    Case("cluster-missing-field", "POST", "/api/clusters", 422, "invalid_cluster", "'hbm_bytes'",
         {"name": "x", "spec": {k: v for k, v in SPEC.items() if k != "hbm_bytes"}},
         detail={"field": "hbm_bytes"}),
    Case("cluster-duplicate-name", "POST", "/api/clusters", 409, "conflict", "'lab'",
         {"name": "lab", "spec": SPEC}, needs=("cluster",)),
    Case("cluster-preset-name", "POST", "/api/clusters", 409, "conflict", "'h100-sxm-8x8'",
         {"name": "h100-sxm-8x8", "spec": SPEC}),
    Case("cluster-unknown", "GET", "/api/clusters/nowhere", 404, "not_found", "'nowhere'"),
    Case("cluster-unknown-field", "POST", "/api/clusters", 422, "invalid_request", "devices",
         {"name": "x", "spec": SPEC, "devices": 8}),
    # -- plans -----------------------------------------------------------------------------------
    Case("plan-missing-model", "POST", "/api/plans", 404, "not_found", f"model {MISSING}",
         {"model_id": MISSING, "strategy_id": Ref("strategy")}, detail={"resource": "model"}),
    Case("plan-missing-strategy", "POST", "/api/plans", 404, "not_found", f"strategy {MISSING}",
         {"model_id": Ref("model"), "strategy_id": MISSING}, detail={"resource": "strategy"}),
    Case("plan-unknown-cluster", "POST", "/api/plans", 404, "not_found", "'nowhere'",
         {"model_id": Ref("model"), "strategy_id": Ref("strategy"), "cluster": "nowhere"}),
    Case("plan-mesh-larger-than-cluster", "POST", "/api/plans", 422, "invalid_cluster",
         "mesh dp=2,tp=2 has 4 devices but cluster 'cpu-local' has 2",
         {"model_id": Ref("model"), "strategy_id": Ref("wide"), "cluster": "cpu-local"},
         detail={"cluster": "cpu-local"}),
    Case("plan-placement-dim-out-of-range", "POST", "/api/plans", 422, "invalid_placement",
         "S(2) on mesh axis 'tp' is out of range for 'w1' of rank 2",
         {"model_id": Ref("model"), "strategy_id": Ref("out_of_range")},
         detail={"dim": 2, "axis": "tp"}),
    Case("plan-state-placement-dim-out-of-range", "POST", "/api/plans", 422,
         "invalid_placement", "S(2) on mesh axis 'tp' is out of range for 'w1.exp_avg' of rank 2",
         {"model_id": Ref("model"), "strategy_id": Ref("out_of_range_state")},
         detail={"dim": 2, "axis": "tp"}),
    Case("plan-template-batch-not-divisible", "POST", "/api/plans", 422, "invalid_strategy",
         "template dp: input 'x' has a batch of 16, which does not divide over the 32 ranks of "
         "mesh axis 'dp'",
         {"model_id": Ref("model"), "strategy_id": Ref("uneven_template")},
         detail={"value": "x", "batch": 16, "axis": "dp"}),
    Case("strategy-microbatches-on-a-pipeline", "POST", "/api/strategies", 422,
         "invalid_strategy", "option 'microbatches' accumulates gradients on a mesh without a "
         "'pp' axis; mesh pp=2,dp=4 pipelines",
         {"name": "m", "mesh": "pp=2,dp=4", "options": {"microbatches": 4}},
         detail={"option": "microbatches"}),
    Case("strategy-microbatches-not-positive", "POST", "/api/strategies", 422,
         "invalid_strategy", "option 'microbatches' must be a positive integer, got 0",
         {"name": "m", "mesh": "dp=4", "options": {"microbatches": 0}},
         detail={"option": "microbatches"}),
    Case("strategy-megatron-without-a-tp-axis", "POST", "/api/strategies", 422,
         "invalid_strategy", "the mesh's only axis 'dp' is data parallelism's",
         {"name": "m", "mesh": "dp=8", "templates": ["megatron_tp"]},
         detail={"template": "megatron_tp", "axis": "dp"}),
    Case("plan-annotation-matches-no-value", "POST", "/api/plans", 422, "invalid_strategy",
         "'layers.*.weight=dp:S(0)' matches no value",
         {"model_id": Ref("model"), "strategy_id": Ref("ghost")}),
    Case("plan-unknown-field", "POST", "/api/plans", 422, "invalid_request", "colour",
         {"model_id": Ref("model"), "strategy_id": Ref("strategy"), "colour": "red"}),
    Case("plan-model-id-zero", "POST", "/api/plans", 422, "invalid_request", "body.model_id",
         {"model_id": 0, "strategy_id": Ref("strategy")}),
    Case("plan-id-zero", "GET", "/api/plans/0", 422, "invalid_request", "path.plan_id"),
    Case("plan-id-huge", "GET", "/api/plans/99999999999999999999", 422, "invalid_request",
         "path.plan_id"),
    Case("plan-not-built", "GET", "/api/plans/{plan}/program", 409, "not_ready", "queued",
         detail={"job_status": "queued"}),
    # -- comparisons, verifications, jobs --------------------------------------------------------
    Case("compare-plan-with-itself", "POST", "/api/comparisons", 422, "invalid_comparison",
         "plan_a_id and plan_b_id", {"plan_a_id": Ref("plan"), "plan_b_id": Ref("plan")},
         detail={"field": "plan_b_id"}),
    Case("compare-missing-plan", "POST", "/api/comparisons", 404, "not_found",
         f"plan {MISSING}", {"plan_a_id": Ref("plan"), "plan_b_id": MISSING}),
    Case("verify-missing-plan", "POST", "/api/verifications", 404, "not_found",
         f"plan {MISSING}", {"plan_id": MISSING}, detail={"resource": "plan", "id": MISSING}),
    Case("verify-bad-dtype", "POST", "/api/verifications", 422, "invalid_request",
         "body.compute_dtype", {"plan_id": Ref("plan"), "compute_dtype": "int8"}),
    Case("job-cancel-id-zero", "POST", "/api/jobs/0/cancel", 422, "invalid_request",
         "path.job_id"),
    Case("job-cancel-id-not-a-number", "POST", "/api/jobs/first/cancel", 422, "invalid_request",
         "path.job_id"),
    Case("job-cancel-missing", "POST", f"/api/jobs/{MISSING}/cancel", 404, "not_found",
         f"job {MISSING}"),
    Case("job-cancel-finished", "POST", "/api/jobs/{cancelled_job}/cancel", 409, "job_finished",
         "already cancelled", detail={"job_status": "cancelled"}),
]  # fmt: skip


# -- running a case -------------------------------------------------------------------------


def body_refs(obj: Any) -> list[str]:
    """The resources a JSON body refers to."""
    if isinstance(obj, Ref):
        return [obj.name]
    if isinstance(obj, dict):
        return [name for v in obj.values() for name in body_refs(v)]
    return []


def refs(case: Case) -> list[str]:
    """The resources a case needs, in its path and body."""
    in_path = [f for _, f, _, _ in string.Formatter().parse(case.path) if f]
    return [*case.needs, *in_path, *body_refs(case.body)]


def resolve(obj: Any, ids: dict[str, Any]) -> Any:
    """`obj` with every Ref replaced by its id."""
    if isinstance(obj, Ref):
        return ids[obj.name]
    if isinstance(obj, dict):
        return {k: resolve(v, ids) for k, v in obj.items()}
    return obj


def make(client: TestClient, name: str, ids: dict[str, Any]) -> None:
    """Create resource `name` (and what it needs) through the API; its id goes to `ids`."""
    if name in ids:
        return
    if name == "cancelled_job":
        make(client, "plan", ids)
        job = client.get(f"/api/plans/{ids['plan']}").json()["job_id"]
        answer = client.post(f"/api/jobs/{job}/cancel")
        assert answer.json()["status"] == "cancelled", answer.text
        ids[name] = job
        return
    path, body = RESOURCES[name]
    for needed in body_refs(body):
        make(client, needed, ids)
    answer = client.post(path, json=resolve(body, ids))
    assert answer.status_code in (201, 202), answer.text
    ids[name] = answer.json()["name" if name == "cluster" else "id"]


def row_counts(app: FastAPI) -> dict[str, int]:
    """Rows per table of backend.orm."""
    with app.state.sessions() as session:
        return {
            table.name: int(session.scalar(select(func.count()).select_from(table)) or 0)
            for table in Base.metadata.sorted_tables
        }


def send(client: TestClient, case: Case, ids: dict[str, Any]) -> Any:
    path = case.path.format(**ids)
    if case.content is None:
        body = resolve(case.body, ids)
        return client.request(case.method, path, json=body, headers=case.headers)
    headers = {"Content-Type": "application/json", **case.headers}
    raw = case.content

    def chunks() -> Iterator[bytes]:  # no Content-Length: sent chunked
        for start in range(0, len(raw), 1024):
            yield raw[start : start + 1024]

    content = chunks() if case.chunked else raw
    return client.request(case.method, path, content=content, headers=headers)


def test_the_corpus_is_large_and_named_uniquely() -> None:
    assert len(CASES) >= 24
    assert len({c.id for c in CASES}) == len(CASES)
    assert all(400 <= c.status < 500 for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_request_names_the_culprit_and_stores_nothing(
    case: Case, client: TestClient, app: FastAPI
) -> None:
    ids: dict[str, Any] = {}
    for name in refs(case):
        make(client, name, ids)
    before = row_counts(app)
    response = send(client, case, ids)
    assert response.status_code == case.status, response.text
    body = response.json()
    assert set(body) == {"code", "message", "detail"}, body
    assert body["code"] == case.code, body
    assert case.named in body["message"], (case.named, body["message"])
    assert isinstance(body["detail"], dict)
    for key, value in case.detail.items():
        assert body["detail"].get(key) == value, (key, body["detail"])
    assert row_counts(app) == before


#: Strategies whose annotations fit mlp_demo, with the cluster to plan on: the checks of
#: POST /api/plans must let them through, and the worker builds them.
FITTING: list[tuple[dict[str, Any], str | None]] = [
    # serial values; 8 devices on an 8-device cluster
    ({"mesh": "dp=2,tp=4", "annotations": ["x=dp:S(0)", "w1=tp:S(0)"]}, "h100-sxm-1x8"),
    # values of the training graph only: a gradient, AdamW's states
    ({"mesh": "dp=2,tp=2", "annotations": ["w0.exp_avg*=tp:S(1)", "y.grad=dp:S(0)"]}, None),
    # a later annotation overrides one that would not divide
    ({"mesh": "tp=3", "annotations": ["w1=tp:S(1)", "w1=tp:R"]}, None),
    # fewer devices than the cluster has
    ({"mesh": "dp=2", "templates": ["dp"]}, "h100-sxm-8x8"),
    # a template none of whose patterns name a value of this model; an SGD step
    ({"mesh": "tp=3", "templates": ["megatron_tp"], "options": {"optimizer": "sgd"}}, None),
]


def test_plans_that_fit_are_queued_and_built(client: TestClient, settings: Settings) -> None:
    ids: dict[str, Any] = {}
    make(client, "model", ids)
    plans = []
    for n, (strategy, cluster) in enumerate(FITTING):
        made = client.post("/api/strategies", json={"name": f"fit{n}", **strategy})
        assert made.status_code == 201, made.text
        body = {"model_id": ids["model"], "strategy_id": made.json()["id"], "cluster": cluster}
        queued = client.post("/api/plans", json=body)
        assert queued.status_code == 202, (strategy, queued.text)
        plans.append(queued.json()["id"])
    assert run_jobs(settings) == len(FITTING)
    for plan_id in plans:
        plan = client.get(f"/api/plans/{plan_id}").json()
        assert plan["status"] == "succeeded", plan
