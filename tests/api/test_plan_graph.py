"""The op graph view's data: one module scope of a plan's program at a time.

Over REST (both databases): the tiny llama plan (2 layers, dp=2 x tp=2, built by the
in-process worker) folds its layers into one node, carries specs on its edges and draws its
collectives as badges matching the program artifact; scopes expand, unknown ones are 404,
search finds ops. Then `backend.plan_graph` itself on plans built in-process: every op is
drawn exactly once, every collective sits on the edge of the data it moves, fallback ops are
flagged, unscoped ops are shown with their data.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from fastapi.testclient import TestClient

from backend.plan_graph.index import GraphIndex, common_scope
from backend.plan_graph.scope_view import ScopeNotFound, scope_view
from backend.plan_graph.search import search
from backend.routers.plan_graph import INDEXES, VIEWS
from backend.settings import Settings
from shardlab.ir import Graph, Op, OpRole, TensorType, Value, ValueKind
from shardlab.models import build_model
from shardlab.plan import Plan, build_plan
from shardlab.strategy import Strategy
from tests.api.test_plans import TINY, run_jobs, setup_plan
from worker.engine import op_json, placements_json


def _ok(response: Any) -> Any:
    assert response.status_code == 200, response.text
    return response.json()


def _badges(view: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(edge, badge) for every collective drawn on an edge of `view`."""
    edges = view["edges"] + view["inputs"] + view["outputs"]
    return [(edge, badge) for edge in edges for badge in edge["collectives"]]


