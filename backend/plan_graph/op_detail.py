"""One op of a plan's program for the side panel, with global and per-rank shapes."""

from __future__ import annotations

from typing import Any

from backend.plan_graph.index import GraphIndex
from shardlab.autodiff import training_graph
from shardlab.errors import ShardlabError
from shardlab.graph_json import graph_from_json
from shardlab.mesh import Mesh
from shardlab.placement import local_shape, parse_placements


def value_shapes(plan: dict[str, Any]) -> dict[str, tuple[list[int], str]]:
    """Global shape and dtype of every serial value of the training graph, rebuilt from the
    `plan` artifact (the model as given, the optimizer): the program artifact has none."""
    model = graph_from_json(plan["model"])
    optimizer = str(plan.get("optimizer") or "adamw")
    recompute = str(plan.get("strategy", {}).get("options", {}).get("recompute", "none"))
    lr = float(plan.get("lr") or 1e-3)
    training = training_graph(model, optimizer=optimizer, lr=lr, recompute=recompute)
    return {name: (list(v.type.shape), v.type.dtype) for name, v in training.values.items()}


def op_detail(
    index: GraphIndex, name: str, shapes: dict[str, tuple[list[int], str]] | None
) -> dict[str, Any] | None:
    """One op for the side panel: `op_info` plus, per input and output, the global shape,
    dtype and the block each rank holds (where the value is known); None if no such op."""
    i = index.by_name.get(name)
    if i is None:
        return None
    if index.is_comm[i]:
        op = index.ops[i]
        info = {
            "name": name, "kind": op["kind"], "role": op["role"], "scope": op["scope"],
            "shown_in": index.scope[i], "stream": op["stream"], "reason": op["reason"],
            "fallback": False, "time_s": index.times.get(name),
            "inputs": [index.port(v) for v in op["inputs"]],
            "outputs": [index.port(v) for v in op["outputs"]],
            "collective": index.badge(i),
        }  # fmt: skip
    else:
        info = index.op_info(i)
    info["view_scope"] = index.view_scope_of_op(i)
    info["deps"] = list(index.ops[i]["deps"])
    mesh = _mesh(index.mesh)
    for port in (*info["inputs"], *info["outputs"]):
        known = (shapes or {}).get(port["value"])
        port["shape"] = known[0] if known else None
        port["dtype"] = known[1] if known else None
        port["local_shape"] = None
        if known and mesh is not None and port["spec"]:
            try:
                placements = parse_placements(port["spec"], mesh)
                port["local_shape"] = list(local_shape(known[0], mesh, placements))
            except ShardlabError:
                pass
    return info


def _mesh(text: str) -> Mesh | None:
    try:
        return Mesh.parse(text) if text else None
    except ShardlabError:
        return None
