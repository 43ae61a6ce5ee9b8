"""A plan as a PyTorch module: `parallelize(model, world_mesh=None)` with DTensor styles.

What it is for: `shardlab export-plan --format dtensor` (and the service's export route)
turn a built `Plan` into a small Python module that applies the same layout to the torch
model whose parameter FQNs are the plan's value names. This module only writes text: it
never imports torch.

How the plan's placements become torch calls (`derive_export`), decided from every
parameter's actual placements (`export.parameters`), never from template names alone:

- Each mesh axis (other than `pp`) is one of: a *tensor-parallel* axis (some parameter is
  sharded on it and pinned there), an *FSDP* axis (parameters sharded but gathered before
  use: the `fsdp` / `zero3` annotations, `pin=False`), a *data* axis (every parameter
  replicated, the inputs' batch dim split: `dp`, and `zero1` / `zero2`, which have no exact
  DTensor form: exported as data parallel, said in the module and the CLI), or idle.
- On the tensor-parallel axis each module gets the style its parameters' placements (in
  torch's layout) spell: weight `Shard(0)` -> `ColwiseParallel`, `Shard(1)` ->
  `RowwiseParallel` (for `nn.Embedding` the other way round: a vocab-sharded table is
  `RowwiseParallel(input_layouts=Replicate())`); a replicated norm whose output the plan
  keeps sequence-sharded -> `SequenceParallel()`; a replicated linear whose input arrives
  sequence-sharded -> `PrepareModuleInput`. Input and output layouts are the plan's: a
  column-parallel module reads its input as the plan lays it out (`Shard(1)` with sequence
  parallelism), a row-parallel module's partial sums go where the plan's consumers want them
  (`Replicate()` or `Shard(1)`), and a column-parallel module feeding the loss keeps the
  logits vocab-sharded where the plan's loss is vocab-parallel (`Shard(-1)`, a DTensor:
  `LOSS_PARALLEL`, the loss is computed inside torch's `loss_parallel()`), else gathers
  them (`Replicate()`). Several column-parallel modules reading one norm's output (q, k, v;
  gate and up) read it once, as the plan gathers it once: the norm hands it on as a
  replicated DTensor (`SequenceParallelGathered`, the generated module's SequenceParallel
  that gathers its output: one all-gather forward and one reduce-scatter backward; a
  replicated norm: `PrepareModuleOutput`, one all-reduce of the summed gradient), where
  each module converting its own input would gather it once per module (the final norm
  gathers for the head alone too). Autograd keeps each such gathered activation as its
  sequence shard and gathers it again in backward for the weight gradients
  (`keep_shards_for_backward`: saved-tensor hooks), as the plan does after Megatron-LM, so the
  module's collectives and activation memory are the plan's. A sequence-sharded
  output (the embedding's and the row-parallel modules' under sequence parallelism) is kept
  a DTensor (`use_local_output=False`), as `SequenceParallel` keeps the norms' outputs: the
  residual stream then has its global shape, which models read (Hugging Face numbers the
  positions for the rotary embedding and the causal mask from the embedding output's
  `shape[1]`; a local tensor would give half of them). Hugging Face's `Conv1D` (weight
  [in, out]) takes the generated module's `Conv1DColwiseParallel` / `Conv1DRowwiseParallel`
  (weight `Shard(1)` / `Shard(0)`). A weight another module's linear also reads (a tied
  lm_head) styles that module too, and the module ties the weight again (`TIED`). A
  parameter whose placement the style would not give (a replicated bias under a
  column-parallel weight, a sharded norm) is refused with an `ExportError` naming it, and so
  are the layouts `export.dtensor_checks` finds the model's code cannot read (heads split
  after a replicated projection, a fused projection sharded by columns).
- The FSDP axis: `fully_shard(unit, mesh=...)` per repeated layer (the module FQN up to its
  first numeric component, `layers.3`), one unit for the modules after the last layer (the
  final norm and head, which the plan gathers again for backward) and then the root (the
  embedding, whose backward needs no gather: FSDP2 keeps the root's parameters unsharded
  from forward to backward), each parameter sharded on the dim the plan shards
  (`shard_placement_fn`); data axes beside it make it HSDP (`mesh[(data, fsdp)]`). Data
  axes alone: `replicate` (DDP) on that sub-mesh. With 16-bit parameters both take FSDP2's
  `MixedPrecisionPolicy` in the plan's dtypes: parameters gathered in theirs, gradients
  reduced in the plan's gradient dtype (float32 under AdamW's float32 masters, else the
  parameters'), so that a model holding float32 masters moves the plan's bytes.
- `recompute: full` wraps every layer in `checkpoint_wrapper`; `selective` is described (its
  op-level policy is torchtitan's `selective_ac_option = "op"`); a `pp` axis is not applied:
  the module lists each stage's layers (`PIPELINE_STAGES`) for `torch.distributed.pipelining`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from shardlab.export.dtensor_checks import (
    check_kv_heads,
    refuse_plain_into_sharded,
    refuse_split_columns,
)
from shardlab.export.parameters import (
    CONV1D,
    EMBEDDING,
    LINEAR,
    NORM,
    PIPELINE_AXIS,
    ExportError,
    ParamLayout,
    parameter_layouts,
)
from shardlab.ir import Op, OpRole, ValueKind
from shardlab.placement import Partial, Placement, Replicate, Shard
from shardlab.plan import Plan

TENSOR, FSDP, DATA, IDLE = "tensor", "fsdp", "data", "idle"
#: the generated module's styles for Hugging Face's Conv1D: `Conv1DColwiseParallel`, ...
CONV1D_PREFIX = "Conv1D"
#: Templates that shard optimizer state only: no exact DTensor form.
ZERO_STATE_ONLY = ("zero1", "zero2")
_LAYER_UNIT = re.compile(r"^(.*?\.\d+)(?:\.|$)")


@dataclass(frozen=True, slots=True)
class Style:
    """One module's tensor-parallel style: the class and its keyword arguments (as code)."""

    cls: str  # ColwiseParallel, RowwiseParallel, SequenceParallel, PrepareModuleInput
    kwargs: tuple[tuple[str, str], ...] = ()

    def code(self) -> str:
        return f"{self.cls}({', '.join(f'{k}={v}' for k, v in self.kwargs)})"


