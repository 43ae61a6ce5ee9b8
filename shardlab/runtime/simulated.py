"""The simulated mesh: run a DistProgram for every rank inside one process (numpy).

Each rank holds its local blocks; compute ops run their rule's local kernel on every rank
in lockstep (`runtime.sharded`), comm ops run their collective over the rank groups of their
mesh axis (`runtime.reshard_exec`).

Two ways to run (`run_simulated(..., interleave=)`):

- `None`: program order, synchronous: every async op completes as soon as it is issued.
- a seed: a random order consistent with happens-before (`runtime.hazards`): an op is issued
  once its deps and its stream predecessor have completed; an async op (comm stream, send,
  recv) completes at a random later point, before any op that HB-follows it; compute ops
  complete where they run.

Either way buffers are policed as `runtime.hazards` defines them, and the first hazard the
run meets raises `HazardError` naming both ops and the value: reading an output of an async
op that has not completed, overwriting in place or freeing a buffer an issued async op still
reads or writes, touching a freed buffer, reading a version already overwritten in place.
Numerics do not depend on the order, so a hazard-free program gives bit-identical blocks under
every interleaving (`run_interleavings` checks it). The returned blocks hold every value ever
made, freed and overwritten ones included (buffers are modelled, not reused).
A single program's `send` / `recv` do not run here (ExecutionError): they need their peer
program, so `runtime.pipeline_interleave` runs the stage programs of a pipeline together,
with a `Mailbox` carrying each send's blocks to its recv.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from shardlab.errors import ExecutionError
from shardlab.ops.base import Array
from shardlab.program import DistOp, DistProgram
from shardlab.runtime import hazards as hz
from shardlab.runtime.distribute import assemble, distribute
from shardlab.runtime.reshard_exec import apply_step
from shardlab.runtime.sharded import run_sharded_op
from shardlab.spmd.result import RuleResult

Blocks = dict[str, dict[int, Array]]


def run_simulated(
    program: DistProgram,
    sources: Mapping[str, Array],
    seed: int = 0,
    *,
    interleave: int | None = None,
) -> Blocks:
    """Every program value's block on every rank, from the global values of the sources.

    `seed` splits partial sources at random; `interleave` picks the execution order (None:
    program order, synchronous; an int: the seed of a random valid interleaving).
    """
    analysis = _Analysis.of(program, interleaved=interleave is not None)
    return _execute(program, analysis, sources, seed, interleave)


def run_interleavings(
    program: DistProgram, sources: Mapping[str, Array], n: int = 10, seed: int = 0
) -> Blocks:
    """Blocks of `n` random interleavings (seeds `seed`, `seed + 1`, ...; sources split with
    `seed`), checked to be bit-identical; raises HazardError on the first hazard met and
    ExecutionError if two runs differ."""
    if n < 1:
        raise ExecutionError(f"run_interleavings needs n >= 1, got {n}")
    analysis = _Analysis.of(program, interleaved=True)
    first = _execute(program, analysis, sources, seed, seed)
    for k in range(1, n):
        blocks = _execute(program, analysis, sources, seed, seed + k)
        _same_blocks(first, blocks, f"interleavings {seed} and {seed + k}")
    return first


def global_view(program: DistProgram, blocks: Blocks, value: str) -> Array:
    """The global value of program value `value`, reassembled from every rank's block."""
    return assemble(blocks[value], program.specs[value], program.types[value].shape)


@dataclass(frozen=True, slots=True)
class _Analysis:
    """What every run of one program shares: buffers, async flags and, for interleaved runs,
    HB predecessors (program-order runs ignore deps, as they always have)."""

    bufs: hz.Buffers
    asynchronous: list[bool]
    preds: list[list[int]] | None

    @staticmethod
    def of(program: DistProgram, interleaved: bool) -> _Analysis:
        return _Analysis(
            hz.buffers_of(program),
            [hz.is_async(op) for op in program.ops],
            hz.predecessors(program.ops) if interleaved else None,
        )


def _execute(
    program: DistProgram,
    analysis: _Analysis,
    sources: Mapping[str, Array],
    seed: int,
    interleave: int | None,
) -> Blocks:
    rng = np.random.default_rng(seed)
    blocks: Blocks = {}
    for name, data in sources.items():
        blocks[name] = distribute(np.asarray(data), program.specs[name], rng)
    run = ProgramRun(program, analysis.bufs, blocks, interleave)
    if interleave is None:
        for i in range(len(program.ops)):
            run.issue(i)
            if analysis.asynchronous[i]:
                run.complete(i)
    else:
        assert analysis.preds is not None
        order = random.Random(interleave)
        for i, done in random_events(analysis.preds, analysis.asynchronous, order):
            if done and analysis.asynchronous[i]:
                run.complete(i)
            else:
                run.issue(i)
    return blocks


