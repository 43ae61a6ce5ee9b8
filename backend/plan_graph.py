"""The op graph of a plan's program, one module scope at a time (the graph view's data).

Pure functions over the worker's artifacts (`program`, `placements`, the plan summary); no
database and no HTTP, so they are tested on a plan built in-process.

`GraphIndex.build(program, placements, fallback_ops)` indexes the program once: producer and
consumers of every value, each op's *view scope* and the module tree. `scope_view(index,
scope)` is then one scope's graph and `search(index, q)` finds ops, values, collectives and
modules by name.

View scopes. Forward and backward ops carry the scope of their module (`layers.3.attn`).
Ops the program leaves unscoped (optimizer updates, gradient sums, data-parallel buckets, the
loss seed) are shown where their data lives (`GraphIndex._place`): with the value they sum
the gradient of, with the parameter they update (where its first reader is, as in
`backend.module_tree`), else at the common scope of the ops reading what they write or
writing what they read. An op whose data spans several layers (`layers.3`, `layers.4`)
stays above the layer list; an op nothing anchors stays at the root. Each op keeps its
program scope too (`scope`, beside `shown_in`).
Communication ops are not nodes: each is a badge on the edge from the op that produced its
input (followed back through a chain of comm ops) to the ops that consume its output.

Nodes of a scope: its child modules, and its own ops. Consecutive numbered children of one
structure fold into one node with `repeat: N` (`backend.module_tree`'s rule); a child list
that is nothing but one such run (`layers` holding `layers.0` .. `layers.31`) is that node
itself. Expanding a folded node opens its first member (`layers.0`), the representative.
A child module holding a single op is drawn as that op.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from backend.module_tree import _runs, _Scope
from shardlab.autodiff import training_graph
from shardlab.errors import ShardlabError
from shardlab.graph_json import graph_from_json
from shardlab.mesh import Mesh
from shardlab.placement import local_shape, parse_placements

ROLES = ("forward", "backward", "loss", "optimizer", "comm")
#: values listed per edge at most (the count says how many there are)
MAX_EDGE_VALUES = 8
MAX_SEARCH = 50
_STEP = re.compile(r"\.\d+$")


class ScopeNotFound(LookupError):
    """The scope names no module of the program."""

    def __init__(self, scope: str) -> None:
        super().__init__(scope)
        self.scope = scope


def _parts(path: str) -> list[str]:
    return path.split(".") if path else []


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def common_scope(paths: Iterable[str]) -> str:
    """The longest common dotted prefix; when the paths part at numbered children
    (`layers.3.x`, `layers.4.y`), the list above them (`""`), never the list itself."""
    split = [_parts(p) for p in paths]
    if not split:
        return ""
    prefix: list[str] = []
    for column in zip(*split, strict=False):
        if len(set(column)) != 1:
            if all(part.isdigit() for part in column) and prefix:
                prefix.pop()
            return ".".join(prefix)
        prefix.append(column[0])
    return ".".join(prefix)


def serial_name(value: str) -> str:
    """The serial value a program value holds (`x@S(0)R` -> `x`, `x~S(0)P(sum)` -> `x`)."""
    for mark in ("@", "~"):
        if mark in value:
            return value.split(mark, 1)[0]
    return value


@dataclass
class GraphIndex:
    """One plan's program, indexed for scope views and search (built once per plan)."""

    ops: list[dict[str, Any]]
    #: serial value -> its completed spec
    specs: dict[str, str]
    fallback: set[str]
    times: dict[str, float]
    mesh: str = ""
    by_name: dict[str, int] = field(default_factory=dict)
    producer: dict[str, int] = field(default_factory=dict)
    #: serial value -> the compute op that writes it
    writer: dict[str, int] = field(default_factory=dict)
    consumers: dict[str, list[int]] = field(default_factory=dict)
    #: per op: the scope it is shown in
    scope: list[str] = field(default_factory=list)
    is_comm: list[bool] = field(default_factory=list)
    tree: _Scope = field(default_factory=lambda: _Scope(""))
    #: scope path -> indices of the ops (compute and comm) shown directly in it
    own: dict[str, list[int]] = field(default_factory=dict)
    #: scope path -> compute ops shown in it or under it
    totals: dict[str, int] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        program: dict[str, Any],
        placements: dict[str, Any] | None = None,
        fallback_ops: Sequence[str] = (),
    ) -> GraphIndex:
        """Index the `program` artifact; `placements` (artifact) gives value specs and
        `fallback_ops` (plan summary) the ops completion fell back on."""
        ops: list[dict[str, Any]] = program["ops"]
        values = (placements or {}).get("values", {})
        index = cls(
            ops=ops,
            specs={name: entry["spec"] for name, entry in values.items()},
            fallback=set(fallback_ops)
            | {op["name"] for op in ops if "fallback to the replicated rule" in op["reason"]},
            times=dict(program.get("op_times_s") or {}),
            mesh=str((placements or {}).get("mesh", "")),
        )
        index._link()
        index._place()
        index._grow_tree()
        return index

    # -- building ------------------------------------------------------------------------

    def _link(self) -> None:
        for i, op in enumerate(self.ops):
            self.by_name[op["name"]] = i
            self.is_comm.append(bool(op.get("comm")))
            for v in op["outputs"]:
                self.producer[v] = i
                if not op.get("comm"):
                    self.writer.setdefault(serial_name(v), i)
            for v in op["inputs"]:
                self.consumers.setdefault(v, []).append(i)

    def source(self, value: str) -> tuple[int | None, list[int]]:
        """The compute op that produced `value` and the comm ops between (in data order)."""
        chain: list[int] = []
        p = self.producer.get(value)
        while p is not None and self.is_comm[p]:
            chain.append(p)
            ins = self.ops[p]["inputs"]
            p = self.producer.get(ins[0]) if ins else None
        chain.reverse()
        return p, chain

    def sinks(self, value: str) -> list[tuple[int, list[int]]]:
        """The compute ops that read `value`, each with the comm ops between."""
        out: list[tuple[int, list[int]]] = []
        stack: list[tuple[str, list[int]]] = [(value, [])]
        while stack:
            v, chain = stack.pop()
            for c in self.consumers.get(v, ()):
                if self.is_comm[c]:
                    for w in self.ops[c]["outputs"]:
                        stack.append((w, [*chain, c]))
                else:
                    out.append((c, chain))
        return out

    def _place(self) -> None:
        """Each op's view scope: its own, or for an unscoped compute op the first of
        1. the scope of the value it writes the gradient of (`x.grad` -> where `x` is
           written: gradient sums, the loss seed),
        2. where the sources it reads (parameters, optimizer state) are first read
           (optimizer updates),
        3. the common scope of the ops reading what it writes,
        4. the common scope of the ops writing what it reads,
        else the root."""
        scope: list[str | None] = [op["scope"] or None for op in self.ops]
        for i, op in enumerate(self.ops):
            if self.is_comm[i]:
                scope[i] = op["scope"]
        loose = [i for i, s in enumerate(scope) if s is None]
        first_reader: dict[str, str] = {}  # source value -> scope of its first reader
        for v in self.consumers:
            if v not in self.producer:
                scoped = sorted(c for c, _ in self.sinks(v) if self.ops[c]["scope"])
                if scoped:
                    first_reader[v] = self.ops[scoped[0]]["scope"]

        def home(value: str) -> str:
            """Where a serial value lives: its writer's scope, or its first reader's."""
            w = self.writer.get(value)
            return self.ops[w]["scope"] if w is not None else first_reader.get(value, "")

        for i in loose:
            grads = [
                home(base[: -len(".grad")])
                for v in self.ops[i]["outputs"]
                if (base := serial_name(v)).endswith(".grad")
            ]
            sources = [
                first_reader[v]
                for v in self.ops[i]["inputs"]
                if v not in self.producer and v in first_reader
            ]
            for anchors in (grads, sources):
                if found := common_scope(a for a in anchors if a):
                    scope[i] = found
                    break
        for i in reversed(loose):
            if scope[i] is not None:
                continue
            readers = [
                where
                for v in self.ops[i]["outputs"]
                for c, _ in self.sinks(v)
                if (where := scope[c])
            ]
            if found := common_scope(readers):
                scope[i] = found
        for i in loose:
            if scope[i] is not None:
                continue
            writers = [
                where for v in self.ops[i]["inputs"] if (where := self._scope_of_source(v, scope))
            ]
            scope[i] = common_scope(writers)
        self.scope = [where or "" for where in scope]

    def _scope_of_source(self, value: str, scope: list[str | None]) -> str | None:
        p, _ = self.source(value)
        return scope[p] if p is not None else None

    def _grow_tree(self) -> None:
        """The module tree; a module's `own_ops` counts its own *forward* ops, so the fold
        signature is the forward structure, as in the model's module tree (a last layer
        whose residual gradient needs no sum is still a repeat of the others)."""
        for i, path in enumerate(self.scope):
            node = self.tree.at(path)
            self.own.setdefault(path, []).append(i)
            if self.is_comm[i]:
                continue
            if self.ops[i]["role"] in ("forward", "loss"):
                node.own_ops += 1
            parts = _parts(path)
            for k in range(len(parts) + 1):
                prefix = ".".join(parts[:k])
                self.totals[prefix] = self.totals.get(prefix, 0) + 1

    # -- reading -------------------------------------------------------------------------

    def module(self, path: str) -> _Scope | None:
        """The module at `path` (None when the program has none)."""
        node = self.tree
        for part in _parts(path):
            found = node.children.get(part)
            if found is None:
                return None
            node = found
        return node

    def subtree_ops(self, path: str) -> list[int]:
        """Indices of every op shown in `path` or under it, in program order."""
        node = self.module(path)
        if node is None:
            return []
        out: list[int] = []
        stack = [(path, node)]
        while stack:
            p, n = stack.pop()
            out += self.own.get(p, [])
            stack += [(_join(p, name), child) for name, child in n.children.items()]
        out.sort()
        return out

    def value_spec(self, value: str) -> str | None:
        """The spec a program value holds: `x@S(0)R` -> S(0)R, `x` -> its completed spec."""
        if "@" in value:
            return _STEP.sub("", value.split("@", 1)[1])
        if "~" in value:
            return value.split("~", 1)[1]
        return self.specs.get(value)

    def badge(self, i: int) -> dict[str, Any]:
        """A comm op as the graph draws it."""
        op = self.ops[i]
        comm = op["comm"]
        return {
            "name": op["name"],
            "kind": comm["kind"],
            "axes": comm["axes"],
            "bytes_per_rank": comm["bytes_per_rank"],
            "from": comm["from"],
            "to": comm["to"],
            "consumer": comm["consumer"],
            "value": comm["value"],
            "reason": op["reason"],
            "scope": op["scope"],
            "time_s": self.times.get(op["name"]),
        }

    def op_info(self, i: int) -> dict[str, Any]:
        """A compute op for the side panel (without shapes: see `op_detail`)."""
        op = self.ops[i]
        return {
            "name": op["name"],
            "kind": op["kind"],
            "role": op["role"],
            "scope": op["scope"],
            "shown_in": self.scope[i],
            "stream": op["stream"],
            "reason": op["reason"],
            "fallback": op["name"] in self.fallback,
            "time_s": self.times.get(op["name"]),
            "inputs": [self.port(v) for v in op["inputs"]],
            "outputs": [self.port(v) for v in op["outputs"]],
        }

    def port(self, v: str) -> dict[str, Any]:
        return {"name": v, "value": serial_name(v), "spec": self.value_spec(v)}

    def view_scope_of_op(self, i: int) -> str:
        """The scope whose graph shows op `i` as a node (a one-op module is drawn as its op,
        so that can be an ancestor of the op's own scope)."""
        path = self.scope[i]
        parts = _parts(path)
        node = self.tree
        for depth, part in enumerate(parts):
            if self.totals.get(".".join(parts[: depth + 1])) == 1 and not _folds(node, part):
                return ".".join(parts[:depth])
            node = node.children[part]
        return path


