"""What the DTensor export refuses beyond a single parameter's placement: layouts that every
parameter of a module can take but the model's own code cannot read.

What it is for: `export.dtensor.derive_export` calls these on the tensor-parallel axis; each
raises an `ExportError` naming the parameter, the mesh axis and the op:

- `check_kv_heads`: an attention whose query heads the plan splits while a key/value
  projection stays replicated (`megatron_tp` with fewer kv heads than ranks, or heads split
  locally after a replicated fused projection). Each rank's query heads would need their own
  slice of that projection's output; a torch module handed local query heads cannot do that.
- `refuse_split_columns`: a column-sharded fused projection whose output the model splits into
  parts by their global sizes (GPT-2's `c_attn`: q, k, v). A rank's contiguous block of
  columns holds whole columns of some parts and none of others.
- `refuse_plain_into_sharded`: a module left without a style hands on a plain tensor; where
  the plan combines it with a value sharded on the axis (a replicated attention's output or a
  position table added to the sequence-sharded residual stream), torch refuses to mix a
  plain tensor with a DTensor at run time, so the export refuses it first.
"""

from __future__ import annotations

from shardlab.export.parameters import ExportError, ParamLayout
from shardlab.ir import Op, OpRole, ValueKind
from shardlab.ops import get_op
from shardlab.placement import Placement, Replicate, Shard
from shardlab.plan import Plan


def placement_on(plan: Plan, value: str, axis: str) -> Placement:
    """The plan's placement of `value` on mesh `axis`."""
    index = list(plan.completed.mesh.axis_names).index(axis)
    return plan.completed.specs[value].placements[index]


def _split_features(plan: Plan, value: str) -> Op | None:
    """The forward op splitting `value`'s last dim (its output features) into parts, following
    reshapes that keep that dim: a fused projection (GPT-2's c_attn: q, k and v)."""
    graph = plan.completed.graph
    todo = [value]
    while todo:
        name = todo.pop()
        shape = graph.type_of(name).shape
        for op in graph.consumers(name):
            if op.role != OpRole.FORWARD:
                continue
            if op.kind in ("split", "slice") and op.attrs.get("dim") in (-1, len(shape) - 1):
                return op
            if op.kind == "reshape" and graph.type_of(op.outputs[0]).shape[-1:] == shape[-1:]:
                todo.append(op.outputs[0])
    return None


def refuse_split_columns(plan: Plan, axis: str, weight: ParamLayout, out: str) -> None:
    """Refuse a column-sharded fused projection: the model splits its output features into
    parts by their global sizes, which a rank's contiguous block of columns does not hold."""
    split = _split_features(plan, out)
    if split is None:
        return
    raise ExportError(
        f"parameter {weight.name!r} is placed {weight.placements[axis]} on mesh axis {axis!r}: "
        f"its module {weight.module!r} is a fused projection whose output op {split.name!r} "
        f"splits into parts ({split.kind} {dict(split.attrs)}), and a contiguous shard of its "
        "columns gives each rank whole columns of some parts instead of a share of each, which "
        "the model's own split cannot read; no DTensor style gives this layout (keep "
        f"{weight.module!r} replicated on {axis!r})",
        value=weight.name,
        axis=axis,
        op=split.name,
        placement=str(weight.placements[axis]),
    )


def _projection_of(plan: Plan, value: str) -> str | None:
    """The parameter of the linear module `value` is computed from, following each forward
    op's first input back (k_heads <- transpose <- view <- k_proj's matmul)."""
    graph = plan.completed.graph
    for _ in range(64):
        op = graph.producer(value)
        if op is None or op.role != OpRole.FORWARD or not op.inputs:
            return None
        if op.kind in ("linear", "matmul") and len(op.inputs) > 1:
            weight = op.inputs[1]
            return weight if graph.value(weight).kind == ValueKind.PARAM else None
        value = op.inputs[0]
    return None


def check_kv_heads(plan: Plan, axis: str, params: dict[str, ParamLayout]) -> None:
    """Refuse an attention whose query heads the plan splits on `axis` while its key or value
    projection stays replicated (fewer kv heads than ranks): each rank's query heads read
    their own kv heads there, which a torch module given local query heads cannot do."""
    for op in plan.completed.graph.ops:
        if op.role != OpRole.FORWARD or get_op(op.kind).family != "attention":
            continue
        if not isinstance(placement_on(plan, op.inputs[0], axis), Shard):
            continue
        for kv in op.inputs[1:3]:
            weight = params.get(_projection_of(plan, kv) or "")
            if weight is not None and isinstance(weight.placements[axis], Replicate):
                heads = (plan.model.meta or {}).get("kv_heads")
                size = plan.completed.mesh.axis_size(axis)
                hint = (
                    f"{heads} kv heads do not divide over {size} ranks: use a tensor-parallel "
                    "size that divides them"
                    if isinstance(heads, int) and heads % size
                    else "shard the projection's columns (megatron_tp) or keep the attention "
                    "replicated"
                )
                raise ExportError(
                    f"attention {op.name!r} splits its query heads on mesh axis {axis!r} but "
                    f"keeps {weight.name!r} (its keys and values) replicated: each rank's query "
                    "heads would need their own slice of its output, which no DTensor style "
                    f"gives; {hint}",
                    value=weight.name,
                    axis=axis,
                    op=op.name,
                )


#: forward ops that combine activations elementwise (where a plain tensor meets a DTensor)
_COMBINING = frozenset({"add", "sub", "mul", "div"})
#: forward ops that pass one value on unchanged in layout (followed from a module's output)
_PASS_THROUGH = frozenset({"reshape", "slice", "broadcast_to", "cast", "dropout", "transpose"})


def refuse_plain_into_sharded(
    plan: Plan, axis: str, module: str, params: list[ParamLayout]
) -> None:
    """Refuse a module without a tensor-parallel style whose output (a plain tensor in torch)
    the plan combines with a value sharded on `axis` (a DTensor or a local shard there)."""
    graph = plan.completed.graph
    names = {p.name for p in params}

    def inside(op: Op) -> bool:
        return op.scope == module or op.scope.startswith(module + ".")

    todo = [o for p in params for op in graph.consumers(p.name)
            if op.role == OpRole.FORWARD and inside(op) for o in op.outputs[:1]]  # fmt: skip
    seen: set[str] = set()
    while todo:
        value = todo.pop()
        if value in seen or not isinstance(placement_on(plan, value, axis), Replicate):
            continue
        seen.add(value)
        for op in graph.consumers(value):
            if op.role != OpRole.FORWARD:
                continue
            if op.kind not in _COMBINING:  # a styled module converts what it reads itself
                if op.kind in _PASS_THROUGH or inside(op):
                    todo.extend(op.outputs[:1])
                continue
            others = [
                v for v in op.inputs if v != value and graph.value(v).kind == ValueKind.ACTIVATION
            ]
            sharded = [v for v in others if isinstance(placement_on(plan, v, axis), Shard)]
            if sharded and not inside(op):
                raise ExportError(
                    f"module {module!r} keeps its parameters replicated on mesh axis {axis!r} "
                    f"and takes no DTensor style, so its output is a plain tensor, but op "
                    f"{op.name!r} combines it ({value!r}) with {sharded[0]!r}, which the plan "
                    f"shards ({placement_on(plan, sharded[0], axis)}) on {axis!r}: torch does "
                    "not mix a plain tensor with a DTensor; shard the module as the template "
                    "does or drop sequence parallelism",
                    value=sorted(names)[0],
                    axis=axis,
                    op=op.name,
                )
            if op.kind in _PASS_THROUGH or inside(op):
                todo.extend(op.outputs[:1])
