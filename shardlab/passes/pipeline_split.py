"""Split one micro-batch's lowered program into per-stage op lists (see `passes.pipeline`).

`Split` decides, once, where every op of the lowered program goes: a (model chunk, phase)
`Place`, or "free" (depends on no source: run up front on every stage that reads it). It
finds the values that cross stages and the gradients the optimizer reads (accumulated over
micro-batches). `Split.stage_program` then lays out one stage's program for a schedule.

Tied weights (`TiedWeight`, Megatron-LM's embedding group): a parameter read on several
stages (the embedding on the first, `lm_head` on the last) is held by each of them, fed
the same initial value. Each stage accumulates its own partial gradient over the
micro-batches; after its last backward unit the stages of the group all-reduce the
partials (each sends its partial to the others, receives theirs and sums them all in one
fixed order, phase `T`: the serial graph's `<param>.grad_acc` adds), and each runs the same
optimizer ops on its replica, so the replicas stay bit-identical. A 16-bit weight's partials
are its float32 main gradient's (`pipeline_tied.float32_partials`): cast where they are
made, accumulated, exchanged and summed in float32, as Megatron-LM's `main_grad` is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from shardlab.autodiff import find_loss
from shardlab.ir import Graph, OpRole, TensorType, ValueKind
from shardlab.mesh import Mesh
from shardlab.passes.pipeline_schedule import PipelineError, Unit
from shardlab.passes.pipeline_stages import StageAssignment
from shardlab.passes.pipeline_tied import (
    TiedWeight,
    float32_partials,
    grad_sum_ops,
    tie_weight,
    tied_stages,
)
from shardlab.placement import DistSpec
from shardlab.program import DistOp, DistProgram
from shardlab.reuse import Reuse

#: F forward, B backward, T a tied weight's gradient all-reduce, O optimizer
Phase = Literal["F", "B", "T", "O"]


@dataclass(frozen=True, slots=True)
class Place:
    """Where an op runs: a model chunk and a phase (F forward/loss, B backward, T a tied
    weight's gradient all-reduce, O optimizer)."""

    chunk: int
    phase: Phase


@dataclass(frozen=True, slots=True)
class Feed:
    """Where a stage's source value comes from: a global source, or its micro-batch slice."""

    source: str
    microbatch: int | None = None


@dataclass(frozen=True, slots=True)
class Crossing:
    """A value (of every micro-batch) produced on stage `src` and read on stage `dst`."""

    value: str
    src: int
    dst: int


@dataclass
class StageBuild:
    """One stage's program and what the runtime needs to feed it and read it back."""

    program: DistProgram
    feeds: dict[str, Feed]
    outputs: dict[str, str]  # serial name -> program value
    losses: list[str]  # the loss value of each micro-batch held here


def phase_of_role(role: OpRole) -> Phase:
    """F for forward and loss ops, B for backward, O for optimizer."""
    if role == OpRole.OPTIMIZER:
        return "O"
    return "B" if role == OpRole.BACKWARD else "F"


def serial_name(value: str) -> str:
    """The serial value a program value holds (`x@S(0)R` and `x~P(sum)` hold `x`)."""
    return value.split("@", 1)[0].split("~", 1)[0]


#: The places of a training graph's ops under an assignment, kept per worker process (a
#: plan's build and its costing both ask; the entry keeps the graph alive, so its id is
#: not reused while the entry lives).
PLACES = Reuse[tuple[Graph, dict[str, "Place"]]]("serial places", 8)


def serial_places(training: Graph, assignment: StageAssignment) -> dict[str, Place]:
    """The place of every op of the serial training graph (rules: `passes.pipeline`); a
    new dict the caller may change."""
    kept, place = PLACES.get((id(training), assignment),
                             lambda: (training, _serial_places(training, assignment)))  # fmt: skip
    assert kept is training
    return dict(place)


def _serial_places(training: Graph, assignment: StageAssignment) -> dict[str, Place]:
    place: dict[str, Place] = {}
    chunk_of: dict[str, int] = {}
    pending = []
    for op in training.ops:
        phase = phase_of_role(op.role)
        if phase == "O":
            continue
        chunk = assignment.chunk_of_scope(op.scope)
        if chunk is None:
            ins = [chunk_of[v] for v in op.inputs if v in chunk_of]
            chunk = (max(ins) if phase == "F" else min(ins)) if ins else None
        if chunk is None:
            pending.append(op)
            continue
        place[op.name] = Place(chunk, phase)
        chunk_of.update((v, chunk) for v in op.outputs)
    for op in reversed(pending):  # no scope, no placed input: follow the readers
        chunks = [
            place[r.name].chunk
            for v in op.outputs
            for r in training.consumers(v)
            if r.name in place
        ]
        place[op.name] = Place(min(chunks, default=0), phase_of_role(op.role))
    for tied in tied_stages(training, assignment, place):
        chunk = min(place[r.name].chunk for r in training.consumers(tied) if r.name in place)
        for name in grad_sum_ops(training, tied):
            place[name] = Place(chunk, "T")
    for param in training.values_of_kind(ValueKind.PARAM):
        readers = [place[r.name] for r in training.consumers(param.name) if r.name in place]
        if not readers:
            continue
        chunk = min(p.chunk for p in readers)
        for r in training.consumers(param.name):
            if r.role == OpRole.OPTIMIZER and r.inputs[0] == param.name:
                place[r.name] = Place(chunk, "O")
    return place


class Split:
    """Where each op of one micro-batch's program goes, and what crosses stages."""

    def __init__(
        self,
        program: DistProgram,
        training: Graph,
        assignment: StageAssignment,
        microbatches: int,
        axis: str = "pp",
    ) -> None:
        serial = serial_places(training, assignment)
        tied = tied_stages(training, assignment, serial)
        #: the program split: a 16-bit tied weight's partial gradients cast to float32
        #: where they are made (Megatron-LM's main_grad), so their sums and exchange are
        #: float32 (`pipeline_tied.float32_partials`)
        wide = float32_partials(program, training, tied)
        serial.update((cast, serial[maker]) for cast, maker in wide.casts.items())
        self.program, self.training, self.assignment = wide.program, training, assignment
        self.microbatches, self.axis = microbatches, axis
        ops = self.program.ops
        self.producer = {v: i for i, op in enumerate(ops) for v in op.outputs}
        self.readers: dict[str, list[int]] = {}
        self.free: set[int] = set()
        free_values: set[str] = set()
        for i, op in enumerate(ops):
            for v in op.inputs:
                self.readers.setdefault(v, []).append(i)
            if all(v in free_values for v in op.inputs):
                self.free.add(i)
                free_values.update(op.outputs)
        self.place = self._places(serial)
        #: parameters read on several stages (Megatron-LM's embedding group), and by op
        self.tied = [tie_weight(self, p, st) for p, st in tied.items()]
        self.tied_of = {i: w for w in self.tied for i in w.replicated}
        #: per stage, the placed ops it runs, in program order
        self.on_stage: dict[int, list[int]] = {}
        for i in sorted(self.place):
            for s in self.stages_of(i):
                self.on_stage.setdefault(s, []).append(i)
        params = {w.param for w in self.tied}
        #: reshards of tied weights alone (an FSDP gather): every stage that reads one makes
        #: its own copy from its replica instead of receiving it
        self.local_copies = {
            i
            for i, op in enumerate(ops)
            if i not in self.free
            and op.name not in serial
            and op.inputs
            and all(v in params for v in op.inputs)
            and self.place[i].phase in ("F", "B")
        }
        self.crossing = self._crossing()
        self.roots = self._roots()
        #: values written by optimizer ops and tied all-reduces (once per step)
        self.updated = {
            v
            for i, op in enumerate(ops)
            if i in self.place and self.place[i].phase in ("T", "O")
            for v in op.outputs
        }
        sources = {v for v in self.program.types if v not in self.producer}
        #: values that keep their name in every micro-batch
        self.shared = (
            free_values | self.updated | {v for v in sources if not self._is_batch_source(v)}
        )
        self.loss_name = str(training.meta.get("loss") or find_loss(training))
        self.seed = self._seed()
        self.loss = self.program.values[self.loss_name]

    def _is_batch_source(self, value: str) -> bool:
        v = self.training.values.get(value)
        return v is not None and v.kind == ValueKind.INPUT

    def stage(self, i: int) -> int:
        """The stage op i runs on (the first of its group for a tied weight's ops)."""
        return self.assignment.stage_of_chunk(self.place[i].chunk)

    def stages_of(self, i: int) -> tuple[int, ...]:
        """Every stage op i runs on: its tied weight's group, else its one stage."""
        tied = self.tied_of.get(i)
        return tied.stages if tied is not None else (self.stage(i),)

    def holds(self, i: int, s: int) -> bool:
        """Whether stage s runs op i."""
        return s in self.stages_of(i)

    def _places(self, serial: dict[str, Place]) -> dict[int, Place]:
        """Places of the program's ops: compute ops by name, reshards (and the ops passes add,
        such as gradient buckets' pack and unpack) by their neighbours."""
        ops = self.program.ops
        place: dict[int, Place] = {}
        for i, op in enumerate(ops):
            if i not in self.free and op.comm is None and op.name in serial:
                place[i] = serial[op.name]
        for i in reversed(range(len(ops))):
            op = ops[i]
            if i in self.free or i in place:
                continue
            readers = [j for v in op.outputs for j in self.readers.get(v, []) if j in place]
            if op.attrs.get("consumer") != "placement":
                if readers:
                    place[i] = place[min(readers)]
            elif readers and all(place[j].phase == "O" for j in readers):
                place[i] = place[min(readers)]
        for i, op in enumerate(ops):
            if i in self.free or i in place:
                continue
            src = self.producer.get(op.inputs[0]) if op.inputs else None
            if src is None or src not in place:
                raise PipelineError(f"cannot place reshard {op.name!r} on a pipeline stage")
            place[i] = place[src]
        return place

    def _crossing(self) -> list[Crossing]:
        """Values produced on one stage and read on another, in program order."""
        out: dict[tuple[str, int], Crossing] = {}
        for i, op in enumerate(self.program.ops):
            if i in self.free:
                continue
            tied = self.tied_of.get(i)
            for v in op.inputs:
                j = self.producer.get(v)
                if j is None or j in self.free:
                    continue
                if tied is not None:  # partials are exchanged; the rest is on every stage
                    if v not in tied.partials and j not in tied.replicated:
                        raise PipelineError(
                            f"op {op.name!r} of tied weight {tied.param!r} runs on stages "
                            f"{list(tied.stages)} but reads {v!r}, made on stage "
                            f"{self.stage(j)} only",
                            value=v,
                        )
                    continue
                if self.stage(i) in self.stages_of(j) or j in self.local_copies:
                    continue
                if "O" in (self.place[i].phase, self.place[j].phase):
                    raise PipelineError(
                        f"optimizer value {v!r} crosses from stage {self.stage(j)} to stage "
                        f"{self.stage(i)} (op {op.name!r}); optimizer ops stay on their stage",
                        value=v,
                    )
                out.setdefault((v, self.stage(i)), Crossing(v, self.stage(j), self.stage(i)))
        return list(out.values())

    def _roots(self) -> set[str]:
        """Per-micro-batch values the optimizer reads: gradients, summed over micro-batches."""
        roots = {v for tied in self.tied for v in tied.partials}
        for i, op in enumerate(self.program.ops):
            if i in self.free or self.place[i].phase != "O":
                continue
            for v in op.inputs:
                j = self.producer.get(v)
                if j is None or j in self.free or self.place[j].phase in ("T", "O"):
                    continue
                value = self.training.values.get(serial_name(v))
                if value is None or value.kind != ValueKind.GRAD:
                    raise PipelineError(
                        f"optimizer op {op.name!r} reads {v!r}, a per-micro-batch value that is "
                        "not a gradient; only gradients are accumulated over micro-batches",
                        op=op.name,
                    )
                roots.add(v)
        return roots

    def _seed(self) -> int:
        """The program index of the loss gradient seed (a `fill` of `<loss>.grad`)."""
        loss = self.loss_name
        for i, op in enumerate(self.program.ops):
            if op.kind == "fill" and tuple(map(serial_name, op.outputs)) == (f"{loss}.grad",):
                if i not in self.free:
                    break
                return i
        raise PipelineError(f"the training graph has no gradient seed `fill` for loss {loss!r}")

    def acc_name(self, root: str, m: int) -> str:
        """The running gradient sum after micro-batch m (micro-batch 0's gradient starts it)."""
        if m == 0:
            return f"{root}#0"
        return f"{root}.acc" if m == self.microbatches - 1 else f"{root}.acc#{m}"

    def stage_program(self, s: int, units: Sequence[Unit], mesh: Mesh) -> StageBuild:
        """Stage `s`'s program on its sub-mesh: free ops, the units in order, the optimizer."""
        return _StageWriter(self, s, mesh).write(units)


class _StageWriter:
    """Appends one stage's ops, renaming per micro-batch and inserting send/recv/add."""

    def __init__(self, split: Split, s: int, mesh: Mesh) -> None:
        self.split, self.s, self.mesh = split, s, mesh
        self.src = split.program
        self.ops: list[DistOp] = []
        self.types: dict[str, TensorType] = {}
        self.specs: dict[str, DistSpec] = {}
        self.made: dict[str, str] = {}  # value -> the op that defines it here
        self.feeds: dict[str, Feed] = {}
        self.received: set[str] = set()
        self.sends: dict[str, list[int]] = {}
        for c in split.crossing:
            if c.src == s:
                self.sends.setdefault(c.value, []).append(c.dst)

    def name(self, v: str, m: int | None) -> str:
        return v if m is None or v in self.split.shared else f"{v}#{m}"

    def declare(self, new: str, base: str, m: int | None) -> None:
        if new in self.specs:
            return
        self.types[new] = self.src.types[base]
        self.specs[new] = DistSpec(self.mesh, self.src.specs[base].placements)
        if base not in self.split.producer:  # a source: fed by the runtime
            batch = self.split._is_batch_source(base)
            self.feeds[new] = Feed(base, m if batch else None)

    def add(self, op: DistOp) -> None:
        deps = tuple(sorted({self.made[v] for v in op.inputs if v in self.made}))
        self.ops.append(replace(op, deps=deps))
        self.made.update((v, op.name) for v in op.outputs)

    def emit(self, i: int, m: int | None, inputs: Sequence[str] | None = None) -> DistOp:
        """Op i of the source program for micro-batch m (None: shared, not renamed)."""
        op = self.src.ops[i]
        ins = tuple(inputs) if inputs is not None else tuple(self.name(v, m) for v in op.inputs)
        outs = tuple(self.name(v, m) for v in op.outputs)
        for new, base in zip((*ins, *outs), (*op.inputs, *op.outputs), strict=True):
            self.declare(new, base, m)
        name = op.name if m is None else f"{op.name}#{m}"
        new_op = replace(op, name=name, inputs=ins, outputs=outs)
        if i == self.split.seed:
            value = float(op.attrs["value"]) / self.split.microbatches
            new_op = replace(new_op, attrs={**op.attrs, "value": value})
        if op.kind == "dropout" and m:  # micro-batch m's rows of the batch's masks
            offset = m * self.src.types[op.inputs[0]].numel
            new_op = replace(new_op, attrs={**op.attrs, "offset": offset})
        self.add(new_op)
        return new_op

    def p2p(self, kind: str, v: str, m: int, peer: int, scope: str) -> None:
        tag = self.name(v, m)
        arrow = "->" if kind == "send" else "<-"
        where = "read on" if kind == "send" else "produced on"
        self.add(
            DistOp(
                f"{kind}:{tag}{arrow}{peer}",
                kind,
                (tag,) if kind == "send" else (),
                () if kind == "send" else (tag,),
                f"comm:{self.split.axis}",
                OpRole.COMM,
                scope=scope,
                attrs={"peer_stage": peer, "tag": tag, "value": v, "microbatch": m},
                reason=f"{v} of micro-batch {m} is {where} stage {peer}",
            )
        )
        self.declare(tag, v, m)

    def accumulate(self, root: str, m: int, scope: str) -> None:
        """Add micro-batch m's gradient `root` into the running sum."""
        total, acc = self.split.acc_name(root, m - 1), self.split.acc_name(root, m)
        reason = "sum the gradients of the micro-batches"
        op = DistOp(
            f"{root}.acc_add#{m}",
            "add",
            (total, f"{root}#{m}"),
            (acc,),
            "compute",
            OpRole.BACKWARD,
            scope=scope,
            reason=reason,
        )
        self.add(op)
        self.declare(acc, root, m)

    def write(self, units: Sequence[Unit]) -> StageBuild:
        split, s = self.split, self.s
        ops, pp, M = self.src.ops, split.assignment.pp, split.microbatches
        mine = [i for i in range(len(ops)) if i not in split.free and split.holds(i, s)]
        needed = {v for i in mine for v in ops[i].inputs}
        free = []
        for i in reversed(range(len(ops))):
            if i in split.free and needed & set(ops[i].outputs):
                free.append(i)
                needed.update(ops[i].inputs)
        for i in reversed(free):
            self.emit(i, None)
        by_unit: dict[tuple[int, str], list[int]] = {}
        for i in mine:
            by_unit.setdefault((split.place[i].chunk, split.place[i].phase), []).append(i)
        for unit in units:
            m = unit.microbatch
            for i in by_unit.get((unit.chunk * pp + s, unit.phase), []):
                for v in ops[i].inputs:
                    j = split.producer.get(v)
                    crosses = j is not None and j not in split.free and not split.holds(j, s)
                    if j in split.local_copies and self.name(v, m) not in self.made:
                        self.emit(j, m)  # this stage's own copy of a tied weight
                    elif j is not None and crosses and self.name(v, m) not in self.received:
                        self.received.add(self.name(v, m))
                        self.p2p("recv", v, m, split.stage(j), ops[i].scope)
                op = self.emit(i, m)
                for v in ops[i].outputs:
                    if v in split.roots and m > 0:
                        self.accumulate(v, m, op.scope)
                    for peer in self.sends.get(v, []):
                        self.p2p("send", v, m, peer, op.scope)
        self.exchange_partials()
        for phase in ("T", "O"):
            for i in mine:
                if split.place[i].phase == phase:
                    last = M - 1
                    ins = [split.acc_name(v, last) if v in split.roots else v
                           for v in ops[i].inputs]  # fmt: skip
                    self.emit(i, None, ins)
        return self._finish()

    def exchange_partials(self) -> None:
        """A tied weight's all-reduce, after the last backward unit: this stage sends its
        accumulated partial gradients to the other stages of the group, then receives
        theirs (sends are eager, so every stage sends before it receives)."""
        split, s = self.split, self.s
        last = split.microbatches - 1
        mine = [w for w in split.tied if s in w.stages]
        for w in mine:
            for partial, src in zip(w.partials, w.partial_stages, strict=True):
                if src == s:
                    for peer in w.stages:
                        if peer != s:
                            self.tied_p2p("send", w, partial, split.acc_name(partial, last), peer)
        for w in mine:
            for partial, src in zip(w.partials, w.partial_stages, strict=True):
                if src != s:
                    self.tied_p2p("recv", w, partial, split.acc_name(partial, last), src)

    def tied_p2p(self, kind: str, tied: TiedWeight, partial: str, acc: str, peer: int) -> None:
        """One half of the exchange of partial gradient `acc` with stage `peer`."""
        arrow = "->" if kind == "send" else "<-"
        attrs = {"peer_stage": peer, "tag": acc, "value": partial, "microbatch": None,
                 "collective": "all_reduce", "tied_weight": tied.param,
                 "group": list(tied.stages)}  # fmt: skip
        self.add(
            DistOp(
                f"tied_all_reduce:{acc}{arrow}{peer}",
                kind,
                (acc,) if kind == "send" else (),
                () if kind == "send" else (acc,),
                f"comm:{self.split.axis}",
                OpRole.COMM,
                scope=self.src.ops[self.split.producer[partial]].scope,
                attrs=attrs,
                reason=tied.reason,
            )
        )
        self.declare(acc, partial, self.split.microbatches - 1)

    def _finish(self) -> StageBuild:
        split, M = self.split, self.split.microbatches
        values: dict[str, str] = {}
        outputs: dict[str, str] = {}
        for serial, value in self.src.values.items():
            final = split.acc_name(value, M - 1) if value in split.roots else value
            if final in self.made and (value in split.shared or value in split.roots):
                values[serial] = final
                if value in split.roots or value in split.updated:
                    outputs[serial] = final
        losses = [f"{split.loss}#{m}" for m in range(M) if f"{split.loss}#{m}" in self.made]
        program = DistProgram(self.mesh, self.ops, self.types, self.specs, values)
        return StageBuild(program, self.feeds, outputs, losses)
