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
- `fsdp` (= `zero3`): shard every parameter 1/n on the axis, at any n: on a dim no other
  mesh axis shards (the first that divides evenly, else the largest, cut in DTensor's
  torch.chunk blocks as FSDP2 pads it), so that gathering it is one all-gather over the
  axis, as FSDP2 issues (with tensor parallelism: of the TP shard, torchtitan's 2D);
  parameters are gathered right before each use, in the forward and again in the backward
  (their annotations do not pin them), and their gradients are sharded the same way, so
  each is reduce-scattered right after it is made (on a training graph).
- `zero1`: shard the optimizer state (moments, float32 master weights) the same way, on a
  dim its parameter's other axes leave alone (the state keeps its parameter's tensor-
  parallel shard: 12/(tp x dp) bytes per parameter): the optimizer updates its shard and
  the new parameters are all-gathered (ZeRO stage 1; Megatron's distributed optimizer,
  which shards one flat buffer instead: the same bytes per rank to within a block).
- `zero2`: `zero1` plus the gradients the optimizer reads: they are reduce-scattered
  instead of all-reduced (ZeRO stage 2). On a training graph only.

The data-sharding templates (`fsdp`, `zero1`, `zero2`, `zero3`) are data parallelism: they
shard the batch of the inputs on their axis as `dp` does (so `--template dp:dpr --template
fsdp:dps` is HSDP: every rank of the `dpr` x `dps` grid trains on its own samples, the
parameters sharded within `dps`, replicated across `dpr`), and they apply after the other
templates whatever the order they are written in.

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
    """Shard the batch (dim 0) of every input on `axis`; a batch the axis does not divide is
    refused naming it (every rank trains on as many samples; an uneven batch would gather
    every activation the reshapes cannot carry unevenly)."""
    size = mesh.axis_size(axis)
    out = []
    for v in graph.values_of_kind(ValueKind.INPUT):
        if v.type.rank < 1:
            continue
        batch = v.type.shape[0]
        if batch % size:
            raise StrategyError(
                f"template dp: input {v.name!r} has a batch of {batch}, which does not divide "
                f"over the {size} ranks of mesh axis {axis!r}; use a batch that is a multiple "
                f"of {size} (--set batch=N) or another data-parallel size",
                template="dp",
                axis=axis,
                value=v.name,
                batch=batch,
            )
        out.append(_ann(v.name, axis, Shard(0), "dp"))
    return out


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


def _data_parallel_dim(shape: tuple[int, ...], taken: set[int], size: int) -> int | None:
    """The dim a data-parallel template shards a value of `shape` on, over an axis of `size`
    ranks: never a dim another mesh axis shards (`taken`: a dim shared by two axes nests
    their blocks, and gathering one axis then costs an all-to-all where FSDP2 and Megatron
    gather once); among the others the first that divides evenly, else the largest (cut
    as DTensor cuts it: torch.chunk blocks, the last ones short or empty). None for a
    value with no such dim (a scalar)."""
    free = [d for d, extent in enumerate(shape) if d not in taken and extent > 0]
    if not free:
        return None
    even = [d for d in free if shape[d] % size == 0]
    return even[0] if even else max(free, key=lambda d: shape[d])


def _shard_for_data_parallel(
    graph: Graph, mesh: Mesh, axis: str, prior: Prior, names: list[str], template: str,
    *, pin: bool = True, follows: Mapping[str, str] | None = None,
) -> list[Annotation]:  # fmt: skip
    """Shard each value 1/size on `axis` at any size (`_data_parallel_dim`). The dims other
    mesh axes shard are the value's own priors, or those of the parameter it `follows` (an
    optimizer state or gradient is laid out as its parameter)."""
    out = []
    size = mesh.axis_size(axis)
    for name in names:
        owner = (follows or {}).get(name, name)
        taken = {p.dim for a in mesh.axis_names if a != axis
                 for v in (name, owner) if isinstance(p := prior.get((v, a)), Shard)}  # fmt: skip
        dim = _data_parallel_dim(graph.type_of(name).shape, taken, size)
        if dim is not None:
            out.append(_ann(name, axis, Shard(dim), template, pin=pin))
    return out


def _sources(graph: Graph, kind: ValueKind) -> list[str]:
    return [v.name for v in graph.values_of_kind(kind) if graph.producer(v.name) is None]


def _optimizer_grads(graph: Graph) -> list[str]:
    """The gradient each optimizer op reads (its second input)."""
    return [op.inputs[1] for op in graph.ops if op.role == OpRole.OPTIMIZER]


