"""Import a PyTorch module: `torch.export` it and map its ATen ops to catalog ops.

`graph_from_module(module, example_inputs, name=...)` exports `module` (meant to live on the
meta device: no weights, no memory; example inputs on meta too) in non-strict mode and walks
the exported FX graph:

- parameters become `param` values named by their PyTorch FQN
  (`model.layers.0.self_attn.q_proj.weight`) in PyTorch's own layout (an `nn.Linear` weight is
  [out, in]), so `Graph.num_params()` is `sum(p.numel() for p in module.parameters())`;
  user inputs become `input` values named as the forward's arguments (`input_ids`);
- each node is mapped by `aten_ops.ATEN` in the scope of its innermost module
  (`nn_module_stack`), named `<module path>.<op>` with a counter per module, so repeated
  layers name their ops alike and fold (`shardlab.repeats`);
- nodes that read no graph value (masks, positions, rotary tables computed from shapes and
  buffers with known values) are evaluated on the CPU, and only what the graph needs of them
  becomes catalog ops (`emit.GraphEmitter.constant`): a causal mask becomes
  `causal=True` on the attention op, position ids a slice of the position table;
- modules whose class name ends in `RMSNorm` computing `weight * x * rsqrt(mean(x^2) + eps)`
  become one `rms_norm` op;
- an ATen op without a mapping becomes an `opaque` op with the export's output shapes (its
  `name` attr is the ATen op), listed in the graph's `meta["opaque_ops"]`; its sharding is
  the replicated fallback, which the plan's summary lists under `fallback_ops`.

A module whose export fails raises `ModelImportError` carrying torch's message (which names
the op or the line it stopped at).
"""

from __future__ import annotations

import operator
import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from shardlab.errors import ModelImportError
from shardlab.importers.aten_ctx import Ctx, Unmapped, is_metadata_op, packet_name, tensor_type
from shardlab.importers.aten_ops import ATEN
from shardlab.importers.emit import GraphEmitter
from shardlab.importers.norm_fusion import find_rms_norms
from shardlab.ir import Graph, ValueKind

#: ATen ops never evaluated as constants (they draw random numbers or have effects).
_NOT_CONSTANT = frozenset({"aten.dropout", "aten.native_dropout", "aten.rand", "aten.randn",
                           "aten.bernoulli", "aten.randint", "aten.rand_like"})  # fmt: skip


def graph_from_module(
    module: Any,
    example_inputs: Sequence[Any],
    *,
    name: str = "imported",
    example_kwargs: Mapping[str, Any] | None = None,
    constants: Mapping[str, Any] | None = None,
    meta: Mapping[str, Any] | None = None,
) -> Graph:
    """The forward graph of `module(*example_inputs, **example_kwargs)`.

    `constants` gives CPU values for buffers by FQN (a rotary `inv_freq` built on the meta
    device has none); a buffer without a value becomes a `constant` source value. The graph's
    outputs are the tensors the module returns.
    """
    import torch

    try:
        exported = torch.export.export(
            module, tuple(example_inputs), kwargs=dict(example_kwargs or {}), strict=False
        )
    except Exception as exc:  # torch raises many kinds; all mean the same to the user
        raise _export_error(exc) from exc
    walker = _Walker(name, exported, dict(constants or {}))
    outputs = walker.run()
    full_meta = {
        "importer": "torch.export",
        "opaque_ops": [
            {"op": o.op, "aten": o.target, "reason": o.reason} for o in walker.out.opaque
        ],
        "import_notes": sorted(walker.out.notes),
        **dict(meta or {}),
    }
    return walker.out.build(outputs, full_meta)


def _export_error(exc: Exception) -> ModelImportError:
    """torch's error, its first lines, with the ATen op it names and the line of the
    module's code it stopped at (the deepest frame outside torch and Shardlab)."""
    import traceback

    text = str(exc).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    head = "\n".join(lines[:6])
    found = re.search(r"aten\.[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)?", text)
    libraries = tuple(
        os.path.dirname(str(sys.modules[m].__file__)) + os.sep
        for m in ("torch", "shardlab", "transformers") if m in sys.modules
    )  # fmt: skip
    frames = [
        f for f in traceback.extract_tb(exc.__traceback__)
        if not f.filename.startswith(("<", *libraries))
    ]  # fmt: skip
    where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else None
    code = (frames[-1].line or "").strip() if frames else ""
    at = f"\nat {where}: {code}" if where else ""
    return ModelImportError(
        f"torch.export failed: {type(exc).__name__}: {head}{at}",
        op=found.group(0) if found else None,
        line=where,
        code=code or None,
        torch_error=type(exc).__name__,
    )


