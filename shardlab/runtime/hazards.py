"""Hazards of asynchronous communication: what may go wrong when streams interleave.

What it is for: passes move collectives onto comm streams, fuse them and drop waits; this
module proves such a program safe without running it (`check_hazards`), and holds the
vocabulary the simulated mesh (`runtime.simulated`) uses when it runs random interleavings.

Semantics:

- **Happens-before (HB).** Op A happens before op B if B lists A in `deps`, or A precedes B on
  the same stream in program order (each stream executes its ops in order), closed
  transitively. `deps` must name earlier ops, so HB implies program order.
- **Async ops.** An op on a `comm:*` stream, and any `send` / `recv`, is asynchronous: issuing
  it returns at once and it completes at some point before every op that HB-follows it. It
  reads its inputs and writes its outputs at any time in between: its outputs are readable
  only by ops that HB-follow it, and its inputs must stay unchanged and alive until then.
  Every other op is synchronous: it completes where it runs.
- **Buffers.** An output listed in attr `inplace` (per output, the index of the input it
  overwrites, or None) lives in that input's buffer; every other output gets a new buffer.
  The values sharing one buffer are its versions, in program order.
- **Sync kinds** (`shardlab.ops.sync_ops`), no outputs: `wait` (inputs: the async outputs
  waited on, deps: their producers) is a synchronisation point; `hold` keeps its inputs'
  buffers alive up to its position (seed 001's no-op) and reads nothing; `free` releases its
  inputs' buffers, after which nothing may use them.

Hazards, each naming the op where execution goes wrong (`op`), the op it races with
(`other`) and the value:

1. `read_before_complete`: an op reads (or waits on) a value whose producer does not HB-precede
   it: typically a comm op's output read before the comm completes.
2. `write_in_flight`: an op overwrites a version in place while an async op reading that
   version does not HB-precede the writer (the comm may still be reading it).
3. `read_after_overwrite`: the synchronous counterpart of 2: an op reads a version that an
   in-place writer overwrites, and does not HB-precede the writer.
4. `free_in_flight`: a `free` of a buffer that an async op reads or writes, where the async op
   comes earlier in program order but does not HB-precede the free (a send still running).
5. `use_after_free`: any other use of a freed buffer (read, in-place write, wait, hold, a second
   free, an async producer) by an op that does not HB-precede the free.

`check_hazards` is static and near-linear: vector clocks hold, for every op, the latest
position on each stream that HB-precedes it (O(ops x streams)), so each HB query is O(1).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from shardlab.errors import ExecutionError, ShardlabError
from shardlab.program import DistOp, DistProgram

HazardKind = Literal[
    "read_before_complete",
    "write_in_flight",
    "read_after_overwrite",
    "free_in_flight",
    "use_after_free",
]

WAIT, HOLD, FREE, SEND, RECV = "wait", "hold", "free", "send", "recv"
#: Kinds that touch buffers without reading their data.
SYNC_KINDS = frozenset({WAIT, HOLD, FREE})
#: Kinds that are asynchronous on whichever stream they sit.
P2P_KINDS = frozenset({SEND, RECV})


@dataclass(frozen=True, slots=True)
class Hazard:
    """One unsafe pair of ops: `op` goes wrong against `other` on program value `value`."""

    kind: HazardKind
    op: str
    other: str
    value: str
    message: str

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "op": self.op,
            "other": self.other,
            "value": self.value,
            "message": self.message,
        }


class HazardError(ShardlabError):
    """A run hit a hazard: an op used a buffer an unfinished async op still owns, or a freed
    or overwritten one. The message names both ops and the value."""

    code = "hazard"

    def __init__(self, hazard: Hazard, context: str = "") -> None:
        super().__init__(
            hazard.message + context,
            kind=hazard.kind,
            op=hazard.op,
            other=hazard.other,
            value=hazard.value,
        )
        self.hazard = hazard


def is_async(op: DistOp) -> bool:
    """Whether issuing `op` returns before it has read its inputs and written its outputs."""
    return op.stream.startswith("comm:") or op.kind in P2P_KINDS


def is_compute(op: DistOp) -> bool:
    """Whether `op` computes: neither a collective, a transfer nor a sync op."""
    return op.comm is None and op.kind not in P2P_KINDS and op.kind not in SYNC_KINDS


def reads_data(op: DistOp) -> bool:
    """Whether `op` reads the data of its inputs (wait, hold and free do not)."""
    return op.kind not in SYNC_KINDS


def describe(op: DistOp) -> str:
    """`'name' (kind on stream)`, for messages."""
    return f"{op.name!r} ({op.kind} on {op.stream})"


def inplace_pairs(op: DistOp) -> list[tuple[int, int]]:
    """(output index, input index) for each output that overwrites an input (attr `inplace`)."""
    declared = op.attrs.get("inplace")
    if declared is None:
        return []
    if not isinstance(declared, list | tuple) or len(declared) > len(op.outputs):
        raise ExecutionError(
            f"op {op.name!r}: attr 'inplace' must list, per output, an input index or None; "
            f"got {declared!r}",
            op=op.name,
        )
    pairs = []
    for j, src in enumerate(declared):
        if src is None:
            continue
        if isinstance(src, bool) or not isinstance(src, int) or not 0 <= src < len(op.inputs):
            raise ExecutionError(
                f"op {op.name!r}: attr 'inplace' entry {j} ({src!r}) is not an input index",
                op=op.name,
            )
        pairs.append((j, src))
    return pairs


def predecessors(ops: Sequence[DistOp]) -> list[list[int]]:
    """Direct HB predecessors of every op (its deps and the previous op on its stream), by
    index; ExecutionError for a duplicate op name or a dep that is unknown or not earlier."""
    index: dict[str, int] = {}
    last_on: dict[str, int] = {}
    preds: list[list[int]] = []
    for i, op in enumerate(ops):
        if op.name in index:
            raise ExecutionError(f"op name {op.name!r} appears twice in the program", op=op.name)
        index[op.name] = i
        mine = [last_on[op.stream]] if op.stream in last_on else []
        for dep in op.deps:
            at = index.get(dep)
            if at is None or at == i:
                later = any(o.name == dep for o in ops[i:])
                where = "is not earlier in program order" if later else "is not in the program"
                raise ExecutionError(
                    f"op {op.name!r} depends on {dep!r}, which {where}", op=op.name, dep=dep
                )
            mine.append(at)
        last_on[op.stream] = i
        preds.append(mine)
    return preds


class HappensBefore:
    """O(1) happens-before queries over a program, from per-stream vector clocks.

    `clock[i][s]` is the position on stream `s` of the latest op of `s` that HB-precedes op i
    or is op i (-1: none); ops of one stream are totally ordered, so A HB B iff B's clock
    reaches A's position on A's stream.
    """

    def __init__(self, ops: Sequence[DistOp]) -> None:
        self.preds = predecessors(ops)
        slots: dict[str, int] = {}
        for op in ops:
            slots.setdefault(op.stream, len(slots))
        empty = (-1,) * len(slots)
        counts = [0] * len(slots)
        self.slot: list[int] = []
        self.seq: list[int] = []
        self.clock: list[tuple[int, ...]] = []
        for i, op in enumerate(ops):
            s = slots[op.stream]
            clock = empty
            for p in self.preds[i]:
                other = self.clock[p]
                clock = other if clock is empty else tuple(map(max, clock, other))
            mine = list(clock)
            mine[s] = counts[s]
            self.slot.append(s)
            self.seq.append(counts[s])
            self.clock.append(tuple(mine))
            counts[s] += 1

    def before(self, a: int, b: int) -> bool:
        """Whether op `a` happens before op `b` (by index; False when a == b)."""
        return a != b and self.clock[b][self.slot[a]] >= self.seq[a]


#: (index of the hazard's op, index of the other op, the hazard) -> None
Report = Callable[[int, int, Hazard], None]


@dataclass(frozen=True, slots=True)
class Buffers:
    """Which buffer every program value lives in, and who makes and overwrites each version."""

    owner: dict[str, str]  # value -> the version that allocated its buffer
    producer: dict[str, int]  # value -> index of the op producing it
    overwriters: dict[str, list[int]]  # value -> indices of the ops overwriting it in place


def buffers_of(program: DistProgram) -> Buffers:
    """The buffer map of a program (values without a producer are sources, own buffers)."""
    owner: dict[str, str] = {}
    producer: dict[str, int] = {}
    overwriters: dict[str, list[int]] = {}
    for i, op in enumerate(program.ops):
        for v in op.inputs:
            owner.setdefault(v, v)
        aliased = dict(inplace_pairs(op))
        for j, out in enumerate(op.outputs):
            if out in producer:
                first = program.ops[producer[out]].name
                raise ExecutionError(
                    f"value {out!r} is produced by both {first!r} and {op.name!r}", value=out
                )
            producer[out] = i
            src = aliased.get(j)
            if src is None:
                owner[out] = out
            else:
                overwritten = op.inputs[src]
                owner[out] = owner[overwritten]
                overwriters.setdefault(overwritten, []).append(i)
    return Buffers(owner, producer, overwriters)


def read_before_complete(reader: DistOp, producer: DistOp, value: str) -> Hazard:
    """`reader` reads (or waits on) `value` before `producer` has finished making it."""
    if is_async(producer):
        msg = (
            f"{describe(reader)} reads {value!r} before {describe(producer)} completes: "
            f"{producer.name!r} does not happen before it (add a dependency or a wait)"
        )
    else:
        msg = (
            f"{describe(reader)} reads {value!r}, but its producer {describe(producer)} "
            f"does not happen before it"
        )
    return Hazard("read_before_complete", reader.name, producer.name, value, msg)


def write_in_flight(writer: DistOp, comm: DistOp, value: str) -> Hazard:
    """`writer` overwrites `value` in place while async `comm` may still be reading it."""
    msg = (
        f"{describe(writer)} overwrites {value!r} in place while {describe(comm)} may still be "
        f"reading it: {comm.name!r} does not happen before the write"
    )
    return Hazard("write_in_flight", writer.name, comm.name, value, msg)


def read_after_overwrite(reader: DistOp, writer: DistOp, value: str) -> Hazard:
    """`reader` reads `value` after (or unordered with) `writer` overwriting it in place."""
    msg = (
        f"{describe(reader)} reads {value!r}, which {describe(writer)} overwrites in place, "
        f"and does not happen before that write"
    )
    return Hazard("read_after_overwrite", reader.name, writer.name, value, msg)


def free_in_flight(free: DistOp, user: DistOp, value: str, freed: str) -> Hazard:
    """`free` releases the buffer of `freed` while async `user` may still use `value` in it."""
    same = "" if value == freed else f" (the buffer of {freed!r})"
    msg = (
        f"{describe(free)} frees {value!r}{same} while {describe(user)} may still be using it: "
        f"{user.name!r} does not happen before the free"
    )
    return Hazard("free_in_flight", free.name, user.name, value, msg)


def use_after_free(user: DistOp, free: DistOp, value: str, freed: str) -> Hazard:
    """`user` touches `value` in the buffer `free` releases, not before the free."""
    same = "" if value == freed else f" (the buffer of {freed!r})"
    msg = (
        f"{describe(user)} uses {value!r}{same}, which {describe(free)} frees, and does not "
        f"happen before the free"
    )
    return Hazard("use_after_free", user.name, free.name, value, msg)


def check_hazards(program: DistProgram) -> list[Hazard]:
    """Every hazard of `program` under the semantics above, in program order of `op`.

    ExecutionError for a malformed program: a duplicate op name, a dep that is unknown or
    not earlier in program order, a value produced twice, a bad attr `inplace`.
    """
    ops = program.ops
    hb = HappensBefore(ops)
    bufs = buffers_of(program)
    found: list[tuple[int, int, Hazard]] = []

    def report(at: int, other: int, hazard: Hazard) -> None:
        found.append((at, other, hazard))

    readers: dict[str, list[int]] = {}
    frees: list[int] = []
    for i, op in enumerate(ops):
        if op.kind == FREE:
            frees.append(i)
        if op.kind in (HOLD, FREE):
            continue
        for v in dict.fromkeys(op.inputs):
            if reads_data(op):
                readers.setdefault(v, []).append(i)
            p = bufs.producer.get(v)
            if p is not None and not hb.before(p, i):
                report(i, p, read_before_complete(op, ops[p], v))
    for v, writers in bufs.overwriters.items():
        for w in writers:
            for r in readers.get(v, ()):
                if r == w or hb.before(r, w):
                    continue
                if is_async(ops[r]):
                    report(w, r, write_in_flight(ops[w], ops[r], v))
                else:
                    report(r, w, read_after_overwrite(ops[r], ops[w], v))
    if frees:
        _check_frees(program, hb, bufs, frees, report)
    found.sort(key=lambda t: (t[0], t[1]))
    return [h for _, _, h in found]


def _check_frees(
    program: DistProgram, hb: HappensBefore, bufs: Buffers, frees: list[int], report: Report
) -> None:
    """Hazards 4 and 5: every use of a freed buffer must happen before the free."""
    ops = program.ops
    freed = {bufs.owner[v] for f in frees for v in ops[f].inputs}
    uses: dict[str, list[tuple[int, str]]] = {}  # buffer -> (op index, first value it touches)
    for i, op in enumerate(ops):
        touched: dict[str, str] = {}  # buffer -> value
        for v in (*op.inputs, *op.outputs):
            touched.setdefault(bufs.owner[v], v)
        for b, v in touched.items():
            if b in freed:
                uses.setdefault(b, []).append((i, v))
    for f in frees:
        named = {bufs.owner[v]: v for v in reversed(ops[f].inputs)}
        for b, v in named.items():
            for x, w in uses[b]:
                if x == f or hb.before(x, f):
                    continue
                if is_async(ops[x]) and x < f:
                    report(f, x, free_in_flight(ops[f], ops[x], w, v))
                else:
                    report(x, f, use_after_free(ops[x], ops[f], w, v))
