"""Memory per rank: liveness over the distributed program, broken down by what buffers hold.

`memory_profile(program, training, rank)` scans the program once to find every buffer's
owner, category and last use, then walks it once more in order: linear in program size.

- Sources (params, optimizer state incl. master weights, batch inputs, constants) are live
  the whole step, and so is each parameter's gradient in its completed placement
  (`program.values`): Megatron allocates its float32 main-gradient buffer once and keeps it
  (4 bytes a parameter: 2 + 4 + 12 = 18 with AdamW, 2 + 4 + 12/d with the distributed
  optimizer), and FSDP2 keeps each sharded gradient. A reduction of such a buffer
  (all-reduce, reduce-scatter) writes into it, as DDP's and Megatron's do; the versions a
  gradient has before its completed one (unsharded, before FSDP's reduce-scatter) are
  temporaries.
- Every other value is allocated when its op runs and freed after its last reader in program
  order; a value nobody reads is freed right after its op. Graph outputs (the loss, new
  params and state) stay live to the end of the step.
- An output of an in-place op (attr `inplace`: per output, the index of the input whose
  buffer it overwrites, or None) lives in that input's buffer and allocates nothing.
- An op's live bytes are counted while it runs: its inputs and its new outputs together.
  Ops run in program order whatever their stream (comm does not overlap compute here).

Each buffer falls in one of `CATEGORIES`, decided by the training-graph value it holds:
parameters; gradients (of params, `<p>.grad`); optimizer_state; inputs (batch inputs and
constants); activations (made in the forward and read after it: kept for backward);
temporaries (every other activation, the loss, gradients of activations); comm_buffers
(versions of a value resharded for some consumer). A comm output that *is* the value in its
completed placement (`program.values`: a ZeRO-2 gradient reduce-scattered right after the op
that made it, Megatron's all-reduced residual stream) takes the value's category instead.
A resharded version of a kept activation read by the backward is a comm buffer, but is
counted in `kept_for_backward` like any tensor the backward needs from the forward.

One rank's profile describes them all (a rank holds the largest block of an uneven shard,
`placement.local_shape`); `rank` is there for programs whose ranks differ (pipeline stages). The
program may be one pipeline stage's part of a larger one: only the sources it reads count,
and a value it reads that none of its ops makes (sent by another stage) is a buffer from
its first reader on.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shardlab.ir import DTYPE_BYTES, Graph, OpRole, ValueKind
from shardlab.placement import local_shape
from shardlab.program import DistOp, DistProgram
from shardlab.scopes import layer_scope

__all__ = ["CATEGORIES", "MODEL_STATE", "Buffer", "MemoryProfile", "layer_scope", "memory_profile"]

#: Memory categories, in the order reports list them.
CATEGORIES = (
    "parameters",
    "gradients",
    "optimizer_state",
    "inputs",
    "activations",
    "temporaries",
    "comm_buffers",
)
#: What ZeRO calls "model states": the bytes the optimizer needs per parameter.
MODEL_STATE = ("parameters", "gradients", "optimizer_state")
#: How many (op, live bytes) points `MemoryProfile.to_json` keeps by default.
TIMELINE_POINTS = 512
#: How many of the largest buffers live at the peak a profile lists.
PEAK_BUFFERS = 16

_SOURCE_CATEGORY = {
    ValueKind.PARAM: "parameters",
    ValueKind.STATE: "optimizer_state",
    ValueKind.INPUT: "inputs",
    ValueKind.CONSTANT: "inputs",
}
_FORWARD, _BACKWARD, _OPTIMIZER = 0, 1, 2
_PHASE = {
    OpRole.FORWARD: _FORWARD,
    OpRole.LOSS: _FORWARD,
    OpRole.BACKWARD: _BACKWARD,
    OpRole.OPTIMIZER: _OPTIMIZER,
}


@dataclass(frozen=True, slots=True)
class Buffer:
    """Memory one program value owns on a rank (in-place outputs own none)."""

    value: str  # the program value
    serial: str  # the training-graph value it holds
    category: str  # one of CATEGORIES
    scope: str  # scope of the training op that made `serial` ("" for sources)
    bytes: int  # per rank


@dataclass(frozen=True, slots=True)
class MemoryProfile:
    """What one rank holds over a training step: the peak, its breakdown, and a timeline."""

    rank: int
    peak_bytes: int
    peak_op: str  # the first op at which the peak is reached
    breakdown_at_peak: dict[str, int]  # category -> bytes live at the peak
    largest_at_peak: tuple[Buffer, ...]  # the PEAK_BUFFERS largest buffers live at the peak
    max_by_category: dict[str, int]  # category -> the most bytes it holds at any op
    static_bytes: int  # sources: live the whole step
    model_state: dict[str, int]  # MODEL_STATE -> bytes in completed placements
    num_params: int  # scalar parameters of the model (global)
    kept_for_backward: tuple[Buffer, ...]  # activations made in the forward, read after it
    timeline: tuple[tuple[str, int], ...]  # (op name, live bytes while it runs), every op

    @property
    def kept_for_backward_by_scope(self) -> dict[str, int]:
        """Bytes kept for backward by the scope that made them, cut after the layer
        (`layers.3.attn.q_proj` -> `layers.3`): a block is charged for its own output."""
        out: dict[str, int] = {}
        for b in self.kept_for_backward:
            key = layer_scope(b.scope)
            out[key] = out.get(key, 0) + b.bytes
        return out

    def model_state_per_param(self) -> dict[str, float]:
        """Model-state bytes per rank over the model's parameter count (2 + 2 + 12 = 16 for
        mixed-precision AdamW without sharding)."""
        return {k: v / self.num_params for k, v in self.model_state.items()}

    def to_json(self, timeline_points: int = TIMELINE_POINTS) -> dict[str, Any]:
        """JSON-ready; the timeline is thinned to `timeline_points` entries plus the peak."""
        return {
            "rank": self.rank,
            "peak_bytes": self.peak_bytes,
            "peak_op": self.peak_op,
            "breakdown_at_peak": dict(self.breakdown_at_peak),
            "largest_at_peak": [_buffer_json(b) for b in self.largest_at_peak],
            "max_by_category": dict(self.max_by_category),
            "static_bytes": self.static_bytes,
            "model_state": dict(self.model_state),
            "num_params": self.num_params,
            "kept_for_backward_by_scope": self.kept_for_backward_by_scope,
            "timeline": [list(p) for p in _thin(self.timeline, timeline_points, self.peak_op)],
        }


def memory_profile(program: DistProgram, training: Graph, rank: int | None = None) -> MemoryProfile:
    """Liveness of every buffer of `program` on `rank` (default: the mesh's first rank);
    `training` is the serial graph it was lowered from (value kinds, scopes, outputs)."""
    rank = program.mesh.ranks[0] if rank is None else rank
    program.mesh.coord(rank)  # a MeshError naming the rank if it is not on the mesh
    scan = _Scan(program, training)
    ops = program.ops
    frees: list[list[Buffer]] = [[] for _ in ops]
    kept = scan.pinned | scan.persistent
    for buf in scan.buffers.values():
        if buf.value in scan.born and buf.value not in kept:
            frees[scan.last[buf.value]].append(buf)
    live = dict.fromkeys(CATEGORIES, 0)
    for buf in scan.buffers.values():
        if buf.value not in scan.born or buf.value in scan.persistent:
            live[buf.category] += buf.bytes
    static = total = sum(live.values())
    peak, peak_at, breakdown, top = static, 0, dict(live), dict(live)
    timeline: list[tuple[str, int]] = []
    for i, op in enumerate(ops):
        for out in op.outputs:
            new = scan.buffers.get(out)
            if new is not None and out not in scan.persistent:
                live[new.category] += new.bytes
                total += new.bytes
        timeline.append((op.name, total))
        if total > peak or i == 0:
            peak, peak_at, breakdown = total, i, dict(live)
        for c in CATEGORIES:
            top[c] = max(top[c], live[c])
        for buf in frees[i]:
            live[buf.category] -= buf.bytes
            total -= buf.bytes
    return MemoryProfile(
        rank=rank,
        peak_bytes=peak,
        peak_op=ops[peak_at].name if ops else "",
        breakdown_at_peak=breakdown,
        largest_at_peak=tuple(heapq.nlargest(PEAK_BUFFERS, scan.live_at(peak_at), _size)),
        max_by_category=top,
        static_bytes=static,
        model_state=scan.model_state(),
        num_params=training.num_params(),
        kept_for_backward=tuple(b for b in scan.buffers.values() if b.value in scan.kept),
        timeline=tuple(timeline),
    )


class _Scan:
    """One pass over the program: which buffer each value lives in, what it holds, when it
    is made and last used, and which activations the backward keeps."""

    def __init__(self, program: DistProgram, training: Graph) -> None:
        self.program = program
        self.training = training
        self._sizes: dict[tuple[object, object], int] = {}
        phase = _phases(program.ops)
        self.serial: dict[str, str] = {}  # program value -> training value it holds
        self.owner: dict[str, str] = {}  # program value -> the value whose buffer it uses
        self.born: dict[str, int] = {}  # buffer -> index of the op that made it
        self.last: dict[str, int] = {}  # buffer -> index of the last op touching it
        made_fwd: set[str] = set()
        read_late: set[str] = set()
        comm_made: set[str] = set()
        read = {v for op in program.ops for v in op.inputs}
        self.grads = {f"{v.name}.grad" for v in training.values_of_kind(ValueKind.PARAM)}
        #: the gradients' buffers kept all step (module docstring): a reduction of one
        #: (all-reduce, reduce-scatter) writes into it, as Megatron's and DDP's do
        self.persistent = {x for g in self.grads if (x := program.values.get(g)) is not None}
        for name in training.sources:
            if name in read:
                self.serial[name] = self.owner[name] = name
        for i, op in enumerate(program.ops):
            for v in op.inputs:
                if v not in self.owner:  # made on another pipeline stage: received here
                    self.owner[v], self.born[v] = v, i
                    self.serial[v] = v.split("~", 1)[0].split("@", 1)[0]
                    if phase[i] == _FORWARD:
                        made_fwd.add(v)
                self.last[self.owner[v]] = i
                if phase[i] != _FORWARD:
                    read_late.add(v)
            inplace = op.attrs.get("inplace")
            for j, out in enumerate(op.outputs):
                self.serial[out] = _serial_of(op, j, training)
                src = inplace[j] if isinstance(inplace, list) and j < len(inplace) else None
                if src is None and _reduces_in_place(op, self.owner, self.persistent):
                    src = 0
                self.owner[out] = self.owner[op.inputs[src]] if isinstance(src, int) else out
                if self.owner[out] == out:
                    self.born[out] = i
                self.last[self.owner[out]] = i
                if phase[i] == _FORWARD:
                    made_fwd.add(out)
                if op.is_comm:
                    comm_made.add(out)
        outputs = (program.values.get(o, o) for o in training.outputs)
        self.pinned = {self.owner[o] for o in outputs if o in self.owner}
        self.kept = {
            v
            for v in made_fwd & read_late
            if self.owner[v] == v and self._kind(self.serial[v]) == ValueKind.ACTIVATION
        }
        self.buffers: dict[str, Buffer] = {}  # owning program value -> its buffer
        for v, o in self.owner.items():
            if v == o:
                self.buffers[v] = Buffer(
                    v,
                    self.serial[v],
                    self._category(v, v in comm_made),
                    self._scope(self.serial[v]),
                    self.nbytes(v),
                )

    def nbytes(self, value: str) -> int:
        """Bytes of `value`'s block on one rank."""
        t, spec = self.program.types[value], self.program.specs[value]
        size = self._sizes.get((t, spec))
        if size is None:
            shape = local_shape(t.shape, self.program.mesh, spec.placements)
            size = self._sizes[(t, spec)] = math.prod(shape) * DTYPE_BYTES[t.dtype]
        return size

    def live_at(self, index: int) -> list[Buffer]:
        """The buffers live while op `index` runs."""
        return [
            b
            for b in self.buffers.values()
            if b.value not in self.born
            or b.value in self.persistent
            or (
                self.born[b.value] <= index
                and (b.value in self.pinned or self.last[b.value] >= index)
            )
        ]

    def model_state(self) -> dict[str, int]:
        """Per-rank bytes of every param, param gradient and optimizer state value in its
        completed placement (`program.values`): ZeRO's "model states"."""
        out = dict.fromkeys(MODEL_STATE, 0)
        values = self.training.values
        for name in self.training.sources:
            category = _SOURCE_CATEGORY.get(values[name].kind)
            if name in self.owner and category in out:
                out[category] += self.nbytes(name)
        for name in self.grads:
            if name in values and name in self.program.values:
                out["gradients"] += self.nbytes(self.program.values[name])
        return out

    def _kind(self, serial: str) -> ValueKind:
        value = self.training.values.get(serial)
        return value.kind if value is not None else ValueKind.ACTIVATION

    def _scope(self, serial: str) -> str:
        op = self.training.producer(serial) if serial in self.training.values else None
        return op.scope if op is not None else ""

    def _category(self, v: str, made_by_comm: bool) -> str:
        s = self.serial[v]
        if made_by_comm and self.program.values.get(s) != v:
            return "comm_buffers"
        kind = self._kind(s)
        if kind in _SOURCE_CATEGORY:
            return _SOURCE_CATEGORY[kind]
        if kind == ValueKind.GRAD and s in self.grads:
            return "gradients"
        return "activations" if v in self.kept else "temporaries"


#: the collectives that reduce a gradient into its own buffer
_REDUCTIONS = frozenset({"all_reduce", "reduce_scatter"})


def _reduces_in_place(op: DistOp, owner: dict[str, str], persistent: set[str]) -> bool:
    """Whether `op` reduces a kept gradient buffer into itself (no buffer of its own)."""
    if op.comm is None or op.comm.kind not in _REDUCTIONS or not op.inputs:
        return False
    return owner.get(op.inputs[0]) in persistent


def _phases(ops: Sequence[DistOp]) -> list[int]:
    """Per op: forward (incl. loss), backward or optimizer, by role. A comm op runs for the
    first op that reads its output and takes its phase, else that of the compute op before it.
    """
    before: list[int] = []
    current = _FORWARD
    for op in ops:
        if not op.is_comm:
            current = _PHASE.get(op.role, current)
        before.append(current)
    phase = list(before)
    first_reader: dict[str, int] = {}
    for i in range(len(ops) - 1, -1, -1):
        op = ops[i]
        if op.is_comm:
            readers = [first_reader[o] for o in op.outputs if o in first_reader]
            phase[i] = phase[min(readers)] if readers else before[i]
        for v in op.inputs:
            first_reader[v] = i
    return phase


def _serial_of(op: DistOp, j: int, training: Graph) -> str:
    """The training value that output `j` of `op` holds."""
    if op.is_comm and "value" in op.attrs:
        return str(op.attrs["value"])
    src = training.find_op(op.name)
    if src is not None and len(src.outputs) == len(op.outputs):
        return src.outputs[j]
    return op.outputs[j].split("~", 1)[0].split("@", 1)[0]


def _size(buf: Buffer) -> int:
    return buf.bytes


def _buffer_json(buf: Buffer) -> dict[str, Any]:
    return {"value": buf.value, "category": buf.category, "scope": buf.scope, "bytes": buf.bytes}


def _thin(timeline: Sequence[tuple[str, int]], points: int, keep: str) -> list[tuple[str, int]]:
    """At most `points` evenly spaced entries of `timeline`, plus the op `keep` (the peak)."""
    if len(timeline) <= points:
        return list(timeline)
    step = -(-len(timeline) // max(1, points))
    return [p for i, p in enumerate(timeline) if i % step == 0 or p[0] == keep]