@dataclass
class DTensorExport:
    """What the generated module does, decided from the plan (module docstring)."""

    model: str
    mesh_shape: tuple[int, ...]
    mesh_axes: tuple[str, ...]
    mesh_ranks: tuple[int, ...] | None  # None: the default row-major order
    roles: dict[str, str]  # mesh axis -> TENSOR, FSDP, DATA or IDLE (pp left out)
    params: list[ParamLayout]
    tp_axis: str | None = None
    tp_plan: dict[str, Style] = field(default_factory=dict)
    #: a tied weight's other name -> the plan's parameter (`lm_head.weight` -> the embedding's)
    tied: dict[str, str] = field(default_factory=dict)
    fsdp_axis: str | None = None
    fsdp_dims: dict[str, int] = field(default_factory=dict)  # param -> torch dim
    fsdp_units: list[str] = field(default_factory=list)
    #: the modules after the last layer (final norm, head): one FSDP unit of their own,
    #: resharded after forward and gathered again for backward, as the plan gathers them
    fsdp_tail: list[str] = field(default_factory=list)
    #: FSDP2's MixedPrecisionPolicy: the dtypes the plan gathers parameters and reduces
    #: gradients in, where they are 16-bit (None: the model's own dtype)
    param_dtype: str | None = None
    reduce_dtype: str | None = None
    data_axes: list[str] = field(default_factory=list)
    recompute: str = "none"
    pipeline_stages: dict[int, list[str]] = field(default_factory=dict)
    #: what neither export can say exactly (both carry these)
    notes: list[str] = field(default_factory=list)
    #: what only the generated module needs to say
    module_notes: list[str] = field(default_factory=list)
    #: the plan reads the loss's logits replicated on the tp axis (no vocab-parallel loss)
    loss_gathered: bool = True

    @property
    def sequence_parallel(self) -> bool:
        """Whether some norm keeps its output sequence-sharded on the tp axis
        (`SequenceParallel`, or `SequenceParallelGathered`, which gathers it for its readers)."""
        return any(s.cls.startswith("SequenceParallel") for s in self.tp_plan.values())

    @property
    def regathers(self) -> bool:
        """Whether norms hand column-parallel modules their sequence-sharded output gathered
        (`SequenceParallelGathered`): autograd then keeps each one's shard and gathers it
        again in backward for the weight gradients, as the plan does (Megatron-LM's
        sequence parallelism)."""
        return any(s.cls == "SequenceParallelGathered" for s in self.tp_plan.values())


