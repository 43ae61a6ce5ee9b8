"""Tied weights across pipeline stages: Megatron-LM's embedding group, for `Split`.

A parameter read on several stages (GPT's `embed.weight`: the embedding on the first stage,
`lm_head` on the last) is held by each of them, fed the same initial value. `tied_stages`
finds such parameters from the serial places; `grad_sum_ops` the serial ops that sum the
parameter's gradient contributions (`<param>.grad_acc*`, then `main_grad`), which run once
per step on every stage of the group (phase `T`) instead of per micro-batch on one stage.
`tie_weight` reads the lowered program: the T region (those ops and the reshards among
them), the partial gradients it reads (each accumulated over the micro-batches where it is
made, then exchanged, `pipeline_split._StageWriter.exchange_partials`) and the optimizer
ops every stage of the group runs on its replica (`TiedWeight.replicated`). Every stage
sums the same partials in the same order, so the replicas stay bit-identical.

A 16-bit weight's gradient is Megatron-LM's float32 `main_grad` (`autodiff._main_grad`),
and its embedding group all-reduces `main_grad`: `float32_partials` rewrites the lowered
program so each partial is cast to float32 where it is made, before it is accumulated over
the micro-batches, exchanged (float32 bytes) and summed (in float32) into the main gradient.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from shardlab.autodiff import HALF_GRAD_SUFFIX
from shardlab.ir import DTYPE_BYTES, Graph, Op, OpRole, TensorType, ValueKind
from shardlab.passes.pipeline_schedule import PipelineError
from shardlab.passes.pipeline_stages import StageAssignment
from shardlab.placement import DistSpec
from shardlab.program import DistOp, DistProgram

if TYPE_CHECKING:
    from shardlab.passes.pipeline_split import Place, Split

__all__ = ["MainGradPartials", "TiedWeight", "float32_partials", "grad_sum_ops",
           "gradient_value", "tie_weight", "tied_reason", "tied_stages"]  # fmt: skip


@dataclass(frozen=True, slots=True)
class TiedWeight:
    """A parameter read on several stages: each holds a replica and its partial gradient.

    `partials` are the program values of the partial gradients (each accumulated over the
    micro-batches on the stage that makes it, `partial_stages`); `reduce_ops` the program
    ops that sum them into the gradient the optimizer reads, run on every stage of the
    group after the exchange (phase `T`); `replicated` every T and O op each stage runs.
    """

    param: str
    stages: tuple[int, ...]
    partials: tuple[str, ...]
    partial_stages: tuple[int, ...]
    reduce_ops: tuple[int, ...]
    replicated: frozenset[int]

    @property
    def reason(self) -> str:
        """Why the collective runs (the `reason` of its ops)."""
        return tied_reason(self.param, self.stages)


def tied_reason(param: str, stages: Sequence[int]) -> str:
    """Why a tied weight's gradient is all-reduced between `stages`."""
    *head, last = (str(s) for s in stages)
    where = f"{', '.join(head)} and {last}"
    return (
        f"tied weight {param} is read on stages {where}: its gradient is all-reduced "
        "between them (Megatron-LM's embedding group)"
    )


def tied_stages(
    training: Graph, assignment: StageAssignment, place: dict[str, Place]
) -> dict[str, tuple[int, ...]]:
    """Parameter -> the stages that read it, for every parameter read on more than one."""
    out = {}
    for param in training.values_of_kind(ValueKind.PARAM):
        readers = [place[r.name] for r in training.consumers(param.name) if r.name in place]
        stages = tuple(sorted({assignment.stage_of_chunk(p.chunk) for p in readers}))
        if len(stages) > 1:
            out[param.name] = stages
    return out


def grad_sum_ops(training: Graph, param: str) -> list[str]:
    """The serial ops that sum a parameter's gradient contributions (`<param>.grad_acc*`)
    and cast or copy the sum into the gradient its optimizer reads (`main_grad`)."""
    opt = next(
        (r for r in training.consumers(param)
         if r.role == OpRole.OPTIMIZER and r.inputs and r.inputs[0] == param),
        None,
    )  # fmt: skip
    grad = gradient_value(training, opt) if opt is not None else None
    names: list[str] = []
    todo = [grad] if grad is not None else []
    while todo:
        op = training.producer(todo.pop())
        if op is None or op.role != OpRole.BACKWARD:
            continue
        summing = op.kind == "add" and op.name.startswith(f"{param}.grad_acc")
        if summing or op.name in (f"{param}.main_grad", f"{param}.grad_copy"):
            names.append(op.name)
            todo += op.inputs
    if not any(name.startswith(f"{param}.grad_acc") for name in names):
        raise PipelineError(
            f"parameter {param!r} is read on several pipeline stages (tied weights) but its "
            "gradient is not a sum of per-stage contributions (no `grad_acc` op)",
            value=param,
        )
    return names


