"""RMSNorm modules written in Python (Llama's, Mistral's, Qwen2's) as one `rms_norm` op.

Hugging Face's `LlamaRMSNorm` computes `weight * (x * rsqrt(mean(x^2, -1) + eps))` from
elementwise ATen ops. `find_rms_norms` finds each call of a module whose class name ends in
`RMSNorm` and whose ops are exactly that (casts aside: pow 2, mean over the last dim kept,
add eps, rsqrt, mul by x, mul by a parameter of shape [hidden]), reading one activation and
one parameter and feeding one value out. Any other body (Gemma's `(1 + weight)`) is left to
the elementwise mappings, which compute the same function op by op.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shardlab.importers.aten_ctx import packet_name
from shardlab.importers.emit import GraphEmitter

#: ATen ops that do not change values in an fp32 norm (casts, views of the same data).
_PASS = frozenset({"aten._assert_tensor_metadata", "aten.to", "aten._to_copy", "aten.alias",
                   "aten.clone", "aten.contiguous", "aten.type_as"})  # fmt: skip
_BODY = ("aten.pow", "aten.mean", "aten.add", "aten.rsqrt", "aten.mul", "aten.mul")


@dataclass(frozen=True)
class FusedNorm:
    """One RMSNorm call: its input node, weight node, eps, module path and last node."""

    scope: str
    x: str
    weight: str
    eps: float
    last: str
    #: casts of x to its own dtype that nodes outside read (the residual): they are x
    aliases: tuple[str, ...] = ()

    def emit(self, out: GraphEmitter, env: dict[str, Any]) -> str:
        x, w = env[self.x], env[self.weight]
        for alias in self.aliases:
            env[alias] = x
        wtype = out.type_of(w)
        if out.type_of(x).dtype != wtype.dtype:
            x = out.one("cast", [x], {"dtype": wtype.dtype}, self.scope, "cast")
        return out.one("rms_norm", [x, w], {"eps": self.eps}, self.scope, "rms_norm")


def find_rms_norms(graph: Any, env: Mapping[str, Any]) -> tuple[dict[str, FusedNorm], set[str]]:
    """(first node of each fusable RMSNorm call -> its fusion, every other node it covers)."""
    regions: dict[str, list[Any]] = {}
    for node in graph.nodes:
        stack = node.meta.get("nn_module_stack") or {}
        if node.op != "call_function" or not stack:
            continue
        path, cls = list(stack.values())[-1]
        cls_name = cls if isinstance(cls, str) else getattr(cls, "__qualname__", str(cls))
        if str(cls_name).endswith("RMSNorm"):
            regions.setdefault(str(path), []).append(node)
    fused: dict[str, FusedNorm] = {}
    skipped: set[str] = set()
    for path, nodes in regions.items():
        found = _match(nodes, env)
        if found is None:
            continue
        x, weight, eps, aliases = found
        scope = re.sub(r"@\d+", "", path)
        fused[nodes[0].name] = FusedNorm(scope, x, weight, eps, nodes[-1].name, aliases)
        skipped.update(n.name for n in nodes[1:])
    return fused, skipped


def _match(
    nodes: list[Any], env: Mapping[str, Any]
) -> tuple[str, str, float, tuple[str, ...]] | None:
    inside = {n.name for n in nodes}
    outside_inputs = {a.name for n in nodes for a in n.all_input_nodes if a.name not in inside}
    leaving = [n for n in nodes if any(u.name not in inside for u in n.users)]
    if len(outside_inputs) != 2 or not leaving or leaving[-1] is not nodes[-1]:
        return None
    core = [n for n in nodes if packet_name(n.target) not in _PASS]
    if tuple(packet_name(n.target) for n in core) != _BODY:
        return None
    pow_, mean, add, _, _, last = core
    if last is not nodes[-1] and packet_name(nodes[-1].target) not in _PASS:
        return None
    if pow_.args[1] != 2 or list(mean.args[1]) != [-1] or not (
        len(mean.args) > 2 and mean.args[2]
    ):  # fmt: skip
        return None
    eps = add.args[1]
    if isinstance(eps, bool) or not isinstance(eps, int | float):
        return None
    params = [a for a in last.all_input_nodes if a.name in outside_inputs]
    if len(params) != 1 or not isinstance(env.get(params[0].name), str):
        return None
    weight = params[0]
    (x,) = outside_inputs - {weight.name}
    val = weight.meta.get("val")
    if val is None or len(val.shape) != 1 or weight.op != "placeholder":
        return None
    aliases = tuple(n.name for n in leaving[:-1])
    if not all(_cast_of(n, x) for n in leaving[:-1]):
        return None
    return x, weight.name, float(eps), aliases


def _cast_of(node: Any, x: str) -> bool:
    """`node` is a cast of x to x's own dtype (the same values)."""
    args = node.all_input_nodes
    if packet_name(node.target) not in _PASS or [a.name for a in args] != [x]:
        return False
    return bool(node.meta["val"].dtype == args[0].meta["val"].dtype)