def _axis_index(plan: Plan, axis: str) -> int:
    return list(plan.completed.mesh.axis_names).index(axis)


def _on(plan: Plan, value: str, axis: str) -> Placement:
    return plan.completed.specs[value].placements[_axis_index(plan, axis)]


def _axis_roles(plan: Plan, params: list[ParamLayout]) -> dict[str, str]:
    roles = {}
    for axis in plan.completed.mesh.axis_names:
        sharded = [p for p in params if isinstance(p.placements[axis], Shard)]
        pinned = {p.pinned[axis] for p in sharded}
        if pinned == {True, False}:
            a = next(p for p in sharded if p.pinned[axis])
            b = next(p for p in sharded if not p.pinned[axis])
            raise ExportError(
                f"mesh axis {axis!r} mixes tensor parallelism ({a.name!r} is pinned "
                f"{a.placements[axis]}) with FSDP ({b.name!r} is gathered before use); DTensor "
                "applies one of them per mesh axis",
                axis=axis,
                value=a.name,
            )
        if pinned:
            roles[axis] = TENSOR if True in pinned else FSDP
            continue
        inputs = plan.model.values_of_kind(ValueKind.INPUT)
        split = any(_on(plan, v.name, axis) == Shard(0) for v in inputs if v.type.rank)
        roles[axis] = DATA if split else IDLE
    return roles


def _forward_reader(plan: Plan, param: ParamLayout) -> tuple[str, str] | None:
    """(input value, output value) of the module whose forward op reads `param`: the op's,
    past the reshapes inside the module (Conv1D flattens its input to 2-D and views its
    output back), so that layouts are the module's own."""
    graph = plan.completed.graph

    def inside(op: Op | None, scope: str) -> bool:
        return op is not None and op.kind == "reshape" and op.scope == scope and bool(scope)

    for op in graph.consumers(param.name):
        if op.role == OpRole.FORWARD and op.inputs[0] != param.name:
            x, y = op.inputs[0], op.outputs[0]
            while inside(producer := graph.producer(x), op.scope) and producer is not None:
                x = producer.inputs[0]
            while True:
                users = [c for c in graph.consumers(y) if c.role == OpRole.FORWARD]
                if len(users) != 1 or not inside(users[0], op.scope):
                    break
                y = users[0].outputs[0]
            return x, y
    return None


def _wanted(plan: Plan, value: str, axis: str) -> Placement:
    """How the plan lays `value` out on `axis` for its readers: its own placement, or, where
    it is a partial sum, what its forward consumers reshard it to."""
    have = _on(plan, value, axis)
    if not isinstance(have, Partial):
        return have
    i = _axis_index(plan, axis)
    for op in plan.completed.graph.consumers(value):
        if op.role not in (OpRole.FORWARD, OpRole.LOSS):
            continue
        rule = plan.completed.rules[op.name]
        for k, name in enumerate(op.inputs):
            if name == value and not isinstance(rule.input_specs[k].placements[i], Partial):
                return rule.input_specs[k].placements[i]
    return Replicate()


def _feeds_loss(plan: Plan, value: str) -> bool:
    return any(op.role == OpRole.LOSS for op in plan.completed.graph.consumers(value))


def _layout(p: Placement, rank: int) -> str:
    """A torch placement as code (`Shard(d)` on the last dim of an activation as `Shard(-1)`)."""
    if isinstance(p, Shard):
        return "Shard(-1)" if p.dim == rank - 1 and rank > 2 else f"Shard({p.dim})"
    return "Replicate()"


#: the torch dim of each kind of module's weight that holds its output features
_COLUMN_DIM = {LINEAR: 0, CONV1D: 1, EMBEDDING: 1}


def _style_params(style: str, kind: str) -> dict[str, Placement]:
    """The torch placement a style gives a module's weight and bias on the tp axis."""
    col: dict[str, Placement] = {"weight": Shard(0), "bias": Shard(0)}
    row: dict[str, Placement] = {"weight": Shard(1), "bias": Replicate()}
    if kind == EMBEDDING:
        col, row = {"weight": Shard(1)}, {"weight": Shard(0)}
    if kind == CONV1D:  # weight [in, out]: the generated module's Conv1D styles
        col = {"weight": Shard(1), "bias": Shard(0)}
        row = {"weight": Shard(0), "bias": Replicate()}
    styles = {"ColwiseParallel": col, "RowwiseParallel": row}
    return styles.get(style.removeprefix(CONV1D_PREFIX), {})


