"""Every parameter of a plan as PyTorch sees it: its module, torch shape and placements.

What it is for: the exports (`export.dtensor`, `export.torchtitan`, `export.placements_json`)
all start from the same facts, read off a built `Plan` (never from template names alone):
each parameter's module FQN (its value name minus the last component:
`layers.0.attn.q_proj.weight` -> module `layers.0.attn.q_proj`, attribute `weight`), what
kind of module reads it, and its placement on every mesh axis, both in Shardlab's layout and
in torch's.

The layout rule. Shardlab's presets store linear weights as [in, out] (`linear`: y = x @ W,
and `matmul` with W as its plain right operand); torch's `nn.Linear` stores [out, in]. A 2-D
parameter is *transposed* relative to torch when the forward op that reads it is `linear`
(input 1), or `matmul` reading it as the right operand without `transpose_b`; then a
placement `S(d)` is torch's `Shard(1 - d)`. A parameter read as `matmul`'s right operand
with `transpose_b` (an imported `nn.Linear`, a tied lm_head), by `embedding`, or by any
other op is already in torch's layout. A graph imported from PyTorch (`shardlab.importers`,
its `meta["importer"]` set) holds every parameter as its module stores it, so none of its
parameters is transposed (its `nn.Linear` is `matmul` with `transpose_b`; Hugging Face's
`Conv1D`, stored [in, out], is `linear`, and stays as stored: its kind is `CONV1D`, whose
output features are dim 1, where `nn.Linear`'s are dim 0).

Refused (an `ExportError` naming the parameter and placement): a `Partial` parameter (no
DTensor holds a parameter as partial sums), and a parameter whose readers disagree on its
layout.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardlab.errors import ShardlabError
from shardlab.ir import Graph, ValueKind
from shardlab.placement import Partial, Placement, Shard
from shardlab.plan import Plan
from shardlab.strategy import PIPELINE_AXIS

#: Kinds of module a parameter can belong to, by the forward op that reads it.
LINEAR, EMBEDDING, NORM, OTHER = "linear", "embedding", "norm", "other"
#: Hugging Face's `Conv1D` (GPT-2): a linear module storing its weight [in, out]
CONV1D = "conv1d"
NORM_OPS = ("rms_norm", "layer_norm")


class ExportError(ShardlabError):
    """A plan cannot be exported: a placement or layout has no PyTorch form."""

    code = "export_error"


@dataclass(frozen=True, slots=True)
class ParamLayout:
    """One parameter: where it lives in the module tree and how each mesh axis places it."""

    name: str  # the value name = the torch FQN (`layers.0.attn.q_proj.weight`)
    module: str  # `layers.0.attn.q_proj` ("" for a parameter of the root module)
    attr: str  # `weight`
    kind: str  # LINEAR, CONV1D, EMBEDDING, NORM or OTHER: what reads it in the forward
    shape: tuple[int, ...]  # Shardlab's shape
    transposed: bool  # Shardlab's 2-D layout is torch's transposed (module docstring)
    placements: dict[str, Placement]  # mesh axis -> placement, Shardlab's dims
    pinned: dict[str, bool]  # mesh axis -> placed by a pinning annotation (not FSDP-style)

    @property
    def torch_shape(self) -> tuple[int, ...]:
        return tuple(reversed(self.shape)) if self.transposed else self.shape

    def torch_placement(self, axis: str) -> Placement:
        """The placement on `axis` in torch's layout (`S(d)` -> `S(1 - d)` when transposed)."""
        p = self.placements[axis]
        if isinstance(p, Shard) and self.transposed:
            return Shard(1 - p.dim)
        return p

    def torch_placements(self) -> dict[str, Placement]:
        return {axis: self.torch_placement(axis) for axis in self.placements}


def _reader_layout(graph: Graph, name: str) -> tuple[str, bool | None]:
    """(kind of module, transposed?) from the forward ops reading parameter `name`
    (transposed None: no reader says; an ExportError when readers disagree)."""
    kind, transposed = OTHER, None
    for op in graph.consumers(name):
        this: bool | None = None
        reads: str = OTHER
        if op.kind == "linear" and op.inputs[1] == name:
            reads, this = LINEAR, True
        elif op.kind == "matmul" and op.inputs[1] == name:
            reads, this = LINEAR, not op.attrs.get("transpose_b", False)
        elif op.kind == "embedding" and op.inputs[1] == name:
            reads, this = EMBEDDING, False
        elif op.kind in NORM_OPS:
            reads = NORM
        kind = reads if kind == OTHER else kind  # the first reader names the module's kind
        if this is not None and transposed is not None and this != transposed:
            raise ExportError(
                f"parameter {name!r}: its readers disagree on its layout (op {op.name!r} reads "
                "it transposed relative to another reader); it has no single torch layout",
                value=name,
                op=op.name,
            )
        transposed = this if this is not None else transposed
    return kind, transposed


def parameter_layouts(plan: Plan) -> list[ParamLayout]:
    """Every parameter of the plan's model, in graph order (module docstring)."""
    graph = plan.model
    imported = bool((graph.meta or {}).get("importer"))
    completed = plan.completed
    mesh = completed.mesh
    out = []
    for value in graph.values_of_kind(ValueKind.PARAM):
        name = value.name
        spec = completed.specs.get(name)
        if spec is None:
            raise ExportError(f"parameter {name!r} has no placement in the plan", value=name)
        placements: dict[str, Placement] = {}
        pinned: dict[str, bool] = {}
        slots = completed.constraints.get(name, {})
        for i, (axis, p) in enumerate(zip(mesh.axis_names, spec.placements, strict=True)):
            if isinstance(p, Partial):
                raise ExportError(
                    f"parameter {name!r} is placed {p} on mesh axis {axis!r}: a DTensor "
                    "parameter cannot hold partial sums; annotate it S(d) or R on that axis",
                    value=name,
                    axis=axis,
                    placement=str(p),
                )
            placements[axis] = p
            pinned[axis] = slots[i][1].pin if i in slots else True
        kind, transposed = _reader_layout(graph, name)
        if imported and kind == LINEAR and transposed and value.type.rank == 2:
            kind = CONV1D  # an imported `linear` reads Conv1D's [in, out] weight as stored
        module, _, attr = name.rpartition(".")
        out.append(
            ParamLayout(
                name=name,
                module=module,
                attr=attr,
                kind=kind,
                shape=tuple(value.type.shape),
                transposed=bool(transposed) and value.type.rank == 2 and not imported,
                placements=placements,
                pinned=pinned,
            )
        )
    return out


__all__ = [
    "CONV1D",
    "EMBEDDING",
    "LINEAR",
    "NORM",
    "OTHER",
    "PIPELINE_AXIS",
    "ExportError",
    "ParamLayout",
    "parameter_layouts",
]
