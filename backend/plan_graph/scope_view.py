"""The graph of one module scope: child modules and own ops as nodes, data as edges.

Communication ops are not nodes: each is a badge on the edge it sits on. See the package
docstring for how unscoped ops are placed and how repeated modules fold.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from backend.module_tree import ModuleScope, fold_runs, join_path
from backend.plan_graph.index import GraphIndex, path_parts, serial_name

ROLES = ("forward", "backward", "loss", "optimizer", "comm")
#: values listed per edge at most (the count says how many there are)
MAX_EDGE_VALUES = 8


class ScopeNotFound(LookupError):
    """The scope names no module of the program."""

    def __init__(self, scope: str) -> None:
        super().__init__(scope)
        self.scope = scope


@dataclass
class _Node:
    id: str
    label: str
    kind: str  # "module" | "op"
    path: str  # module path, or the op's view scope
    repeat: int = 1
    members: str = ""
    expand: str | None = None
    roles: Counter[str] = field(default_factory=Counter)
    fallback_ops: list[str] = field(default_factory=list)
    collectives: int = 0
    op: int | None = None


def _children(
    index: GraphIndex, scope: str, node: ModuleScope
) -> tuple[list[_Node], dict[str, str]]:
    """The module nodes of `scope` and, per child name, the node id that holds it."""
    nodes: list[_Node] = []
    holder: dict[str, str] = {}
    for run in fold_runs(node):
        first = run[0]
        path = join_path(scope, first)
        child = node.children[first]
        if len(run) == 1:
            inner = fold_runs(child)
            whole = (
                not any(not index.is_comm[i] for i in index.own.get(path, ()))
                and len(inner) == 1
                and len(inner[0]) > 1
                and all(n.isdigit() for n in child.children)
            )
            if whole:  # a layer list: the list is the folded run (`layers` x32)
                members = inner[0]
                nodes.append(
                    _Node(path, first, "module", path, len(members),
                          f"{path}.{members[0]}-{members[-1]}", join_path(path, members[0]))
                )  # fmt: skip
            else:
                nodes.append(_Node(path, first, "module", path, expand=path))
            holder[first] = path
            continue
        label = f"{first}-{run[-1]}"
        nodes.append(
            _Node(path, label, "module", path, len(run), f"{scope + '.' if scope else ''}{label}",
                  path)
        )  # fmt: skip
        for name in run:
            holder[name] = path
    return nodes, holder


def scope_view(index: GraphIndex, scope: str) -> dict[str, Any]:
    """The graph of one module scope: nodes, edges with values, specs and comm badges, and
    the values crossing the scope's boundary. Raises ScopeNotFound for an unknown scope."""
    node = index.module(scope)
    if node is None:
        raise ScopeNotFound(scope)
    modules, holder = _children(index, scope, node)
    by_id: dict[str, _Node] = {m.id: m for m in modules}
    depth = len(path_parts(scope))
    members = index.subtree_ops(scope)
    inside = set(members)
    node_of: dict[int, str] = {}
    for i in members:
        path = index.scope[i]
        if path == scope:
            if index.is_comm[i]:
                continue
            name = index.ops[i]["name"]
            by_id[name] = _Node(name, _relative(name, scope), "op", scope, op=i)
            node_of[i] = name
            continue
        nid = holder[path_parts(path)[depth]]
        holding = by_id[nid]
        if index.is_comm[i]:
            holding.collectives += 1
            continue
        node_of[i] = nid
        holding.roles[index.ops[i]["role"]] += 1
        if index.ops[i]["name"] in index.fallback:
            holding.fallback_ops.append(index.ops[i]["name"])
    # a module with a single op is drawn as that op
    singles: dict[str, str] = {}
    for m in modules:
        if m.repeat == 1 and sum(m.roles.values()) == 1:
            (i,) = (j for j, nid in node_of.items() if nid == m.id)
            name = index.ops[i]["name"]
            singles[m.id] = name
            del by_id[m.id]
            by_id[name] = _Node(
                name, _relative(name, scope), "op", m.path, op=i, collectives=m.collectives
            )
    if singles:
        node_of = {i: singles.get(nid, nid) for i, nid in node_of.items()}
    # where each node starts in program order: the forward pass first, so the view can draw
    # data flowing to an earlier node (gradients) as going back up
    first: dict[str, int] = {}
    for i, nid in node_of.items():
        first[nid] = min(first.get(nid, i), i)

    edges: dict[tuple[str, str], dict[str, Any]] = {}
    inputs: dict[str, dict[str, Any]] = {}
    outputs: dict[str, dict[str, Any]] = {}
    seen: dict[int, set[str]] = {}  # per edge (by id): the values and comm ops on it

    def add(
        table: dict[Any, dict[str, Any]], key: Any, base: dict[str, Any], v: str, chain: list[int]
    ) -> None:
        edge = table.get(key)
        if edge is None:
            edge = table[key] = {**base, "count": 0, "values": [], "specs": [], "collectives": []}
        done = seen.setdefault(id(edge), set())
        if v not in done:
            done.add(v)
            spec = index.value_spec(v)
            edge["count"] += 1
            if len(edge["values"]) < MAX_EDGE_VALUES:
                edge["values"].append({"name": v, "value": serial_name(v), "spec": spec})
            if spec is not None and spec not in edge["specs"]:
                edge["specs"].append(spec)
        for c in chain:
            name = index.ops[c]["name"]
            if name not in done:
                done.add(name)
                edge["collectives"].append(index.badge(c))

    for i in members:
        target = node_of.get(i)
        if target is None:
            continue
        op = index.ops[i]
        for v in op["inputs"]:
            p, chain = index.source(v)
            if p is None:
                continue
            if p in inside:
                src = node_of[p]
                if src != target:
                    add(edges, (src, target), {"source": src, "target": target}, v, chain)
            else:
                add(inputs, target, {"target": target}, v, chain)
        for v in op["outputs"]:
            for c, chain in index.sinks(v):
                if c not in inside:
                    last = index.ops[chain[-1]]["outputs"][0] if chain else v
                    add(outputs, target, {"source": target}, last, chain)

    return {
        "scope": scope,
        "breadcrumb": _breadcrumb(index, scope),
        "folded": _folded(index, scope),
        "nodes": [
            {**_node_json(index, n), "order": first.get(n.id, len(index.ops))}
            for n in by_id.values()
        ],
        "edges": [
            {"id": f"{e['source']}->{e['target']}", **e, "label": _label(e)} for e in edges.values()
        ],
        "inputs": list(inputs.values()),
        "outputs": list(outputs.values()),
        "mesh": index.mesh,
    }