@dataclass
class Mailbox:
    """Messages in flight between programs: a completed send leaves a copy of every rank's
    block under its key, the matching recv takes them (rank i's block to the peer program's
    i-th rank). `key` maps a send or recv op of this program to the key they pair by."""

    key: Callable[[DistOp], Hashable]
    messages: dict[Hashable, list[Array]] = field(default_factory=dict)

    def view(self, key: Callable[[DistOp], Hashable]) -> Mailbox:
        """The same messages, seen from another program (with its own key function)."""
        return Mailbox(key, self.messages)


def random_events(
    preds: list[list[int]],
    asynchronous: list[bool],
    rng: random.Random,
    done_after: Mapping[int, list[int]] | None = None,
) -> Iterator[tuple[int, bool]]:
    """A random linear extension of the events (op, done): an async op is issued (done False)
    once its HB predecessors are done and is done later; a sync op has only its done event.
    `done_after[b]` lists ops whose done events must precede b's done event (a recv completes
    only after its send). With such extra edges the events can stall: the caller sees fewer
    events than ops."""
    n = len(preds)
    waiting = [0] * (2 * n)
    then: list[list[int]] = [[] for _ in range(2 * n)]
    for b, afters in (done_after or {}).items():
        for a in afters:
            then[2 * a + 1].append(2 * b + 1)
        waiting[2 * b + 1] += len(afters)
    for i, ps in enumerate(preds):
        start = 2 * i if asynchronous[i] else 2 * i + 1
        for p in ps:
            then[2 * p + 1].append(start)
        waiting[start] += len(ps)
        if asynchronous[i]:
            then[2 * i].append(2 * i + 1)
            waiting[2 * i + 1] += 1
    ready = [2 * i if asynchronous[i] else 2 * i + 1 for i in range(n) if not preds[i]]
    while ready:
        k = rng.randrange(len(ready))
        ready[k], ready[-1] = ready[-1], ready[k]
        event = ready.pop()
        yield event >> 1, bool(event & 1)
        for nxt in then[event]:
            waiting[nxt] -= 1
            if waiting[nxt] == 0:
                ready.append(nxt)