def gradient_value(training: Graph, optimizer_op: Op) -> str | None:
    """The gradient an optimizer op reads (its first input of kind GRAD)."""
    for v in optimizer_op.inputs:
        value = training.values.get(v)
        if value is not None and value.kind == ValueKind.GRAD:
            return v
    return None


def tie_weight(split: Split, param: str, readers: tuple[int, ...]) -> TiedWeight:
    """The ops of tied weight `param` in `split` (whose places it updates): the T ops
    summing its gradient (with the reshards among them and any backward op reading their
    sum), its partial gradients, and the optimizer ops (and their reshards) every stage of
    the group runs. A local reshard of a partial (a slice to the sum's placement) stays
    with the partial's producer, so every stage exchanges blocks of one placement."""
    ops, place = split.program.ops, split.place
    names = set(grad_sum_ops(split.training, param))
    region = {i for i, op in enumerate(ops) if op.name in names and i in place}
    grown = True
    while grown:
        grown = False
        for i, op in enumerate(ops):
            if i in region or i in split.free or place[i].phase not in ("B", "T"):
                continue
            feeds = place[i].phase == "T" and any(
                j in region for v in op.outputs for j in split.readers.get(v, [])
            )
            fed = any(split.producer.get(v) in region for v in op.inputs)
            src = split.producer.get(op.inputs[0]) if op.inputs else None
            local = op.comm is None or op.comm.bytes_per_rank == 0
            made = place.get(src) if src is not None else None
            if feeds and not fed and local and made is not None and made.phase == "B":
                place[i] = made  # a local slice: cut the partial where it is made, so
                continue  # only the shard is exchanged
            if feeds or fed:
                place[i] = replace(place[i], phase="T")
                region.add(i)
                grown = True
    partials: dict[str, int] = {}
    for i in sorted(region):
        for v in ops[i].inputs:
            j = split.producer.get(v)
            if j is not None and j not in split.free and j not in region:
                partials.setdefault(v, split.stage(j))
    replicated = set(region)
    grown = True
    while grown:
        grown = False
        for i, op in enumerate(ops):
            if i in replicated or i in split.free or place[i].phase != "O":
                continue
            reads = param in op.inputs or any(
                split.producer.get(v) in replicated for v in op.inputs
            )
            read = any(j in replicated for v in op.outputs for j in split.readers.get(v, []))
            if reads or read:
                replicated.add(i)
                grown = True
    return TiedWeight(
        param,
        tuple(sorted({*readers, *partials.values()})),
        tuple(partials),
        tuple(partials.values()),
        tuple(sorted(region)),
        frozenset(replicated),
    )


@dataclass(frozen=True, slots=True)
class MainGradPartials:
    """A program whose 16-bit tied weights sum float32 partials (`float32_partials`).

    `casts` maps each `main_grad` op inserted for a gradient contribution to the program
    op that makes the contribution: the cast runs where that op runs, every micro-batch.
    """

    program: DistProgram
    casts: dict[str, str]


