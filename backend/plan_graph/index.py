"""`GraphIndex`: one plan's program indexed once, for scope views, search and op details.

It links every value to its producer and consumers, gives each op its *view scope* (where
the graph view draws it; see `GraphIndex._place`) and grows the module tree of those scopes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from backend.module_tree import ModuleScope, fold_runs, join_path

#: the step suffix of an intermediate reshard value (`x@S(0)R.0`)
_STEP = re.compile(r"\.\d+$")


def path_parts(path: str) -> list[str]:
    """`layers.3.attn` -> ["layers", "3", "attn"]; the root "" has none."""
    return path.split(".") if path else []


def common_scope(paths: Iterable[str]) -> str:
    """The longest common dotted prefix; when the paths part at numbered children
    (`layers.3.x`, `layers.4.y`), the list above them (`""`), never the list itself."""
    split = [path_parts(p) for p in paths]
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


def collective_json(op: dict[str, Any]) -> dict[str, Any]:
    """A comm op of the `program` artifact as the API shows it: what moves, where, why."""
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
        "scope": op["scope"],
        "reason": op["reason"],
    }


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
    tree: ModuleScope = field(default_factory=lambda: ModuleScope(""))
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
            parts = path_parts(path)
            for k in range(len(parts) + 1):
                prefix = ".".join(parts[:k])
                self.totals[prefix] = self.totals.get(prefix, 0) + 1

    # -- reading -------------------------------------------------------------------------

    def module(self, path: str) -> ModuleScope | None:
        """The module at `path` (None when the program has none)."""
        node = self.tree
        for part in path_parts(path):
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
            stack += [(join_path(p, name), child) for name, child in n.children.items()]
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
        """A comm op as the graph draws it: `collective_json` and its predicted time."""
        op = self.ops[i]
        return {**collective_json(op), "time_s": self.times.get(op["name"])}

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
        parts = path_parts(path)
        node = self.tree
        for depth, part in enumerate(parts):
            if self.totals.get(".".join(parts[: depth + 1])) == 1 and not in_folded_run(node, part):
                return ".".join(parts[:depth])
            node = node.children[part]
        return path


def in_folded_run(parent: ModuleScope, name: str) -> bool:
    """Whether child `name` of `parent` is part of a folded run."""
    if not name.isdigit():
        return False
    return any(name in run and len(run) > 1 for run in fold_runs(parent))