def _module_style(plan: Plan, axis: str, module: str, params: list[ParamLayout],
                  reader: tuple[str, str] | None = None) -> Style | None:  # fmt: skip
    weight = next((p for p in params if p.attr == "weight"), params[0])
    kind = weight.kind
    placement = weight.torch_placement(axis)
    reader = reader or _forward_reader(plan, weight)

    def rank_of(value: str) -> int:
        return plan.completed.graph.type_of(value).rank

    style: Style | None = None
    prefix = CONV1D_PREFIX if kind == CONV1D else ""
    if isinstance(placement, Shard) and kind in _COLUMN_DIM and reader is not None:
        x, y = reader
        if placement.dim == _COLUMN_DIM[kind]:
            refuse_split_columns(plan, axis, weight, y)
            kwargs = []
            if kind != EMBEDDING and _on(plan, x, axis) != Replicate():
                kwargs.append(("input_layouts", _layout(_on(plan, x, axis), rank_of(x))))
            if _feeds_loss(plan, y) and _loss_gathered(plan, axis):
                kwargs.append(("output_layouts", "Replicate()"))
            elif _feeds_loss(plan, y):  # vocab-parallel loss: torch's loss_parallel()
                kwargs += [("output_layouts", "Shard(-1)"), ("use_local_output", "False")]
            style = Style(f"{prefix}ColwiseParallel", tuple(kwargs))
        else:
            kwargs = [("input_layouts", "Replicate()")] if kind == EMBEDDING else []
            out = _wanted(plan, y, axis)
            if out != Replicate():
                kwargs.append(("output_layouts", _layout(out, rank_of(y))))
                # a sequence-sharded residual stream stays a DTensor (global shape), as the
                # SequenceParallel norms keep it (module docstring)
                kwargs.append(("use_local_output", "False"))
            style = Style(f"{prefix}RowwiseParallel", tuple(kwargs))
    elif all(isinstance(p.placements[axis], Replicate) for p in params) and reader is not None:
        x, y = reader
        if kind == NORM and isinstance(_on(plan, y, axis), Shard):
            style = Style("SequenceParallel")
        elif kind in (LINEAR, CONV1D) and isinstance(_on(plan, x, axis), Shard):
            have = _layout(_on(plan, x, axis), rank_of(x))
            style = Style("PrepareModuleInput", (
                ("input_layouts", f"({have},)"), ("desired_input_layouts", "(Replicate(),)"),
                ("use_local_output", "True"),
            ))  # fmt: skip
    expected = _style_params(style.cls if style else "", kind)
    for p in params:
        want = expected.get(p.attr, Replicate())
        if p.torch_placement(axis) != want:
            what = style.cls if style else "no tensor-parallel style"
            raise ExportError(
                f"parameter {p.name!r} is placed {p.placements[axis]} on mesh axis {axis!r} "
                f"({p.torch_placement(axis)} in torch's layout), but its module {module!r} "
                f"takes {what}, which places it {want}: no DTensor style gives this layout",
                value=p.name,
                axis=axis,
                placement=str(p.placements[axis]),
            )
    return style


