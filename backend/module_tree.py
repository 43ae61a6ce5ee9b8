"""The module tree of a graph, for the graph view: nested modules from op scopes.

Op scopes are dot paths (`layers.3.attn.q_proj`); every prefix is a module. Each node of the
tree is `{name, path, ops, params, repeat, children}`:

- `ops`: ops whose scope is the node's path or lies under it;
- `params`: parameter elements under it; a parameter (a `param` value no op produces) belongs
  to the scope of the first op that reads it (the graph's root if none does);
- `repeat`: 1, or N for a folded run of repeated modules.

Folding: consecutive numbered siblings (`layers.0` .. `layers.N-1`) whose subtrees have the
same structure (names, op and parameter counts, recursively) become one node. When the run is
every child of a module without ops or parameters of its own (a layer list), the list and the
run merge into one node `layers.*` (path `layers.*`); otherwise the run is a child named `*`
(all numbered children) or `first-last`. A folded node's `ops` and `params` count all N
repeats; its children describe one repeat, with `*` in their paths (`layers.*.attn`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shardlab.ir import Graph, ValueKind

Signature = tuple[int, int, tuple[tuple[str, Any], ...]]


@dataclass
class ModuleScope:
    """A module while the tree is collected: its own ops and parameters, its sub-modules."""

    name: str
    own_ops: int = 0
    own_params: int = 0
    children: dict[str, ModuleScope] = field(default_factory=dict)

    def child(self, name: str) -> ModuleScope:
        """The sub-module `name`, created if missing."""
        found = self.children.get(name)
        if found is None:
            found = self.children[name] = ModuleScope(name)
        return found

    def at(self, path: str) -> ModuleScope:
        """The module at dot path `path` under this one (itself for the empty path)."""
        node = self
        for part in path.split(".") if path else ():
            node = node.child(part)
        return node

    def signature(self) -> Signature:
        """What two modules must share to fold: counts and children, recursively."""
        kids = tuple((name, child.signature()) for name, child in self.children.items())
        return (self.own_ops, self.own_params, kids)


def module_tree(graph: Graph) -> dict[str, Any]:
    """The folded module tree of `graph`; the root is named after the graph, path ``""``."""
    return _render(_collect(graph), graph.name, "", merge=False)


def _collect(graph: Graph) -> ModuleScope:
    root = ModuleScope(graph.name)
    for op in graph.ops:
        root.at(op.scope).own_ops += 1
    for value in graph.values_of_kind(ValueKind.PARAM):
        if graph.producer(value.name) is not None:
            continue
        readers = graph.consumers(value.name)
        scope = readers[0].scope if readers else ""
        root.at(scope).own_params += value.type.numel
    return root


def join_path(path: str, name: str) -> str:
    """`join_path("layers", "3")` -> `layers.3`; under the root "" just the name."""
    return f"{path}.{name}" if path else name


def _render(scope: ModuleScope, name: str, path: str, *, merge: bool) -> dict[str, Any]:
    """One node and its (folded) children; `merge` lets a layer list become `name.*`."""
    children = _render_children(scope, path)
    own = scope.own_ops == 0 and scope.own_params == 0
    if merge and own and len(children) == 1 and children[0]["name"] == "*":
        return {**children[0], "name": f"{name}.*"}
    return {
        "name": name,
        "path": path,
        "ops": scope.own_ops + sum(c["ops"] for c in children),
        "params": scope.own_params + sum(c["params"] for c in children),
        "repeat": 1,
        "children": children,
    }


def _render_children(scope: ModuleScope, path: str) -> list[dict[str, Any]]:
    numbered = [n for n in scope.children if n.isdigit()]
    out: list[dict[str, Any]] = []
    for run in fold_runs(scope):
        first = scope.children[run[0]]
        if len(run) == 1:
            out.append(_render(first, run[0], join_path(path, run[0]), merge=True))
            continue
        label = "*" if len(run) == len(numbered) else f"{run[0]}-{run[-1]}"
        node = _render(first, label, join_path(path, label), merge=False)
        node["ops"] *= len(run)
        node["params"] *= len(run)
        node["repeat"] = len(run)
        out.append(node)
    return out


def fold_runs(scope: ModuleScope) -> list[list[str]]:
    """Children in order, grouped: consecutive numbered siblings of one structure together."""
    runs: list[list[str]] = []
    previous: tuple[int, Signature] | None = None
    for name, child in scope.children.items():
        if not name.isdigit():
            runs.append([name])
            previous = None
            continue
        signature = child.signature()
        if previous is not None and previous == (int(name) - 1, signature):
            runs[-1].append(name)
        else:
            runs.append([name])
        previous = (int(name), signature)
    return runs
