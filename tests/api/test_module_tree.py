"""The folded module tree (pure function, no database)."""

from __future__ import annotations

from typing import Any

from backend.module_tree import module_tree
from shardlab.ir import Graph, Op, TensorType, Value, ValueKind
from shardlab.models import build_model

SMALL = {"hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 64, "seq": 8, "batch": 8}


def by_path(node: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every node of the tree by its path."""
    out = {node["path"]: node}
    for child in node["children"]:
        out.update(by_path(child))
    return out


def test_four_layer_llama_folds_into_one_repeated_layer() -> None:
    graph = build_model("llama3-8b", {**SMALL, "layers": 4})
    tree = module_tree(graph)
    assert (tree["name"], tree["path"], tree["repeat"]) == ("llama3-8b", "", 1)
    assert tree["ops"] == len(graph.ops) and tree["params"] == graph.num_params()
    assert [c["name"] for c in tree["children"]] == [
        "embed", "rope", "layers.*", "final_norm", "lm_head", "loss",
    ]  # fmt: skip
    nodes = by_path(tree)
    layer = nodes["layers.*"]
    assert layer["repeat"] == 4 and layer["name"] == "layers.*"
    assert not any(p.startswith("layers.0") or p == "layers" for p in nodes)
    per_layer = sum(
        graph.values[f"layers.0.{w}.weight"].type.numel
        for w in ("attn_norm", "attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj",
                  "mlp_norm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
    )  # fmt: skip
    assert layer["params"] == 4 * per_layer
    assert layer["ops"] == 4 * sum(op.scope.startswith("layers.0") for op in graph.ops) == 80
    q_proj = nodes["layers.*.attn.q_proj"]
    assert (q_proj["ops"], q_proj["params"], q_proj["children"]) == (1, 64 * 64, [])
    assert nodes["layers.*.attn"]["ops"] == 11  # 4 projections + 7 ops in the attn scope
    assert nodes["embed"]["params"] == 64 * 64 and nodes["rope"]["params"] == 0


def test_a_graph_without_scopes_is_a_single_root() -> None:
    graph = build_model("mlp_demo")
    tree = module_tree(graph)
    assert tree == {
        "name": "mlp_demo", "path": "", "ops": 3, "params": 32 * 32 + 32 * 8, "repeat": 1,
        "children": [],
    }  # fmt: skip


def _relu_chain(scopes: list[str], widths: list[int]) -> Graph:
    """x -> linear (weight of each width) per scope; one op per scope."""
    values = [Value("x", TensorType((2, 4), "float32"), ValueKind.INPUT)]
    ops, prev = [], "x"
    for i, (scope, width) in enumerate(zip(scopes, widths, strict=True)):
        values.append(Value(f"w{i}", TensorType((4, width), "float32"), ValueKind.PARAM))
        values.append(Value(f"h{i}", TensorType((2, width), "float32")))
        ops.append(Op(f"op{i}", "matmul", (prev, f"w{i}"), (f"h{i}",), scope=scope))
        prev = f"h{i}"
    return Graph(values, ops, name="chain")


def test_only_consecutive_siblings_of_one_structure_fold() -> None:
    scopes = [f"blocks.{i}.fc" for i in range(5)]
    tree = module_tree(_relu_chain(scopes, [4, 4, 4, 8, 8]))
    blocks = tree["children"]
    assert [c["name"] for c in blocks] == ["blocks"]
    runs = blocks[0]["children"]
    assert [(r["name"], r["path"], r["repeat"], r["params"]) for r in runs] == [
        ("0-2", "blocks.0-2", 3, 3 * 16),
        ("3-4", "blocks.3-4", 2, 2 * 32),
    ]
    assert runs[1]["children"][0]["path"] == "blocks.3-4.fc"
    assert blocks[0]["params"] == 3 * 16 + 2 * 32 and blocks[0]["ops"] == 5


def test_a_lone_numbered_module_is_not_folded() -> None:
    tree = module_tree(_relu_chain(["blocks.0.fc", "head"], [4, 4]))
    nodes = by_path(tree)
    assert nodes["blocks.0"]["repeat"] == 1 and "blocks.0.fc" in nodes
    assert nodes["head"]["params"] == 16