def module_scope(node: Any) -> str:
    """The FQN of the innermost module a node ran in ("" at the top level)."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = str(list(stack.values())[-1][0])
    return re.sub(r"@\d+", "", path)


class _Walker:
    """One walk over an exported program's FX graph."""

    def __init__(self, name: str, exported: Any, constants: dict[str, Any]) -> None:
        self.exported = exported
        self.constants = constants
        self.out = GraphEmitter(name)
        self.env: dict[str, Any] = {}

    def run(self) -> list[str]:
        import torch

        graph = self.exported.graph
        self._placeholders()
        fused, skipped = find_rms_norms(graph, self.env)
        outputs: list[str] = []
        for node in graph.nodes:
            if node.op == "call_function":
                if node.name in skipped:
                    continue
                if node.name in fused:
                    norm = fused[node.name]
                    self.env[norm.last] = norm.emit(self.out, self.env)
                    continue
                self.env[node.name] = self._call(node, torch)
            elif node.op == "output":
                flat: list[Any] = []
                _flatten(self._resolve(node.args[0]), flat)
                outputs = [v for v in flat if isinstance(v, str)]
        if not outputs:
            raise ModelImportError(
                f"the module returns no tensor the graph computes; {self.out.name!r} needs an "
                "output (a loss)",
                value=self.out.name,
            )
        return outputs

    def _placeholders(self) -> None:
        from torch.export.graph_signature import InputKind

        state = {**self.exported.state_dict, **self.exported.constants}
        nodes = {n.name: n for n in self.exported.graph.nodes if n.op == "placeholder"}
        tied_to: dict[int, str] = {}
        for spec in self.exported.graph_signature.input_specs:
            node = nodes[spec.arg.name]
            val = node.meta.get("val")
            if spec.kind == InputKind.PARAMETER:
                tensor = state.get(spec.target)
                tied = tied_to.get(id(tensor)) if tensor is not None else None
                if tied is not None:  # one parameter under two names (tied embeddings)
                    self.env[node.name] = tied
                    continue
                ttype = tensor_type(val, spec.target)
                self.env[node.name] = self.out.source(spec.target, ttype, ValueKind.PARAM)
                if tensor is not None:
                    tied_to[id(tensor)] = spec.target
            elif spec.kind == InputKind.USER_INPUT:
                if _is_tensor(val):
                    ttype = tensor_type(val, node.name)
                    self.env[node.name] = self.out.source(node.name, ttype, ValueKind.INPUT)
                else:
                    self.env[node.name] = val
            elif spec.kind in (InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
                known: Any = self.constants.get(spec.target, state.get(spec.target))
                if _is_tensor(known) and not known.is_meta:
                    self.env[node.name] = known.detach().cpu()
                else:
                    ttype = tensor_type(val, spec.target)
                    self.env[node.name] = self.out.source(spec.target, ttype, ValueKind.CONSTANT)
            else:
                self.env[node.name] = None

    def _resolve(self, args: Any) -> Any:
        from torch.fx import Node
        from torch.fx.node import map_aggregate

        return map_aggregate(args, lambda a: self.env[a.name] if isinstance(a, Node) else a)

    def _call(self, node: Any, torch: Any) -> Any:
        args, kwargs = self._resolve(node.args), self._resolve(node.kwargs)
        if node.target is operator.getitem:
            return args[0][args[1]]
        target = packet_name(node.target)
        refs: list[Any] = []
        _flatten((args, kwargs), refs)
        reads_values = any(isinstance(r, str) for r in refs)
        if target not in _NOT_CONSTANT and (not reads_values or is_metadata_op(target)):
            folded = _evaluate(node, self.env, torch)
            if folded is not None:
                return folded
        ctx = Ctx(self.out, node, module_scope(node), target)
        mapping = ATEN.get(target)
        try:
            if mapping is None:
                raise Unmapped("no mapping for this ATen op")
            return mapping(ctx, args, kwargs)
        except Unmapped as why:
            return ctx.opaque(refs, str(why))


def _flatten(obj: Any, into: list[Any]) -> None:
    if isinstance(obj, list | tuple):
        for x in obj:
            _flatten(x, into)
    elif isinstance(obj, dict):
        for x in obj.values():
            _flatten(x, into)
    else:
        into.append(obj)


def _is_tensor(obj: Any) -> bool:
    import torch

    return isinstance(obj, torch.Tensor)


def _evaluate(node: Any, env: Mapping[str, Any], torch: Any) -> Any:
    """Run `node` on the CPU with its constant arguments (graph values, read only for their
    shape by metadata ops, stand in as zeros); None when it cannot run there."""
    from torch.fx import Node
    from torch.fx.node import map_aggregate

    def concrete(a: Any) -> Any:
        if isinstance(a, Node):
            known = env[a.name]
            if isinstance(known, str):
                val = a.meta["val"]
                return torch.zeros(tuple(val.shape), dtype=val.dtype)
            return known
        if isinstance(a, torch.device):
            return torch.device("cpu")
        return a

    try:
        with torch.no_grad():
            out = node.target(*map_aggregate(node.args, concrete),
                              **map_aggregate(node.kwargs, concrete))  # fmt: skip
    except Exception:  # an op that needs a real device or a graph value: not a constant
        return None
    if isinstance(out, torch.Tensor) and out.is_meta:
        return None
    return out