def _relative(name: str, scope: str) -> str:
    """An op name without its scope's prefix (`layers.0.attn.sdpa` in `layers.0.attn`:
    `sdpa`)."""
    return name[len(scope) + 1 :] if scope and name.startswith(scope + ".") else name


def _label(edge: dict[str, Any]) -> str:
    specs = edge["specs"]
    text = specs[0] if len(specs) == 1 else f"{len(specs)} specs" if specs else "?"
    return text if edge["count"] == 1 else f"{text} ×{edge['count']}"


def _node_json(index: GraphIndex, n: _Node) -> dict[str, Any]:
    if n.op is not None:
        info = index.op_info(n.op)
        return {
            "id": n.id,
            "label": n.label,
            "kind": "op",
            "op_kind": info["kind"],
            "role": info["role"],
            "roles": {info["role"]: 1},
            "ops": 1,
            "repeat": 1,
            "fallback": info["fallback"],
            "fallback_ops": [n.id] if info["fallback"] else [],
            "collectives": n.collectives,
            "expand": None,
            "scope": n.path,
            "op": info,
        }
    total = sum(n.roles.values())
    role = max(ROLES, key=lambda r: n.roles.get(r, 0)) if total else "comm"
    return {
        "id": n.id,
        "label": n.label,
        "kind": "module",
        "role": role,
        "roles": {r: n.roles[r] for r in ROLES if n.roles.get(r)},
        "ops": total,
        "repeat": n.repeat,
        "members": n.members or None,
        "fallback": bool(n.fallback_ops),
        "fallback_ops": n.fallback_ops[:20],
        "collectives": n.collectives,
        "expand": n.expand,
        "scope": n.path,
    }


def _breadcrumb(index: GraphIndex, scope: str) -> list[dict[str, Any]]:
    crumbs: list[dict[str, Any]] = [{"label": "root", "scope": ""}]
    parts = path_parts(scope)
    for k, part in enumerate(parts):
        crumbs.append({"label": part, "scope": ".".join(parts[: k + 1])})
    return crumbs


def _folded(index: GraphIndex, scope: str) -> dict[str, Any] | None:
    """When `scope` is the representative of a folded run: how many it stands for."""
    parts = path_parts(scope)
    for k in range(len(parts), 0, -1):
        name = parts[k - 1]
        if not name.isdigit():
            continue
        parent_path = ".".join(parts[: k - 1])
        parent = index.module(parent_path)
        assert parent is not None
        for run in fold_runs(parent):
            if name in run and len(run) > 1:
                return {
                    "scope": ".".join(parts[:k]),
                    "repeat": len(run),
                    "members": f"{join_path(parent_path, run[0])}-{run[-1]}",
                    "representative": run[0] == name,
                }
    return None


# -- search ------------------------------------------------------------------------------
