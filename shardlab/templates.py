"""Strategy templates: named recipes that only write annotations on one mesh axis.

- `dp`: shard the batch dim (dim 0) of every graph input on the axis.
- `megatron_tp`: column-parallel q/k/v and gate/up projections (weights `S(1)`, biases
  `S(0)`), row-parallel o and down projections (weights `S(0)`), vocab-parallel embedding
  (`S(0)`) and lm_head (`S(1)`), and a replicated residual stream, so each block's
  row-parallel partial sums are all-reduced as in Megatron-LM: 2 all-reduces of the
  activation per layer in forward, 2 in backward. Attention is sharded by heads; with fewer
  kv heads than the axis has ranks (grouped-query attention) the k and v projections stay
  replicated and each rank's query heads read them (the plan notes it). The weights are
  pinned: no rule ever gathers them.
- `sequence_parallel`: shard the residual stream and the norm outputs on the sequence dim
  (`S(1)`), so partial sums are reduce-scattered and the norm output is all-gathered right
  before the next column-parallel projection, keeping only its sequence shard for backward
  (Megatron-LM sequence parallelism: every all-reduce becomes an all-gather and a
  reduce-scatter, the backward gathers the norm output again for the weight gradients, and
  activations take sbh(34/t + 5as/(ht)) bytes per layer); compose after `megatron_tp`.
  Both templates lay out the dropouts before the residual adds
  (`layers.*.{attn,mlp}.dropout.out`, models with dropout) as the residual stream.
- `fsdp` (= `zero3`): shard every parameter on the axis along its first dim that divides
  evenly; parameters are gathered right before each use, in the forward and again in the
  backward (their annotations do not pin them), and their gradients are sharded the same
  way, so each is reduce-scattered right after it is made (on a training graph).
- `zero1`: shard the optimizer state (moments, float32 master weights) the same way: the
  optimizer updates its shard and the new parameters are all-gathered (ZeRO stage 1).
- `zero2`: `zero1` plus the gradients the optimizer reads: they are reduce-scattered
  instead of all-reduced (ZeRO stage 2). On a training graph only.

Templates match the module paths of Shardlab's presets (`layers.{i}.attn.q_proj.weight`)
and of imported Hugging Face models (`shardlab.importers`), whose parameters keep their
PyTorch names and layouts: Llama-style `model.layers.{i}.self_attn.{q,k,v,o}_proj` and
`mlp.{gate,up,down}_proj` are `nn.Linear` ([out, in]: column-parallel is `S(0)` of the
weight, row-parallel `S(1)`), `model.embed_tokens` and `lm_head` ([vocab, hidden]: both
`S(0)`); GPT-2's `transformer.h.{i}.attn.c_attn` (fused q/k/v), `mlp.c_fc` and the two
`c_proj` are `Conv1D` ([in, out], as the presets: column `S(1)`, row `S(0)`), `transformer.wte`
`S(0)` (the tied lm_head reads it). An imported model's residual stream is the output of
each `add` made directly in a layer's scope (`model.layers.3.add_1`), with the dropouts it
adds and the embedding outputs; its norm outputs are those of `rms_norm` / `layer_norm` ops.
Patterns that match nothing in a graph are reported, not errors.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from shardlab.annotation import Annotation, StrategyError, TemplateUse
from shardlab.ir import Graph, OpRole, ValueKind
from shardlab.mesh import Mesh
from shardlab.placement import Placement, Replicate, Shard
from shardlab.repeats import layer_of, repeats_of

#: The dropouts before each residual add (models with dropout): in Megatron-LM they run in
#: the residual stream's region (replicated with tensor parallelism, sequence-sharded with
#: sequence parallelism), so their masks are laid out as the residual stream is.
HIDDEN_DROPOUT = ("layers.*.attn.dropout.out", "layers.*.mlp.dropout.out")
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


def _ann(
    pattern: str, axis: str, placement: Placement, template: str, *, pin: bool = True,
    note: str = "",
) -> Annotation:  # fmt: skip
    return Annotation(pattern, ((axis, placement),), f"template:{template}", pin, note)


def dp(graph: Graph, mesh: Mesh, axis: str, prior: Prior) -> list[Annotation]:
    return [
        _ann(v.name, axis, Shard(0), "dp")
        for v in graph.values_of_kind(ValueKind.INPUT)
        if v.type.rank >= 1
    ]


RESIDUAL = ("embed", "pos_embed.add", "layers.*.attn_residual", "layers.*.mlp_residual",
            *HIDDEN_DROPOUT)  # fmt: skip
NORM_OUTPUTS = ("layers.*.attn_norm", "layers.*.mlp_norm", "final_norm")
COLUMN = ("attn.q_proj", "attn.k_proj", "attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
ROW = ("attn.o_proj", "mlp.down_proj")


#: The reshape that splits each attention projection into heads: [batch, seq, heads, dim].
HEAD_SPLITS = {"q": "layers.*.attn.q_heads", "k": "layers.*.attn.k_heads"}


def _heads(graph: Graph, part: str) -> int | None:
    """The head count of attention projection `part` ("q" or "k"), if the graph has one
    (an imported model's are in its meta: `attention_heads`, `kv_heads`)."""
    names = repeats_of(graph).match(HEAD_SPLITS[part], graph.values.keys())
    if names:
        return graph.type_of(names[0]).shape[2]
    found = graph.meta.get("attention_heads" if part == "q" else "kv_heads")
    return found if isinstance(found, int) and not isinstance(found, bool) else None


#: Imported Hugging Face modules: (module path suffix, the weight's placement in its column-
#: or row-parallel role). nn.Linear weights are [out, in]; GPT-2's Conv1D's [in, out].
HF_COLUMN = (("self_attn.q_proj", Shard(0)), ("self_attn.k_proj", Shard(0)),
             ("self_attn.v_proj", Shard(0)), ("mlp.gate_proj", Shard(0)),
             ("mlp.up_proj", Shard(0)), ("attn.c_attn", Shard(1)),
             ("mlp.c_fc", Shard(1)))  # fmt: skip
HF_ROW = (("self_attn.o_proj", Shard(1)), ("mlp.down_proj", Shard(1)), ("attn.c_proj", Shard(0)),
          ("mlp.c_proj", Shard(0)))  # fmt: skip
HF_KV = ("self_attn.k_proj", "self_attn.v_proj")
HF_VOCAB = ("*embed_tokens.weight", "transformer.wte.weight", "lm_head.weight")
_NORMS = frozenset({"rms_norm", "layer_norm"})


def _imported_residual(graph: Graph) -> list[str]:
    """An imported model's residual stream: the forward `add`s made in a layer's own scope
    (`model.layers.3`), the dropout outputs they add, and the embedding outputs."""
    out = []
    for op in graph.ops:
        if op.role != OpRole.FORWARD:
            continue
        if op.kind == "embedding":
            out.append(op.outputs[0])
        elif op.kind == "add" and _is_layer_scope(op.scope):
            out.append(op.outputs[0])
            for v in op.inputs:
                made = graph.producer(v)
                if made is not None and made.kind == "dropout" and v == made.outputs[0]:
                    out.append(v)
    return out


def _is_layer_scope(scope: str) -> bool:
    where = layer_of(scope)
    return where is not None and scope == f"{where[0]}.{where[1]}"


def _imported_norms(graph: Graph) -> list[str]:
    return [op.outputs[0] for op in graph.ops
            if op.role == OpRole.FORWARD and op.kind in _NORMS]  # fmt: skip


def _hf_megatron(graph: Graph, axis: str, replicate_kv: bool, note: str) -> list[Annotation]:
    out = []
    for module, weight in HF_COLUMN:
        if replicate_kv and module in HF_KV:
            for param in ("weight", "bias"):
                pattern = f"*.{module}.{param}"
                out.append(_ann(pattern, axis, Replicate(), "megatron_tp", note=note))
            continue
        out.append(_ann(f"*.{module}.weight", axis, weight, "megatron_tp"))
        out.append(_ann(f"*.{module}.bias", axis, Shard(0), "megatron_tp"))
    for module, weight in HF_ROW:
        out.append(_ann(f"*.{module}.weight", axis, weight, "megatron_tp"))
        out.append(_ann(f"*.{module}.bias", axis, Replicate(), "megatron_tp"))
    out += [_ann(p, axis, Shard(0), "megatron_tp") for p in HF_VOCAB]
    out += [_ann(v, axis, Replicate(), "megatron_tp") for v in _imported_residual(graph)]
    names, repeats = graph.values.keys(), repeats_of(graph)
    return [a for a in out if repeats.match(a.pattern, names)]  # only this family's names


def _imported(graph: Graph) -> bool:
    """A graph imported from PyTorch (its values keep PyTorch's names)."""
    return "importer" in graph.meta


def megatron_tp(graph: Graph, mesh: Mesh, axis: str, prior: Prior) -> list[Annotation]:
    size = mesh.axis_size(axis)
    heads, kv_heads = _heads(graph, "q"), _heads(graph, "k")
    if heads is not None and heads % size:
        raise StrategyError(
            f"template megatron_tp: the {heads} attention heads do not divide over the "
            f"{size} ranks of mesh axis {axis!r}; use a tensor-parallel size that divides them",
            template="megatron_tp",
            axis=axis,
        )
    replicate_kv = kv_heads is not None and kv_heads % size != 0
    note = (
        f"{kv_heads} kv heads do not divide over the {size} ranks of mesh axis {axis!r}: the "
        "k and v projections stay replicated and each rank's query heads read them"
    )
    out = []
    for module in COLUMN:
        if replicate_kv and module in ("attn.k_proj", "attn.v_proj"):
            for param in ("weight", "bias"):
                pattern = f"layers.*.{module}.{param}"
                out.append(_ann(pattern, axis, Replicate(), "megatron_tp", note=note))
            continue
        out.append(_ann(f"layers.*.{module}.weight", axis, Shard(1), "megatron_tp"))
        out.append(_ann(f"layers.*.{module}.bias", axis, Shard(0), "megatron_tp"))
    for module in ROW:
        out.append(_ann(f"layers.*.{module}.weight", axis, Shard(0), "megatron_tp"))
        # added once, after the partial sums meet (Megatron's RowParallelLinear)
        out.append(_ann(f"layers.*.{module}.bias", axis, Replicate(), "megatron_tp"))
    out.append(_ann("embed.weight", axis, Shard(0), "megatron_tp"))
    out.append(_ann("lm_head.weight", axis, Shard(1), "megatron_tp"))
    out += [_ann(p, axis, Replicate(), "megatron_tp") for p in RESIDUAL]
    if _imported(graph):
        out = _hf_megatron(graph, axis, replicate_kv, note)
    return out


def sequence_parallel(graph: Graph, mesh: Mesh, axis: str, prior: Prior) -> list[Annotation]:
    if _imported(graph):
        names = [*_imported_residual(graph), *_imported_norms(graph)]
        return [_ann(v, axis, Shard(1), "sequence_parallel") for v in names]
    out = [_ann(p, axis, Shard(1), "sequence_parallel") for p in RESIDUAL]
    out += [_ann(p, axis, Shard(1), "sequence_parallel") for p in NORM_OUTPUTS]
    return out


def _shard_first_divisible(
    graph: Graph, mesh: Mesh, axis: str, prior: Prior, names: list[str], template: str,
    *, pin: bool = True,
) -> list[Annotation]:  # fmt: skip
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
                out.append(_ann(name, axis, Shard(dim), template, pin=pin))
                break
    return out


def _sources(graph: Graph, kind: ValueKind) -> list[str]:
    return [v.name for v in graph.values_of_kind(kind) if graph.producer(v.name) is None]


def _optimizer_grads(graph: Graph) -> list[str]:
    """The gradient each optimizer op reads (its second input)."""
    return [op.inputs[1] for op in graph.ops if op.role == OpRole.OPTIMIZER]


def _fully_sharded(
    graph: Graph, mesh: Mesh, axis: str, prior: Prior, name: str
) -> list[Annotation]:
    """Parameters sharded but gathered before use (not pinned), gradients reduce-scattered
    right after they are made; the optimizer state follows its parameter."""
    params = _sources(graph, ValueKind.PARAM)
    out = _shard_first_divisible(graph, mesh, axis, prior, params, name, pin=False)
    return out + _shard_first_divisible(graph, mesh, axis, prior, _optimizer_grads(graph), name)


def fsdp(graph: Graph, mesh: Mesh, axis: str, prior: Prior) -> list[Annotation]:
    return _fully_sharded(graph, mesh, axis, prior, "fsdp")


def zero3(graph: Graph, mesh: Mesh, axis: str, prior: Prior) -> list[Annotation]:
    return _fully_sharded(graph, mesh, axis, prior, "zero3")


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
        Template("zero3", "dp", "ZeRO-3: shard parameters too, gathered before use", zero3),
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
    repeats = repeats_of(graph)
    prior: dict[tuple[str, str], Placement] = {}
    out: list[Annotation] = []
    for use in uses:
        written = TEMPLATES[use.name].fn(graph, mesh, use.axis, prior)
        for ann in written:
            for name in repeats.match(ann.pattern, names):
                for axis, placement in ann.placements:
                    prior[(name, axis)] = placement
        out += written
    return out