def _folds(parent: _Scope, name: str) -> bool:
    """Whether child `name` of `parent` is part of a folded run."""
    if not name.isdigit():
        return False
    return any(name in run and len(run) > 1 for run in _runs(parent))


# -- one scope ---------------------------------------------------------------------------


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


def _children(index: GraphIndex, scope: str, node: _Scope) -> tuple[list[_Node], dict[str, str]]:
    """The module nodes of `scope` and, per child name, the node id that holds it."""
    nodes: list[_Node] = []
    holder: dict[str, str] = {}
    for run in _runs(node):
        first = run[0]
        path = _join(scope, first)
        child = node.children[first]
        if len(run) == 1:
            inner = _runs(child)
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
                          f"{path}.{members[0]}-{members[-1]}", _join(path, members[0]))
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
    depth = len(_parts(scope))
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
        nid = holder[_parts(path)[depth]]
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
    parts = _parts(scope)
    for k, part in enumerate(parts):
        crumbs.append({"label": part, "scope": ".".join(parts[: k + 1])})
    return crumbs


def _folded(index: GraphIndex, scope: str) -> dict[str, Any] | None:
    """When `scope` is the representative of a folded run: how many it stands for."""
    parts = _parts(scope)
    for k in range(len(parts), 0, -1):
        name = parts[k - 1]
        if not name.isdigit():
            continue
        parent_path = ".".join(parts[: k - 1])
        parent = index.module(parent_path)
        assert parent is not None
        for run in _runs(parent):
            if name in run and len(run) > 1:
                return {
                    "scope": ".".join(parts[:k]),
                    "repeat": len(run),
                    "members": f"{_join(parent_path, run[0])}-{run[-1]}",
                    "representative": run[0] == name,
                }
    return None


# -- search ------------------------------------------------------------------------------


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
    return [_hit(index, kind, name) for _, _, kind, name in found[:limit]]


def _hit(index: GraphIndex, kind: str, name: str) -> dict[str, Any]:
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


def _module_paths(node: _Scope, path: str) -> Iterable[str]:
    for name, child in node.children.items():
        sub = _join(path, name)
        yield sub
        yield from _module_paths(child, sub)


# -- one op, with shapes -----------------------------------------------------------------


def value_shapes(plan: dict[str, Any]) -> dict[str, tuple[list[int], str]]:
    """Global shape and dtype of every serial value of the training graph, rebuilt from the
    `plan` artifact (the model as given, the optimizer): the program artifact has none."""
    model = graph_from_json(plan["model"])
    optimizer = str(plan.get("optimizer") or "adamw")
    training = training_graph(model, optimizer=optimizer, lr=float(plan.get("lr") or 1e-3))
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