class ProgramRun:
    """One execution: the blocks made so far and the state of every buffer."""

    def __init__(
        self,
        program: DistProgram,
        bufs: hz.Buffers,
        blocks: Blocks,
        interleave: int | None,
        mailbox: Mailbox | None = None,
    ) -> None:
        self.program = program
        self.mailbox = mailbox
        self.ops = program.ops
        self.bufs = bufs
        self.blocks = blocks
        self.context = (
            " (program order)" if interleave is None else f" (interleaving seed {interleave})"
        )
        self.in_flight: dict[str, set[int]] = {}  # buffer -> issued, unfinished async users
        self.overwritten: dict[str, int] = {}  # version -> the op that overwrote it in place
        self.freed: dict[str, tuple[int, str]] = {}  # buffer -> (free op, the value it named)

    def owner(self, v: str) -> str:
        return self.bufs.owner.get(v, v)

    def fail(self, hazard: hz.Hazard) -> hz.HazardError:
        return hz.HazardError(hazard, self.context)

    def issue(self, i: int) -> None:
        """Run op i (sync) or start it (async): check what it touches, apply its effects."""
        op = self.ops[i]
        if op.kind in hz.P2P_KINDS and self.mailbox is None:
            raise ExecutionError(
                f"op {op.name!r}: {op.kind} does not run on the simulated mesh yet "
                "(check_hazards covers it)",
                op=op.name,
            )
        for v in dict.fromkeys(op.inputs):
            if op.kind == hz.HOLD:
                self.check_alive(i, v)
            elif op.kind == hz.FREE:
                self.free(i, v)
            else:
                self.read(i, v, data=op.kind != hz.WAIT)
        for v in op.outputs:
            self.check_alive(i, v)
        for _, src in hz.inplace_pairs(op):
            self.overwrite(i, op.inputs[src])
        if not hz.is_async(op):
            self.make_outputs(i)
            return
        for v in (*op.inputs, *op.outputs):
            self.in_flight.setdefault(self.owner(v), set()).add(i)

    def complete(self, i: int) -> None:
        """Finish async op i: its outputs become readable, its buffers leave its hands."""
        op = self.ops[i]
        for v in (*op.inputs, *op.outputs):
            self.in_flight[self.owner(v)].discard(i)
        self.make_outputs(i)

    def read(self, i: int, v: str, data: bool) -> None:
        if v not in self.blocks:
            p = self.bufs.producer.get(v)
            if p is None:
                raise ExecutionError(
                    f"op {self.ops[i].name!r} reads {v!r}, which is neither a source given "
                    "data nor produced by an op",
                    op=self.ops[i].name,
                    value=v,
                )
            raise self.fail(hz.read_before_complete(self.ops[i], self.ops[p], v))
        self.check_alive(i, v)
        if data and v in self.overwritten:
            op, w = self.ops[i], self.ops[self.overwritten[v]]
            if hz.is_async(op):  # named as check_hazards names the pair
                raise self.fail(hz.write_in_flight(w, op, v))
            raise self.fail(hz.read_after_overwrite(op, w, v))

    def check_alive(self, i: int, v: str) -> None:
        got = self.freed.get(self.owner(v))
        if got is None:
            return
        f, named = got
        op, free = self.ops[i], self.ops[f]
        if hz.is_async(op) and i < f:  # named as check_hazards names the pair
            raise self.fail(hz.free_in_flight(free, op, v, named))
        raise self.fail(hz.use_after_free(op, free, v, named))

    def overwrite(self, i: int, v: str) -> None:
        for user in sorted(self.in_flight.get(self.owner(v), ())):
            if user != i:
                raise self.fail(hz.write_in_flight(self.ops[i], self.ops[user], v))
        self.overwritten[v] = i

    def free(self, i: int, v: str) -> None:
        if self.freed.get(self.owner(v), (None,))[0] == i:
            return  # this free already named another version of the buffer
        self.check_alive(i, v)
        for user in sorted(self.in_flight.get(self.owner(v), ())):
            raise self.fail(hz.free_in_flight(self.ops[i], self.ops[user], v, v))
        self.freed[self.owner(v)] = (i, v)

    def make_outputs(self, i: int) -> None:
        """Compute op i's outputs from its inputs' blocks (a send posts its blocks, a recv
        takes them: both when they complete)."""
        op = self.ops[i]
        if self.mailbox is not None and op.kind == hz.SEND:
            held = self.blocks[op.inputs[0]]
            message = [held[r].copy() for r in self.program.mesh.ranks]
            self.mailbox.messages[self.mailbox.key(op)] = message
        elif self.mailbox is not None and op.kind == hz.RECV:
            message = self.mailbox.messages.pop(self.mailbox.key(op))
            self.blocks[op.outputs[0]] = dict(zip(self.program.mesh.ranks, message, strict=True))
        else:
            execute_op(self.program, op, self.blocks)


def execute_op(program: DistProgram, op: DistOp, blocks: Blocks) -> None:
    """Run one op of `program` on every rank of its mesh, writing its outputs' blocks:
    a comm step per (input, output) pair, a compute op through its rule's local kernel,
    nothing for synchronisation kinds (wait, hold, free)."""
    if op.kind in hz.SYNC_KINDS:
        return
    if op.comm is not None:
        if len(op.inputs) != len(op.outputs):
            raise ExecutionError(f"comm op {op.name!r} needs one output per input", op=op.name)
        for src, dst in zip(op.inputs, op.outputs, strict=True):
            blocks[dst] = apply_step(blocks[src], program.mesh, op.comm)
        return
    rule = RuleResult(
        tuple(program.specs[v] for v in op.inputs),
        tuple(program.specs[v] for v in op.outputs),
        op.reason,
        kernel=op.kernel,
    )
    local = {r: [blocks[v][r] for v in op.inputs] for r in program.mesh.ranks}
    outs = run_sharded_op(
        op.kind,
        op.attrs,
        rule,
        [program.types[v] for v in op.inputs],
        [program.types[v] for v in op.outputs],
        local,
    )
    for j, v in enumerate(op.outputs):
        blocks[v] = {r: np.asarray(outs[r][j]) for r in program.mesh.ranks}


def _same_blocks(want: Blocks, got: Blocks, what: str) -> None:
    """ExecutionError naming the first value and rank where two runs differ bit-wise."""
    if want.keys() != got.keys():
        diff = sorted(want.keys() ^ got.keys())
        raise ExecutionError(f"{what} made different values: {diff[:5]}", values=diff[:5])
    for name, ranks in want.items():
        for r, a in ranks.items():
            b = got[name][r]
            if a.shape != b.shape or a.dtype != b.dtype or a.tobytes() != b.tobytes():
                raise ExecutionError(f"{what} disagree on {name!r} at rank {r}", value=name, rank=r)