def test_graph_of_the_tiny_plan(
    client: TestClient, other_client: TestClient, settings: Settings
) -> None:
    plan_id = setup_plan(client)
    early = client.get(f"/api/plans/{plan_id}/graph")
    assert early.status_code == 409 and early.json()["code"] == "not_ready"
    assert run_jobs(settings) == 1
    INDEXES.clear()
    VIEWS.clear()

    root = _ok(client.get(f"/api/plans/{plan_id}/graph"))
    assert root["plan_id"] == plan_id and root["scope"] == "" and root["folded"] is None
    assert root["breadcrumb"] == [{"label": "root", "scope": ""}]
    nodes = {n["id"]: n for n in root["nodes"]}
    layers = nodes["layers"]
    assert layers["kind"] == "module" and layers["repeat"] == 2 and layers["label"] == "layers"
    assert layers["expand"] == "layers.0" and layers["members"] == "layers.0-1"
    assert layers["role"] in ("forward", "backward") and layers["ops"] > 100
    assert {"embed", "final_norm", "lm_head", "loss"} <= nodes.keys()
    for node in root["nodes"]:
        assert node["kind"] in ("module", "op") and node["role"] in (
            "forward", "backward", "optimizer", "comm", "loss"
        )  # fmt: skip
        assert node["ops"] >= 1 and node["fallback"] is False
    rope = nodes["rope"]  # a module of one op is drawn as that op
    assert rope["kind"] == "op" and rope["op"]["kind"] == "rope_cache" and rope["op"]["reason"]

    # edges carry values with their specs; one edge per pair of nodes
    assert root["edges"] and len({(e["source"], e["target"]) for e in root["edges"]}) == len(
        root["edges"]
    )
    for edge in root["edges"]:
        assert edge["source"] in nodes and edge["target"] in nodes
        assert edge["source"] != edge["target"]
        assert edge["count"] >= len(edge["values"]) >= 1 and edge["specs"] and edge["label"]
        assert all(v["spec"] for v in edge["values"])
    embed_edge = next(e for e in root["edges"] if (e["source"], e["target"]) == ("embed", "layers"))
    assert any(v["value"] == "embed" for v in embed_edge["values"])
    # a value's spec on an edge is the spec the reader gets: after its collective if any
    plain = next(v for e in root["edges"] for v in e["values"] if v["name"] == v["value"])
    placed = _ok(client.get(f"/api/plans/{plan_id}/placements/{plain['value']}"))
    assert plain["spec"] == placed["spec"]

    # collectives are badges on the edge from their producer to their consumer
    program = _ok(client.get(f"/api/plans/{plan_id}/program", params={"limit": 5000}))["ops"]
    comm = {op["name"]: op for op in program if op.get("comm")}
    badges = _badges(root)
    assert badges and not any(n["id"] in comm for n in root["nodes"])
    for _, badge in badges:
        op = comm[badge["name"]]
        assert badge["kind"] == op["comm"]["kind"] and badge["axes"] == op["comm"]["axes"]
        assert badge["reason"] == op["reason"] and badge["reason"]
        assert badge["from"] == op["comm"]["from"] and badge["to"] == op["comm"]["to"]
        assert badge["consumer"] == op["comm"]["consumer"]
        assert badge["bytes_per_rank"] == op["comm"]["bytes_per_rank"]
        assert badge["time_s"] is not None and badge["time_s"] >= 0
    embed_ar = [b for b in embed_edge["collectives"] if b["kind"] == "all_reduce"]
    assert embed_ar and embed_ar[0]["axes"] == ["tp"] and embed_ar[0]["value"] == "embed"
    kinds = Counter(b["kind"] for _, b in badges)
    assert kinds["all_reduce"] >= 2  # the embedding's tp all-reduce, the dp gradient buckets
    assert any(b["axes"] == ["dp"] for _, b in badges)

    # expanding the folded layers opens the representative, layers.0
    layer = _ok(client.get(f"/api/plans/{plan_id}/graph", params={"scope": "layers.0"}))
    assert layer["folded"] == {
        "scope": "layers.0", "repeat": 2, "members": "layers.0-1", "representative": True
    }  # fmt: skip
    assert [c["scope"] for c in layer["breadcrumb"]] == ["", "layers", "layers.0"]
    inner = {n["id"]: n for n in layer["nodes"]}
    assert {"layers.0.attn", "layers.0.mlp", "layers.0.attn_norm", "layers.0.mlp_norm"} <= set(
        inner
    )
    assert inner["layers.0.attn"]["expand"] == "layers.0.attn"
    assert inner["layers.0.attn_residual"]["kind"] == "op"
    assert inner["layers.0.attn_residual"]["label"] == "attn_residual"
    assert all(n["id"].startswith("layers.0.") for n in layer["nodes"])
    # the tp all-reduce after the attention block, inside the layer this time
    assert any(
        b["kind"] == "all_reduce" and b["value"] == "layers.0.attn_residual"
        for _, b in _badges(layer)
    )
    assert layer["inputs"] and layer["outputs"]  # what flows in from embed, out to layers.1
    attn = _ok(client.get(f"/api/plans/{plan_id}/graph", params={"scope": "layers.0.attn"}))
    assert "layers.0.attn.q_proj" in {n["id"] for n in attn["nodes"]}
    assert "layers.0.attn.sdpa" in {n["id"] for n in attn["nodes"]}
    # the cached view is the same answer
    assert _ok(client.get(f"/api/plans/{plan_id}/graph", params={"scope": "layers.0"})) == layer

    missing = client.get(f"/api/plans/{plan_id}/graph", params={"scope": "layers.0.nope"})
    assert missing.status_code == 404, missing.text
    body = missing.json()
    assert body["code"] == "not_found" and "'layers.0.nope'" in body["message"]
    assert body["detail"]["scope"] == "layers.0.nope"

    # search: ops with the scope that shows them, values, modules
    found = _ok(client.get(f"/api/plans/{plan_id}/graph/search", params={"q": "q_proj"}))
    hits = found["results"]
    assert 0 < len(hits) <= 50
    op = next(h for h in hits if h["name"] == "layers.0.attn.q_proj")
    assert op["kind"] == "op" and op["role"] == "forward"
    shown = _ok(client.get(f"/api/plans/{plan_id}/graph", params={"scope": op["scope"]}))
    assert "layers.0.attn.q_proj" in {n["id"] for n in shown["nodes"]}
    exact = _ok(client.get(f"/api/plans/{plan_id}/graph/search", params={"q": "EMBED"}))
    assert exact["results"][0]["name"] == "embed"  # exact matches first, any case
    value = _ok(
        client.get(f"/api/plans/{plan_id}/graph/search", params={"q": "down_proj.weight.grad"})
    )
    assert any(h["kind"] == "value" for h in value["results"])
    many = _ok(client.get(f"/api/plans/{plan_id}/graph/search", params={"q": "layers"}))
    assert len(many["results"]) == 50
    assert _ok(client.get(f"/api/plans/{plan_id}/graph/search"))["results"] == []
    too_long = client.get(f"/api/plans/{plan_id}/graph/search", params={"q": "x" * 201})
    assert too_long.status_code == 422
    nothing = _ok(client.get(f"/api/plans/{plan_id}/graph/search", params={"q": "zzz"}))
    assert nothing["results"] == []

    # one op for the side panel, with shapes
    detail = _ok(client.get(f"/api/plans/{plan_id}/graph/ops/layers.0.attn.q_proj"))
    assert detail["kind"] == "linear" and detail["role"] == "forward" and detail["reason"]
    assert detail["view_scope"] == "layers.0.attn.q_proj"
    weight = next(p for p in detail["inputs"] if p["value"] == "layers.0.attn.q_proj.weight")
    assert weight["shape"] == [64, 64] and weight["spec"] == "RS(1)"
    assert weight["local_shape"] == [64, 32]
    assert client.get(f"/api/plans/{plan_id}/graph/ops/nope").status_code == 404

    for path in ("/graph", "/graph/search?q=embed", "/graph/ops/embed"):
        hidden = other_client.get(f"/api/plans/{plan_id}{path}")
        assert hidden.status_code == 404, path
    assert client.get("/api/plans/999999/graph").status_code == 404