def _gather_once(
    plan: Plan, axis: str, by_module: dict[str, list[ParamLayout]], out: DTensorExport
) -> None:
    """One gather for the column-parallel modules that read the same activation (q, k, v;
    gate and up), as the plan prices it: the norm that produces it hands it on as a
    replicated DTensor (`SequenceParallelGathered` under sequence parallelism: one all-gather
    forward, one reduce-scatter backward; a replicated norm's output through
    `PrepareModuleOutput`: one all-reduce of the summed input gradient in backward), and the
    readers take it as it is. Each reader converting its own input would gather it (or
    all-reduce its gradient) once per reader. A sequence-parallel norm gathers for a single
    reader too (the final norm for the head), so that every gathered activation is one the
    generated module keeps as its shard for backward (`DTensorExport.regathers`)."""
    graph = plan.completed.graph
    readers: dict[str, list[str]] = {}
    for module, style in out.tp_plan.items():
        weight = next((p for p in by_module.get(module, []) if p.attr == "weight"), None)
        if weight is None or not style.cls.endswith("ColwiseParallel") or weight.kind == EMBEDDING:
            continue
        reader = _forward_reader(plan, weight)
        if reader is not None:
            readers.setdefault(reader[0], []).append(module)
    producers: dict[str, str] = {}  # a norm's output -> the norm module
    for module, group in by_module.items():
        scale = next((p for p in group if p.kind == NORM and p.attr == "weight"), None)
        reader = _forward_reader(plan, scale) if scale is not None else None
        if reader is not None:
            producers[reader[1]] = module
    for value, modules in readers.items():
        norm = producers.get(value)
        if norm is None:
            continue
        inside = [op for op in graph.consumers(value) if op.role == OpRole.FORWARD]
        if not all(any(op.scope == m or op.scope.startswith(m + ".") for m in modules)
                   for op in inside):  # fmt: skip
            continue  # another reader wants the value as the plan lays it out
        own = out.tp_plan.get(norm)
        if own is not None and own.cls == "SequenceParallel":
            out.tp_plan[norm] = Style("SequenceParallelGathered")
        elif own is None and len(modules) > 1 and _on(plan, value, axis) == Replicate():
            out.tp_plan[norm] = Style("PrepareModuleOutput", (
                ("output_layouts", "Replicate()"), ("desired_output_layouts", "Replicate()"),
                ("use_local_output", "False"),
            ))  # fmt: skip
        else:
            continue
        for m in modules:
            kept = tuple(kv for kv in out.tp_plan[m].kwargs if kv[0] != "input_layouts")
            out.tp_plan[m] = Style(out.tp_plan[m].cls, kept)


def _tied_styles(plan: Plan, axis: str, params: list[ParamLayout], out: DTensorExport) -> None:
    """A weight a linear of another module also reads (GPT-2's lm_head reads the token
    embedding as [vocab, hidden]): that module is styled as a linear holding the weight as
    placed, and the generated module ties its `weight` to the parameter again afterwards
    (a style replaces the parameters it shards, which unties them)."""
    for p in params:
        for op in plan.completed.graph.consumers(p.name):
            linear = op.kind in ("matmul", "linear") and op.inputs[1:2] == (p.name,)
            if op.role != OpRole.FORWARD or not linear or op.scope in ("", p.module):
                continue
            alias = f"{op.scope}.weight"
            # the readers agree on its layout (`parameter_layouts`): as stored, as nn.Linear's
            as_read = replace(p, name=alias, module=op.scope, attr="weight", kind=LINEAR)
            style = _module_style(plan, axis, op.scope, [as_read], (op.inputs[0], op.outputs[0]))
            out.tied[alias] = p.name
            if style is not None:
                out.tp_plan[op.scope] = style


def derive_export(plan: Plan) -> DTensorExport:
    """Decide the generated module's mesh, styles and FSDP units (module docstring)."""
    params = parameter_layouts(plan)
    mesh = plan.strategy.mesh
    default = tuple(range(mesh.size))
    out = DTensorExport(
        model=plan.model.name,
        mesh_shape=tuple(mesh.shape),
        mesh_axes=tuple(mesh.axis_names),
        mesh_ranks=None if tuple(mesh.ranks) == default else tuple(mesh.ranks),
        roles=_axis_roles(plan, params),
        params=params,
        recompute=plan.strategy.recompute,
    )
    for role in (TENSOR, FSDP):
        axes = [a for a, r in out.roles.items() if r == role]
        if len(axes) > 1:
            raise ExportError(
                f"mesh axes {', '.join(map(repr, axes))} are both {role}-parallel; the DTensor "
                f"export applies {role} parallelism on one mesh axis",
                axis=axes[1],
            )
    out.data_axes = [a for a, r in out.roles.items() if r == DATA]
    out.tp_axis = next((a for a, r in out.roles.items() if r == TENSOR), None)
    out.fsdp_axis = next((a for a, r in out.roles.items() if r == FSDP), None)
    by_module: dict[str, list[ParamLayout]] = {}
    for p in params:
        by_module.setdefault(p.module, []).append(p)
    if out.tp_axis is not None:
        check_kv_heads(plan, out.tp_axis, {p.name: p for p in params})
        for module, group in by_module.items():
            style = _module_style(plan, out.tp_axis, module, group)
            if style is not None:
                out.tp_plan[module] = style
            else:
                refuse_plain_into_sharded(plan, out.tp_axis, module, group)
        _tied_styles(plan, out.tp_axis, params, out)
        _gather_once(plan, out.tp_axis, by_module, out)
    if out.fsdp_axis is not None:
        for p in params:
            placement = p.torch_placement(out.fsdp_axis)
            if isinstance(placement, Shard):
                out.fsdp_dims[p.name] = placement.dim
    units = {m.group(1) for p in params if (m := _LAYER_UNIT.match(p.name))}
    out.fsdp_units = sorted(units, key=_natural)
    _fsdp_tail_and_dtypes(plan, out)
    _notes(plan, out)
    return out


