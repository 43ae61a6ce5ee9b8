"""Search a plan's op graph: ops, collectives, values and modules by name."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from backend.module_tree import ModuleScope, join_path
from backend.plan_graph.index import GraphIndex, common_scope, serial_name

MAX_SEARCH = 50


def search(index: GraphIndex, q: str, limit: int = MAX_SEARCH) -> list[dict[str, Any]]:
    """Ops, collectives, values and modules whose name contains `q` (case-insensitive),
    exact and prefix matches first, then in program order; each with the scope to open to
    see it (`scope`) and the node or edge to select there."""
    needle = q.strip().lower()
    if not needle:
        return []
    found: list[tuple[int, int, str, str]] = []  # (rank, order, kind, name)

    def consider(kind: str, name: str) -> None:
        low = name.lower()
        if needle in low:
            r = 0 if low == needle else 1 if low.startswith(needle) else 2
            found.append((r, len(found), kind, name))

    for i, op in enumerate(index.ops):
        consider("collective" if index.is_comm[i] else "op", op["name"])
    for value in index.specs:
        consider("value", value)
    for path in _module_paths(index.tree, ""):
        consider("module", path)
    found.sort(key=lambda t: (t[0], t[1]))
    return [hit(index, kind, name) for _, _, kind, name in found[:limit]]


def hit(index: GraphIndex, kind: str, name: str) -> dict[str, Any]:
    if kind == "module":
        return {"kind": kind, "name": name, "role": None, "scope": name, "detail": "module"}
    if kind == "value":
        return {"kind": kind, "name": name, "role": None, "scope": _value_scope(index, name),
                "detail": index.specs[name]}  # fmt: skip
    i = index.by_name[name]
    op = index.ops[i]
    if kind == "op":
        return {"kind": kind, "name": name, "role": op["role"],
                "scope": index.view_scope_of_op(i), "detail": op["kind"]}  # fmt: skip
    p, _ = index.source(op["inputs"][0]) if op["inputs"] else (None, [])
    ends = [index.scope[p]] if p is not None else []
    ends += [index.scope[c] for w in op["outputs"] for c, _ in index.sinks(w)][:1]
    comm = op["comm"]
    return {"kind": kind, "name": name, "role": "comm",
            "scope": common_scope(ends) if ends else op["scope"],
            "detail": f"{comm['kind']} on {', '.join(comm['axes'])}"}  # fmt: skip


def _value_scope(index: GraphIndex, value: str) -> str:
    """Where an edge carrying `value` is drawn: the common scope of its writer and readers."""
    p = index.writer.get(value)
    if p is not None:
        ends = [index.scope[p]]
        for held in index.ops[p]["outputs"]:
            if serial_name(held) == value:
                ends += [index.scope[c] for c, _ in index.sinks(held)]
        return common_scope(ends)
    readers = index.sinks(value)
    return index.view_scope_of_op(readers[0][0]) if readers else ""


def _module_paths(node: ModuleScope, path: str) -> Iterable[str]:
    for name, child in node.children.items():
        sub = join_path(path, name)
        yield sub
        yield from _module_paths(child, sub)


# -- one op, with shapes -----------------------------------------------------------------