# -- backend.plan_graph on plans built in-process ---------------------------------------------


def _index(plan: Plan) -> GraphIndex:
    program = {"ops": [op_json(op) for op in plan.program.ops]}
    return GraphIndex.build(program, placements_json(plan), plan.summary()["fallback_ops"])


@pytest.fixture(scope="module")
def tiny() -> GraphIndex:
    strategy = Strategy.build("dp=2,tp=2", ["dp", "megatron_tp"])
    return _index(build_plan(build_model("llama3-8b", TINY), strategy))


def test_every_op_is_drawn_once_and_every_collective_on_its_data(tiny: GraphIndex) -> None:
    compute = [i for i, op in enumerate(tiny.ops) if not op.get("comm")]
    for scope in ("", "layers.0", "layers.0.attn", "layers.0.mlp", "embed"):
        view = scope_view(tiny, scope)
        under = [i for i in compute if tiny.scope[i] == scope or
                 tiny.scope[i].startswith(scope + ".") or not scope]  # fmt: skip
        assert sum(n["ops"] for n in view["nodes"]) == len(under), scope
        ids = {n["id"] for n in view["nodes"]}
        for edge in view["edges"]:
            assert {edge["source"], edge["target"]} <= ids
            for badge in edge["collectives"]:
                op = tiny.ops[tiny.by_name[badge["name"]]]
                # the badge's comm op moves a value the edge carries (or one it is made from)
                carried = {v["value"] for v in edge["values"]}
                assert badge["value"] in carried or edge["count"] > len(edge["values"]), badge
                assert op["comm"]["kind"] == badge["kind"]
    # at the root the folded layers hold every op of both layers
    root = scope_view(tiny, "")
    layers = next(n for n in root["nodes"] if n["id"] == "layers")
    in_layers = sum(1 for i in compute if tiny.scope[i].startswith("layers."))
    assert layers["ops"] == in_layers and layers["repeat"] == 2


def test_unscoped_ops_are_shown_with_their_data(tiny: GraphIndex) -> None:
    shown = {op["name"]: tiny.scope[i] for i, op in enumerate(tiny.ops)}
    program_scope = {op["name"]: op["scope"] for op in tiny.ops}
    # optimizer updates are unscoped in the program: shown with their parameter's module
    assert program_scope["layers.0.attn.q_proj.weight.adamw"] == ""
    assert shown["layers.0.attn.q_proj.weight.adamw"] == "layers.0.attn.q_proj"
    assert shown["embed.weight.adamw"] == "embed"
    # gradient sums with the value they sum the gradient of; the loss seed with the loss
    assert shown["layers.0.attn_residual.grad_acc"] == "layers.0"
    assert shown["loss.grad_seed"] == "loss"
    # a gradient bucket spanning layers stays above them
    assert shown["pack:dp_bucket.0"] == ""
    op = tiny.op_info(tiny.by_name["layers.0.attn.q_proj.weight.adamw"])
    assert op["scope"] == "" and op["shown_in"] == "layers.0.attn.q_proj"