def float32_partials(
    program: DistProgram, training: Graph, params: Iterable[str]
) -> MainGradPartials:
    """`program` with the gradient of each 16-bit tied weight in `params` summed in float32,
    as Megatron-LM sums `main_grad`: every contribution `c` is cast to float32 where it is
    made (op `<c>.main_grad`, value `<c>.main`), so each stage accumulates a float32 partial
    over the micro-batches and the stages exchange and sum float32 blocks. The reshards
    between a contribution and the sum carry the float32 copy (`<c>.main@...`); the
    `<param>.grad_acc` adds write float32 and the last of them writes the main gradient
    (`<param>.grad`): the serial graph's 16-bit sum and its cast are gone. A contribution
    is read only on its way to the sum (autodiff makes it for the sum alone). A float32
    weight's gradient (no `main_grad` cast) is left as it is."""
    ops, types, specs = list(program.ops), dict(program.types), dict(program.specs)
    values = dict(program.values)
    casts: dict[str, str] = {}
    for param in params:
        names = grad_sum_ops(training, param)
        if f"{param}.main_grad" not in names:
            continue
        adds = {n for n in names if n.startswith(f"{param}.grad_acc")}
        sums = {v for n in adds for v in training.op(n).outputs}
        parts = dict.fromkeys(v for n in sorted(adds) for v in training.op(n).inputs
                              if v not in sums)  # fmt: skip
        wide: dict[str, str] = {}  # a value -> the float32 value that replaces it
        makers: set[str] = set()
        for part in parts:
            at, made = _maker(ops, training, part)
            for v in (made, *(w for op in ops[at + 1 :] for w in op.outputs)):
                if _holds(v, part):
                    wide[v] = f"{part}.main{v[len(part) :]}"
            types[wide[made]] = types[made].with_dtype("float32")
            specs[wide[made]] = specs[made]
            cast = DistOp(f"{part}.main_grad", "main_grad", (made,), (wide[made],), "compute",
                          OpRole.BACKWARD, scope=ops[at].scope,
                          reason=f"{part}: a tied weight's partial gradient, cast to its "
                          "float32 main gradient (Megatron-LM sums main_grad)")  # fmt: skip
            ops.insert(at + 1, cast)
            casts[cast.name] = ops[at].name
            makers |= {ops[at].name, cast.name}
        wide.update((v, v) for op in ops for v in op.outputs if any(_holds(v, s) for s in sums))
        ops = _widened(ops, types, specs, wide, makers)
        ops = _sum_writes_main_grad(ops, types, specs, param, adds)
        half = f"{param}{HALF_GRAD_SUFFIX}"  # the 16-bit sum is gone
        values = {k: wide.get(v, v) for k, v in values.items() if k != half}
    return MainGradPartials(DistProgram(program.mesh, ops, types, specs, values), casts)


def _holds(value: str, serial: str) -> bool:
    """Whether program value `value` holds serial value `serial` (`x`, `x@S(0)`, `x~P`)."""
    return value == serial or value.startswith((f"{serial}@", f"{serial}~"))


def _maker(ops: Sequence[DistOp], training: Graph, part: str) -> tuple[int, str]:
    """The index of the program op making gradient contribution `part`, and its value."""
    maker = training.producer(part)
    for i, op in enumerate(ops):
        if maker is not None and op.name == maker.name and op.comm is None:
            return i, op.outputs[maker.outputs.index(part)]
    raise PipelineError(
        f"gradient contribution {part!r} of a tied weight is made by no op of the program",
        value=part,
    )


def _widened(
    ops: Sequence[DistOp],
    types: dict[str, TensorType],
    specs: dict[str, DistSpec],
    wide: dict[str, str],
    makers: set[str],
) -> list[DistOp]:
    """`ops` reading and writing the float32 values of `wide` (new types and specs written
    into `types` and `specs`); a reshard among them moves float32 bytes. `makers` (the ops
    making the contributions and their casts) keep their outputs."""
    out = []
    for op in ops:
        if op.name in makers or not any(v in wide for v in (*op.inputs, *op.outputs)):
            out.append(op)
            continue
        ins = tuple(wide.get(v, v) for v in op.inputs)
        outs = tuple(wide.get(v, v) for v in op.outputs)
        comm = op.comm
        for old, new in zip(op.outputs, outs, strict=True):
            if old in wide:
                bytes_ = DTYPE_BYTES[types[old].dtype]
                types[new], specs[new] = types[old].with_dtype("float32"), specs[old]
                if comm is not None:
                    comm = replace(comm, bytes_per_rank=comm.bytes_per_rank * 4 / bytes_)
        out.append(replace(op, inputs=ins, outputs=outs, comm=comm))
    return out


def _sum_writes_main_grad(
    ops: list[DistOp],
    types: dict[str, TensorType],
    specs: dict[str, DistSpec],
    param: str,
    adds: set[str],
) -> list[DistOp]:
    """`ops` without `<param>.main_grad`: the float32 sum it cast writes its output."""
    cast = next((op for op in ops if op.name == f"{param}.main_grad"), None)
    half = cast.inputs[0] if cast is not None else None
    by = next((i for i, op in enumerate(ops) if half in op.outputs), None)
    if cast is None or by is None or ops[by].name not in adds:
        raise PipelineError(
            f"the main gradient of tied weight {param!r} is not cast from the sum of its "
            "partial gradients in the lowered program",
            value=param,
        )
    (half,), (main,) = cast.inputs, cast.outputs  # the 16-bit sum, the main gradient
    if specs[half] != specs[main]:
        raise PipelineError(
            f"tied weight {param!r}: its gradient sum {half!r} is laid out as "
            f"{specs[half]}, its main gradient {main!r} as {specs[main]}",
            value=param,
        )
    ops[by] = replace(ops[by], outputs=tuple(main if v == half else v for v in ops[by].outputs))
    del types[half], specs[half]
    return [op for op in ops if op is not cast]
