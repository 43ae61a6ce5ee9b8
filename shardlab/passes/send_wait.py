"""Pipeline send/wait optimization (seed 001, Paddle "Optimize pipeline send wait").

Baseline (`with_send_waits`): every forward send of a stage is followed by a `wait` on the
compute stream (inputs: the sent value, deps: the send), so the stage's compute stops until
the activation has left; the sent buffer may be freed or reused right after the wait.

Optimization (`pipeline_send_wait`): on stage s, the forward send of activation x for
micro-batch m goes to stage s+1, which must receive x#m before it can run the backward of
micro-batch m and send the gradient x.grad#m back. So once stage s's backward recv of that
gradient has completed, its forward send of x#m has completed too. For every forward send
with such a matching later backward recv on the same stage, the pass drops the wait and adds
a `hold` of x#m (deps: the recv) right after the recv: the buffer is neither freed nor
overwritten before the send has surely finished, and compute no longer stops for the send.
Forward sends without a matching recv keep their wait.

Checks (`check_send_buffers`, `check_implied`):

- `check_hazards` sees one stage program. Buffers are freed by a modelled garbage collector
  (`with_gc_frees`): a `free` of each forward-sent value right after the last op touching it,
  depending on every user except sends (like Paddle's GC, it does not see an in-flight send).
  With the wait or the hold the send happens before the free (send -> recv on the `comm:pp`
  stream -> hold -> free); without either, the free is `free_in_flight`. Reuse of a freed
  buffer (an overwrite) can only come after the free, so the free stands for both.
- The cross-stage fact the hold relies on is checked by `check_implied`: on the peer stage
  the recv of x#m happens before the send of the gradient the hold waits for.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from shardlab.ir import OpRole
from shardlab.passes.pipeline import PipelineProgram
from shardlab.passes.pipeline_schedule import PipelineError
from shardlab.program import DistOp, DistProgram
from shardlab.runtime.hazards import HappensBefore, Hazard, check_hazards

__all__ = [
    "SendWaitSummary",
    "backward_recv_of",
    "check_implied",
    "check_send_buffers",
    "forward_sends",
    "pipeline_send_wait",
    "with_gc_frees",
    "with_send_waits",
]


@dataclass(frozen=True)
class SendWaitSummary:
    """What `pipeline_send_wait` changed, over all stages."""

    forward_sends: int
    waits_removed: int
    holds_added: int
    #: forward sends that keep their wait (no matching backward recv on their stage)
    kept: list[str] = field(default_factory=list)

    @property
    def message(self) -> str:
        return f"{self.waits_removed} send waits removed, {self.holds_added} holds added"

    def to_json(self) -> dict[str, Any]:
        return {
            "message": self.message,
            "forward_sends": self.forward_sends,
            "waits_removed": self.waits_removed,
            "holds_added": self.holds_added,
            "kept": list(self.kept),
        }


def _producers(program: DistProgram) -> dict[str, DistOp]:
    return {v: op for op in program.ops for v in op.outputs}


def _is_forward_value(value: str, producers: dict[str, DistOp]) -> bool:
    """Whether `value` is made by a forward (or loss) op; reshards look through to their input."""
    seen: set[str] = set()
    while value in producers and value not in seen:
        seen.add(value)
        op = producers[value]
        if op.role in (OpRole.FORWARD, OpRole.LOSS):
            return True
        if op.role != OpRole.COMM or not op.inputs:
            return False
        value = op.inputs[0]
    return False


def forward_sends(program: DistProgram) -> list[int]:
    """Indices of the sends of forward values (activations) in a stage program."""
    producers = _producers(program)
    return [
        i
        for i, op in enumerate(program.ops)
        if op.kind == "send" and _is_forward_value(op.inputs[0], producers)
    ]


def backward_recv_of(program: DistProgram, send: int) -> int | None:
    """The later recv of the gradient of what op `send` sends (same peer and micro-batch).

    Prefers the recv of `<value>.grad`; else the first later recv from the same peer stage
    for the same micro-batch whose value is not a forward value of this stage.
    """
    op = program.ops[send]
    peer, m, value = op.attrs["peer_stage"], op.attrs.get("microbatch"), op.attrs.get("value")
    candidates = [
        j
        for j in range(send + 1, len(program.ops))
        if program.ops[j].kind == "recv"
        and program.ops[j].attrs["peer_stage"] == peer
        and program.ops[j].attrs.get("microbatch") == m
    ]
    for j in candidates:
        if program.ops[j].attrs.get("value") == f"{value}.grad":
            return j
    grads = [j for j in candidates if ".grad" in str(program.ops[j].attrs.get("value", ""))]
    return grads[0] if grads else None


def _wait_op(send: DistOp) -> DistOp:
    return DistOp(
        f"wait:{send.name}",
        "wait",
        (send.inputs[0],),
        (),
        "compute",
        OpRole.COMM,
        scope=send.scope,
        reason=f"the compute stream waits until send {send.name!r} has finished",
        deps=(send.name,),
    )


def _hold_op(send: DistOp, recv: DistOp) -> DistOp:
    return DistOp(
        f"hold:{send.name}",
        "hold",
        (send.inputs[0],),
        (),
        "compute",
        OpRole.COMM,
        scope=recv.scope,
        attrs={"send": send.name},
        reason=(
            f"keeps {send.inputs[0]!r} alive until recv {recv.name!r}, which implies send "
            f"{send.name!r} has finished (seed 001)"
        ),
        deps=(recv.name,),
    )


def _waited(program: DistProgram) -> set[str]:
    """Names of the sends some `wait` op depends on."""
    return {d for op in program.ops if op.kind == "wait" for d in op.deps}


def _with_stages(pipeline: PipelineProgram, ops: Sequence[list[DistOp]]) -> PipelineProgram:
    stages = [dataclasses.replace(p, ops=o) for p, o in zip(pipeline.stages, ops, strict=True)]
    return dataclasses.replace(pipeline, stages=stages)


def with_send_waits(pipeline: PipelineProgram) -> PipelineProgram:
    """The baseline: a `wait` right after every forward send that has none yet."""
    new_ops = []
    for program in pipeline.stages:
        waited, fwd = _waited(program), set(forward_sends(program))
        ops: list[DistOp] = []
        for i, op in enumerate(program.ops):
            ops.append(op)
            if i in fwd and op.name not in waited:
                ops.append(_wait_op(op))
        new_ops.append(ops)
    return _with_stages(pipeline, new_ops)


def pipeline_send_wait(pipeline: PipelineProgram) -> tuple[PipelineProgram, SendWaitSummary]:
    """Replace forward-send waits by holds after the matching backward recv (module doc).

    The input may have its waits or not (`with_send_waits` is applied first); the result
    keeps the waits of forward sends without a matching backward recv.
    """
    base = with_send_waits(pipeline)
    new_ops, kept = [], []
    n_fwd = removed = added = 0
    for program in base.stages:
        ops = program.ops
        drop: set[str] = set()
        holds_after: dict[int, list[DistOp]] = {}
        for i in forward_sends(program):
            n_fwd += 1
            j = backward_recv_of(program, i)
            if j is None:
                kept.append(ops[i].name)
                continue
            drop.add(f"wait:{ops[i].name}")
            holds_after.setdefault(j, []).append(_hold_op(ops[i], ops[j]))
        out: list[DistOp] = []
        for j, op in enumerate(ops):
            if op.kind == "wait" and op.name in drop:
                removed += 1
                continue
            out.append(op)
            for hold in holds_after.get(j, []):
                out.append(hold)
                added += 1
        new_ops.append(out)
    return _with_stages(pipeline, new_ops), SendWaitSummary(n_fwd, removed, added, kept)


def with_gc_frees(program: DistProgram, values: Sequence[str]) -> DistProgram:
    """`program` with a `free` of each value right after the last op touching it.

    The free depends on every op using the value except sends: the modelled garbage
    collector knows when compute and collectives are done, not when a send has finished.
    """
    last: dict[str, int] = {}
    users: dict[str, list[str]] = {}
    wanted = set(values)
    for i, op in enumerate(program.ops):
        for v in (*op.inputs, *op.outputs):
            if v in wanted:
                last[v] = i
                if op.kind != "send":
                    users.setdefault(v, []).append(op.name)
    frees_after: dict[int, list[DistOp]] = {}
    for v, i in last.items():
        free = DistOp(
            f"free:{v}",
            "free",
            (v,),
            (),
            "compute",
            OpRole.COMM,
            reason=f"garbage collector: {v!r} has no later user",
            deps=tuple(dict.fromkeys(users.get(v, []))),
        )
        frees_after.setdefault(i, []).append(free)
    ops: list[DistOp] = []
    for i, op in enumerate(program.ops):
        ops.append(op)
        ops += frees_after.get(i, [])
    return dataclasses.replace(program, ops=ops)


def check_send_buffers(pipeline: PipelineProgram) -> list[tuple[int, Hazard]]:
    """(stage, hazard) of every stage with garbage-collector frees of its forward-sent values."""
    found = []
    for s, program in enumerate(pipeline.stages):
        sent = [program.ops[i].inputs[0] for i in forward_sends(program)]
        found += [(s, h) for h in check_hazards(with_gc_frees(program, sent))]
    return found


def check_implied(pipeline: PipelineProgram) -> None:
    """Raise PipelineError unless, for every hold, the peer stage receives the held value
    before it sends the gradient whose recv the hold waits for (the cross-stage fact)."""
    stages = pipeline.stages
    orders = [HappensBefore(p.ops) for p in stages]
    for s, program in enumerate(stages):
        index = {op.name: i for i, op in enumerate(program.ops)}
        for hold in program.ops:
            if hold.kind != "hold" or "send" not in hold.attrs:
                continue
            send = program.ops[index[str(hold.attrs["send"])]]
            recv = program.ops[index[hold.deps[0]]]
            peer = int(send.attrs["peer_stage"])
            got = _p2p_index(stages[peer], "recv", send.attrs["tag"])
            back = _p2p_index(stages[peer], "send", recv.attrs["tag"])
            if got is None or back is None or not orders[peer].before(got, back):
                raise PipelineError(
                    f"hold {hold.name!r} on stage {s}: stage {peer} does not receive "
                    f"{send.attrs['tag']!r} before sending {recv.attrs['tag']!r}, so recv "
                    f"{recv.name!r} does not imply send {send.name!r} has finished",
                    op=hold.name,
                )


def _p2p_index(program: DistProgram, kind: str, tag: object) -> int | None:
    """Index of the `kind` op with attr `tag` in a stage program."""
    for i, op in enumerate(program.ops):
        if op.kind == kind and op.attrs.get("tag") == tag:
            return i
    return None