def test_unknown_scopes_and_search(tiny: GraphIndex) -> None:
    for scope in ("nope", "layers.9", "layers.0.attn.q_proj.weight", "."):
        with pytest.raises(ScopeNotFound) as caught:
            scope_view(tiny, scope)
        assert caught.value.scope == scope
    hits = search(tiny, "sdpa")
    assert hits[0]["kind"] == "op" and hits[0]["name"] == "layers.0.attn.sdpa"
    assert hits[0]["scope"] == "layers.0.attn"
    assert search(tiny, "  ") == []
    collective = search(tiny, "all_reduce:embed")[0]
    assert collective["kind"] == "collective" and collective["detail"] == "all_reduce on tp"
    module = next(h for h in search(tiny, "layers.1.mlp") if h["kind"] == "module")
    assert module["scope"] == module["name"]
    # a value's scope is where the edge carrying it is drawn
    value = next(h for h in search(tiny, "layers.0.attn.q_proj") if h["kind"] == "value")
    assert value["name"] == "layers.0.attn.q_proj" and value["scope"] == "layers.0.attn"


def test_common_scope() -> None:
    assert common_scope([]) == ""
    assert common_scope(["a.b.c", "a.b.d"]) == "a.b"
    assert common_scope(["a.b", "a.b.c"]) == "a.b"
    # parting at layer numbers: above the list, never the list itself
    assert common_scope(["layers.3.attn", "layers.4.mlp"]) == ""
    assert common_scope(["m.layers.3", "m.layers.4"]) == "m"
    assert common_scope(["x.1", "x.y"]) == "x"


def _opaque_graph() -> Graph:
    """Two repeated blocks after an op kind with no sharding rule (completion falls back)."""
    t = TensorType
    values = [
        Value("x", t((8, 16)), ValueKind.INPUT),
        Value("label", t((8, 16)), ValueKind.INPUT),
        Value("w0", t((16, 16)), ValueKind.PARAM),
        Value("w1", t((16, 16)), ValueKind.PARAM),
        Value("y", t((8, 16))),
        Value("h", t((8, 16))),
        Value("z", t((8, 16))),
        Value("loss", t(())),
    ]
    opaque = {"output_types": [{"shape": [8, 16], "dtype": "float32"}], "reference": "tanh",
              "name": "my.custom_tanh"}  # fmt: skip
    ops = [
        Op("custom", "opaque", ("x",), ("y",), opaque, scope="net.act"),
        Op("mm0", "matmul", ("y", "w0"), ("h",), scope="net.blocks.0"),
        Op("mm1", "matmul", ("h", "w1"), ("z",), scope="net.blocks.1"),
        Op("loss", "mse_loss", ("z", "label"), ("loss",), role=OpRole.LOSS, scope="loss"),
    ]
    return Graph(values, ops, name="opaque_demo")


def test_fallback_ops_are_flagged_up_the_tree() -> None:
    strategy = Strategy.build("dp=2,tp=2", ["dp"], ["w0=dp:R,tp:S(1)", "w1=tp:S(1)"])
    plan = build_plan(_opaque_graph(), strategy)
    assert plan.summary()["fallback_ops"] == ["custom"]
    index = _index(plan)
    root = {n["id"]: n for n in scope_view(index, "")["nodes"]}
    assert root["net"]["fallback"] and root["net"]["fallback_ops"] == ["custom"]
    assert not root["loss"]["fallback"]
    net = {n["id"]: n for n in scope_view(index, "net")["nodes"]}
    assert net["custom"]["kind"] == "op" and net["custom"]["fallback"]
    assert "fallback" in net["custom"]["op"]["reason"]
    assert not any(n["fallback"] for i, n in net.items() if i != "custom")
    # net.blocks: two repeats of one matmul
    blocks = net["net.blocks"]
    assert blocks["repeat"] == 2 and blocks["expand"] == "net.blocks.0"
