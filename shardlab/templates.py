"""Strategy templates: named recipes that only write annotations on one mesh axis.

- `dp`: shard the batch dim (dim 0) of every graph input on the axis.
- `megatron_tp`: column-parallel q/k/v and gate/up projections (weights `S(1)`, biases
  `S(0)`), row-parallel o and down projections (weights `S(0)`), vocab-parallel embedding
  (`S(0)`) and lm_head (`S(1)`), and a replicated residual stream, so each block's
  row-parallel partial sums are all-reduced as in Megatron-LM.
- `sequence_parallel`: shard the residual stream and the norm outputs on the sequence dim
  (`S(1)`), so partial sums are reduce-scattered and the norm output is all-gathered right
  before the next column-parallel projection, keeping only its sequence shard for backward
  (Megatron-LM sequence parallelism: 32sbh/t activation bytes per layer without dropout);
  compose after `megatron_tp`.
- `fsdp`: shard every parameter on the axis along its first dim that divides evenly.
- `zero1`: shard the optimizer state (moments, float32 master weights) the same way: the
  optimizer updates its shard and the new parameters are all-gathered (ZeRO stage 1).
- `zero2`: `zero1` plus the gradients the optimizer reads: they are reduce-scattered
  instead of all-reduced (ZeRO stage 2). On a training graph only.

Templates match the module paths of Shardlab's presets (`layers.{i}.attn.q_proj.weight`);
patterns that match nothing in a graph are reported, not errors.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from shardlab.ir import Graph, OpRole, ValueKind
from shardlab.mesh import Mesh
from shardlab.placement import Placement, Replicate, Shard
from shardlab.strategy import Annotation, StrategyError, TemplateUse, match_values

#: (value name, mesh axis) -> placement written so far, for templates that must compose.
Prior = Mapping[tuple[str, str], Placement]
TemplateFn = Callable[[Graph, Mesh, str, Prior], list[Annotation]]


@dataclass(frozen=True, slots=True)
class Template:
    """A named recipe, the mesh axis name it uses by default, and what it does."""

    name: str
    default_axis: str
    description: str
    fn: TemplateFn


def _ann(pattern: str, axis: str, placement: Placement, template: str) -> Annotation:
    return Annotation(pattern, ((axis, placement),), f"template:{template}")


def dp(graph: Graph, mesh: Mesh, axis: str, prior: Prior) -> list[Annotation]:
    return [
        _ann(v.name, axis, Shard(0), "dp")
        for v in graph.values_of_kind(ValueKind.INPUT)
        if v.type.rank >= 1
    ]


RESIDUAL = ("embed", "pos_embed.add", "layers.*.attn_residual", "layers.*.mlp_residual")
NORM_OUTPUTS = ("layers.*.attn_norm", "layers.*.mlp_norm", "final_norm")
COLUMN = ("attn.q_proj", "attn.k_proj", "attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
ROW = ("attn.o_proj", "mlp.down_proj")


def megatron_tp(graph: Graph, mesh: Mesh, axis: str, prior: Prior) -> list[Annotation]:
    out = []
    for module in COLUMN:
        out.append(_ann(f"layers.*.{module}.weight", axis, Shard(1), "megatron_tp"))
        out.append(_ann(f"layers.*.{module}.bias", axis, Shard(0), "megatron_tp"))
    for module in ROW:
        out.append(_ann(f"layers.*.{module}.weight", axis, Shard(0), "megatron_tp"))
    out.append(_ann("embed.weight", axis, Shard(0), "megatron_tp"))
    out.append(_ann("lm_head.weight", axis, Shard(1), "megatron_tp"))
    out += [_ann(p, axis, Replicate(), "megatron_tp") for p in RESIDUAL]
    return out


def sequence_parallel(graph: Graph, mesh: Mesh, axis: str, prior: Prior) -> list[Annotation]:
    out = [_ann(p, axis, Shard(1), "sequence_parallel") for p in RESIDUAL]
    out += [_ann(p, axis, Shard(1), "sequence_parallel") for p in NORM_OUTPUTS]
    return out


def _shard_first_divisible(
    graph: Graph, mesh: Mesh, axis: str, prior: Prior, names: list[str], template: str
) -> list[Annotation]:
    """Shard each value on `axis` along its first dim that still divides evenly (after the
    other axes that already shard that dim)."""
    out = []
    size = mesh.axis_size(axis)
    for name in names:
        for dim, extent in enumerate(graph.type_of(name).shape):
            already = math.prod(
                mesh.axis_size(a)
                for a in mesh.axis_names
                if a != axis and prior.get((name, a)) == Shard(dim)
            )
            if extent % (already * size) == 0:
                out.append(_ann(name, axis, Shard(dim), template))
                break
    return out


def _sources(graph: Graph, kind: ValueKind) -> list[str]:
    return [v.name for v in graph.values_of_kind(kind) if graph.producer(v.name) is None]


def _optimizer_grads(graph: Graph) -> list[str]:
    """The gradient each optimizer op reads (its second input)."""
    return [op.inputs[1] for op in graph.ops if op.role == OpRole.OPTIMIZER]


def fsdp(graph: Graph, mesh: Mesh, axis: str, prior: Prior) -> list[Annotation]:
    params = _sources(graph, ValueKind.PARAM)
    return _shard_first_divisible(graph, mesh, axis, prior, params, "fsdp")


def zero1(graph: Graph, mesh: Mesh, axis: str, prior: Prior) -> list[Annotation]:
    states = _sources(graph, ValueKind.STATE)
    return _shard_first_divisible(graph, mesh, axis, prior, states, "zero1")


def zero2(graph: Graph, mesh: Mesh, axis: str, prior: Prior) -> list[Annotation]:
    out = zero1(graph, mesh, axis, prior)
    return out + _shard_first_divisible(graph, mesh, axis, prior, _optimizer_grads(graph), "zero2")


TEMPLATES: dict[str, Template] = {
    t.name: t
    for t in [
        Template("dp", "dp", "data parallel: shard the batch dim of the inputs", dp),
        Template("megatron_tp", "tp", "Megatron tensor parallel (column/row, vocab)", megatron_tp),
        Template("sequence_parallel", "tp", "Megatron sequence parallel", sequence_parallel),
        Template("fsdp", "dp", "fully sharded data parallel: shard parameters", fsdp),
        Template("zero1", "dp", "ZeRO-1: shard optimizer state and master weights", zero1),
        Template("zero2", "dp", "ZeRO-2: ZeRO-1 plus the gradients", zero2),
    ]
}


def resolve_template(text: str, mesh: Mesh) -> TemplateUse:
    """`dp` or `dp:x` -> the template and the mesh axis it applies on."""
    name, _, axis = text.partition(":")
    name, axis = name.strip(), axis.strip()
    template = TEMPLATES.get(name)
    if template is None:
        raise StrategyError(
            f"unknown template {name!r}; known templates: {', '.join(TEMPLATES)}", template=name
        )
    if not axis:
        if template.default_axis in mesh.axis_names:
            axis = template.default_axis
        elif mesh.ndim == 1:
            axis = mesh.axis_names[0]
        else:
            raise StrategyError(
                f"template {name!r} needs a mesh axis: the mesh has no axis "
                f"{template.default_axis!r}; write {name}:AXIS with AXIS one of "
                f"{', '.join(mesh.axis_names)}",
                template=name,
            )
    elif axis not in mesh.axis_names:
        raise StrategyError(
            f"template {name!r}: unknown mesh axis {axis!r}; the mesh has axes "
            f"{', '.join(mesh.axis_names)}",
            template=name,
            axis=axis,
        )
    return TemplateUse(name, axis)


def template_annotations(
    graph: Graph, mesh: Mesh, uses: tuple[TemplateUse, ...]
) -> list[Annotation]:
    """The annotations every template writes, in order (each sees those before it)."""
    names = graph.values.keys()
    prior: dict[tuple[str, str], Placement] = {}
    out: list[Annotation] = []
    for use in uses:
        written = TEMPLATES[use.name].fn(graph, mesh, use.axis, prior)
        for ann in written:
            for name in match_values(ann.pattern, names):
                for axis, placement in ann.placements:
                    prior[(name, axis)] = placement
        out += written
    return out