def _fsdp_tail_and_dtypes(plan: Plan, out: DTensorExport) -> None:
    """The modules whose parameters come after the last layer's (`fsdp_tail`), and the
    16-bit dtypes the plan gathers parameters and reduces gradients in on the data axes."""
    layered = [i for i, p in enumerate(out.params)
               if any(p.name.startswith(u + ".") for u in out.fsdp_units)]  # fmt: skip
    if layered:
        tied = {alias.rpartition(".")[0] for alias in out.tied}
        for p in out.params[layered[-1] + 1 :]:
            if p.module and p.module not in out.fsdp_tail and p.module not in tied:
                out.fsdp_tail.append(p.module)
    axes = set(out.data_axes) | ({out.fsdp_axis} if out.fsdp_axis else set())
    if not axes or not out.params:
        return
    dtype = plan.model.value(out.params[0].name).type.dtype
    if dtype not in ("bfloat16", "float16"):
        return
    out.param_dtype = out.reduce_dtype = dtype
    program = plan.program
    for op in program.ops:
        if (
            op.comm is not None
            and op.comm.axis in axes
            and op.kind in ("reduce_scatter", "all_reduce")
        ):
            name = op.inputs[0]
            if ".grad" in name and name in program.types:
                out.reduce_dtype = program.types[name].dtype
                break


def _natural(name: str) -> list[object]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _notes(plan: Plan, out: DTensorExport) -> None:
    zero = [t for t in plan.strategy.templates if t.name in ZERO_STATE_ONLY]
    for t in zero:
        out.notes.append(
            f"{t.name} on mesh axis {t.axis!r} has no exact DTensor form (it shards only the "
            f"optimizer state{' and the gradients' if t.name == 'zero2' else ''}): exported as "
            "data parallelism (replicate); "
            "fully_shard(reshard_after_forward=False) is the closest FSDP setting"
        )
    if out.recompute == "selective":
        out.module_notes.append(
            "recompute 'selective' is not applied here: torchtitan's selective activation "
            'checkpointing (selective_ac_option = "op") is the equivalent'
        )
    if plan.pipeline is not None:
        a = plan.pipeline.assignment
        units = [u for u in out.fsdp_units if u.rsplit(".", 1)[-1].isdigit()]
        for stage in range(a.pp):
            layers = set(a.layers_of_stage(stage))
            out.pipeline_stages[stage] = [u for u in units if int(u.rsplit(".", 1)[1]) in layers]
        out.module_notes.append(
            f"the {PIPELINE_AXIS!r} axis is not applied by parallelize(): split the model into "
            "PIPELINE_STAGES with torch.distributed.pipelining (schedule "
            f"{plan.pipeline.options.schedule}, {plan.pipeline.options.microbatches} "
            "micro-batches) and call parallelize() on each stage's module"
        )
    if out.tp_axis is not None:
        out.module_notes.append(
            "tensor parallelism splits attention by heads: the model must infer its local head "
            "count, e.g. q.view(batch, seq, -1, head_dim)"
        )
        out.loss_gathered = _loss_gathered(plan, out.tp_axis)
        if not out.loss_gathered:
            out.module_notes.append(
                "the plan feeds the loss vocab-sharded logits: the model returns them as a "
                "DTensor sharded on the vocabulary (LOSS_PARALLEL); compute the cross entropy "
                "and its backward inside torch.distributed.tensor.parallel.loss_parallel()"
            )


def _loss_gathered(plan: Plan, axis: str) -> bool:
    """Whether the plan reads the loss's logits replicated on `axis`."""
    i = _axis_index(plan, axis)
    for op in plan.completed.graph.ops:
        if op.kind == "cross_entropy":
            spec = plan.completed.rules[op.name].input_specs[0]
            return isinstance(spec.placements[i], Replicate)
    return True


def render_dtensor(plan: Plan) -> str:
    """The generated Python module's text (module docstring)."""
    from shardlab.export.dtensor_render import render

    return render(derive_export(plan), plan)