def parameter_of(graph: Graph) -> dict[str, str]:
    """The parameter each optimizer op's gradient and state belong to (its first input)."""
    out: dict[str, str] = {}
    for op in graph.ops:
        if op.role == OpRole.OPTIMIZER:
            for v in op.inputs[1:]:
                if graph.type_of(v).shape == graph.type_of(op.inputs[0]).shape:
                    out[v] = op.inputs[0]
    return out


def _fully_sharded(
    graph: Graph, mesh: Mesh, axis: str, prior: Prior, name: str
) -> list[Annotation]:
    """Parameters sharded but gathered before use (not pinned), gradients reduce-scattered
    right after they are made; the optimizer state follows its parameter."""
    params = _sources(graph, ValueKind.PARAM)
    out = _shard_for_data_parallel(graph, mesh, axis, prior, params, name, pin=False)
    grads, owners = _optimizer_grads(graph), parameter_of(graph)
    out += _shard_for_data_parallel(graph, mesh, axis, prior, grads, name, follows=owners)
    return dp(graph, mesh, axis, prior) + out


def fsdp(graph: Graph, mesh: Mesh, axis: str, prior: Prior) -> list[Annotation]:
    return _fully_sharded(graph, mesh, axis, prior, "fsdp")


def zero3(graph: Graph, mesh: Mesh, axis: str, prior: Prior) -> list[Annotation]:
    return _fully_sharded(graph, mesh, axis, prior, "zero3")


def zero1(graph: Graph, mesh: Mesh, axis: str, prior: Prior) -> list[Annotation]:
    states, owners = _sources(graph, ValueKind.STATE), parameter_of(graph)
    out = _shard_for_data_parallel(graph, mesh, axis, prior, states, "zero1", follows=owners)
    return dp(graph, mesh, axis, prior) + out


def zero2(graph: Graph, mesh: Mesh, axis: str, prior: Prior) -> list[Annotation]:
    out = zero1(graph, mesh, axis, prior)  # the batch too
    grads, owners = _optimizer_grads(graph), parameter_of(graph)
    return out + _shard_for_data_parallel(graph, mesh, axis, prior, grads, "zero2",
                                          follows=owners)  # fmt: skip


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


#: the mesh axis names templates default to, and the parallelism each names
ROLE_AXES = {"dp": "data parallelism", "tp": "tensor parallelism", "pp": "pipeline parallelism"}


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
        only = mesh.axis_names[0] if mesh.ndim == 1 else None
        if template.default_axis in mesh.axis_names:
            axis = template.default_axis
        elif only is not None and only in ROLE_AXES:  # `megatron_tp` on `dp=8`: say so
            raise StrategyError(
                f"template {name!r} works on a {template.default_axis!r} axis, and the mesh's "
                f"only axis {only!r} is {ROLE_AXES[only]}'s; add a {template.default_axis!r} "
                f"axis to the mesh, or write {name}:{only} to put it on {only!r} all the same",
                template=name,
                axis=only,
            )
        elif only is not None:
            axis = only
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


#: templates that shard what data parallelism replicates: they apply after the others, so
#: that they see which dims tensor and sequence parallelism shard (in any written order)
DATA_SHARDING = ("fsdp", "zero1", "zero2", "zero3")
#: Recipes that reduce every micro-batch's gradients when they accumulate (FSDP2 under
#: torchtitan's trainer, DeepSpeed ZeRO-2/3: the sharded gradient is what they keep); the
#: others (DDP, Megatron's distributed optimizer: `zero1`) reduce once, after the last
#: micro-batch, from a whole gradient buffer.
REDUCE_EVERY_MICROBATCH = ("fsdp", "zero2", "zero3")


def template_annotations(
    graph: Graph, mesh: Mesh, uses: tuple[TemplateUse, ...]
) -> list[Annotation]:
    """The annotations every template writes, in order (each sees those before it), the
    data-sharding templates (`DATA_SHARDING`) last."""
    names = graph.values.keys()
    repeats = repeats_of(graph)
    prior: dict[tuple[str, str], Placement] = {}
    out: list[Annotation] = []
    ordered = sorted(uses, key=lambda use: use.name in DATA_SHARDING)  # stable
    for use in ordered:
        written = TEMPLATES[use.name].fn(graph, mesh, use.axis, prior)
        for ann in written:
            for name in repeats.match(ann.pattern, names):
                for axis, placement in ann.placements:
                    prior[(name, axis)] = placement
        out += written
    return out
