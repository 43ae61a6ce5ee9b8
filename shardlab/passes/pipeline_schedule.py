"""Pipeline schedules and the send/recv check of a pipeline program.

A schedule says, per pipeline stage, in which order the stage runs the forward (`F`) and
backward (`B`) pass of each (model chunk, micro-batch): a list of `Unit`s.

- `gpipe`: all forwards, then all backwards.
- `1f1b`: `pp-1-s` warm-up forwards on stage `s`, then one forward / one backward
  alternately, then the remaining backwards (PipeDream-flush / Megatron 1F1B).
- `interleaved`: every stage holds `v` model chunks (virtual stages) assigned round-robin;
  forwards walk the chunks in groups of `pp` micro-batches, backwards walk them in reverse;
  `2(pp-1-s) + (v-1)pp` warm-up forwards (Megatron-LM interleaved 1F1B). Needs micro-batches
  divisible by `pp`.

`check_send_recv` proves a pipeline program cannot hang: every send has exactly one recv on
its peer stage with the same tag, local shape, dtype and placements, and running the stages
with buffered (eager) sends and blocking recvs finishes. `execution_order` is that run; the
pipeline runtime executes ops in exactly this order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from shardlab.errors import PlacementError, ShardlabError
from shardlab.placement import local_shape
from shardlab.program import DistOp, DistProgram

if TYPE_CHECKING:
    from shardlab.passes.pipeline import PipelineProgram

SCHEDULES = ("gpipe", "1f1b", "interleaved")
#: How the layers are split over the model chunks (`PipelineOptions.balance`).
BALANCES = ("flops", "time", "even")


class PipelineError(ShardlabError):
    """A pipeline cannot be built or would hang: bad stage split, unmatched send/recv."""

    code = "invalid_pipeline"


@dataclass(frozen=True, slots=True)
class Unit:
    """One pass of one model chunk over one micro-batch on a stage.

    `chunk` is the stage-local chunk index (0 .. virtual_stages-1); the model chunk it holds
    is `chunk * pp + stage`.
    """

    phase: Literal["F", "B"]
    chunk: int
    microbatch: int

    def __str__(self) -> str:
        return f"{self.phase}{self.microbatch}" + (f".c{self.chunk}" if self.chunk else "")


#: the most micro-batches a step may have (a slot of the schedule each; Megatron-LM runs
#: reach a few thousand)
MAX_MICROBATCHES = 65536
#: the most model chunks a stage may hold (interleaved; no model has more layers)
MAX_VIRTUAL_STAGES = 1024


@dataclass(frozen=True, slots=True)
class PipelineOptions:
    """How a `pp` mesh axis pipelines: schedule, micro-batches per step, model chunks per
    stage (interleaved), and how layers are split (`flops`: balanced by FLOPs, the
    embedding and head counted; `time`: balanced by the cost model's seconds on the plan's
    cluster; `even`: the same number per chunk, as Megatron-LM does)."""

    schedule: str = "1f1b"
    microbatches: int = 0  # 0: one per pipeline stage
    virtual_stages: int = 0  # 0: 2 for interleaved, else 1
    balance: str = "flops"

    @classmethod
    def from_options(cls, options: Mapping[str, Any], pp: int) -> PipelineOptions:
        """The strategy option `pipeline` (a mapping), checked; errors name the field."""
        raw = options.get("pipeline", {})
        if not isinstance(raw, Mapping):
            raise PipelineError(f"strategy option 'pipeline' must be an object, got {raw!r}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise PipelineError(
                f"pipeline option {unknown[0]!r} is unknown; options: {', '.join(sorted(known))}",
                option=unknown[0],
            )
        out = cls(**{k: raw[k] for k in known if k in raw})
        for name, most in (("microbatches", MAX_MICROBATCHES),
                           ("virtual_stages", MAX_VIRTUAL_STAGES)):  # fmt: skip
            value = getattr(out, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise PipelineError(
                    f"pipeline option {name!r} must be a positive integer, got {value!r}",
                    option=name,
                )
            if value > most:
                raise PipelineError(
                    f"pipeline option {name!r} is {value}, more than the limit of {most}",
                    option=name,
                    limit=most,
                )
        if out.schedule not in SCHEDULES:
            raise PipelineError(
                f"pipeline option 'schedule' must be one of {', '.join(SCHEDULES)}, got "
                f"{out.schedule!r}",
                option="schedule",
            )
        if out.balance not in BALANCES:
            raise PipelineError(
                f"pipeline option 'balance' must be one of {', '.join(BALANCES)}, got "
                f"{out.balance!r}",
                option="balance",
            )
        v = out.virtual_stages or (2 if out.schedule == "interleaved" else 1)
        resolved = dataclasses.replace(out, microbatches=out.microbatches or pp, virtual_stages=v)
        check_schedule(resolved.schedule, pp, resolved.microbatches, v)
        return resolved

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def warmup_forwards(schedule: str, pp: int, stage: int, microbatches: int, virtual: int) -> int:
    """How many forwards stage `stage` runs before its first backward."""
    total = microbatches * virtual
    if schedule == "gpipe":
        return total
    if schedule == "1f1b":
        return min(pp - 1 - stage, total)
    return min(2 * (pp - 1 - stage) + (virtual - 1) * pp, total)


def schedule_units(
    schedule: str, pp: int, stage: int, microbatches: int, virtual_stages: int = 1
) -> list[Unit]:
    """The order in which stage `stage` runs its forward and backward units."""
    check_schedule(schedule, pp, microbatches, virtual_stages)
    v, total = virtual_stages, microbatches * virtual_stages

    def unit(k: int, phase: Literal["F", "B"]) -> Unit:
        if schedule != "interleaved":
            return Unit(phase, 0, k)
        group, rest = divmod(k, pp * v)
        chunk = rest // pp
        return Unit(phase, chunk if phase == "F" else v - 1 - chunk, group * pp + rest % pp)

    warm = warmup_forwards(schedule, pp, stage, microbatches, v)
    units = [unit(k, "F") for k in range(warm)]
    for i in range(total - warm):
        units += [unit(warm + i, "F"), unit(i, "B")]
    return units + [unit(k, "B") for k in range(total - warm, total)]


def check_schedule(schedule: str, pp: int, microbatches: int, virtual_stages: int) -> None:
    """Raise PipelineError for a schedule that cannot run these settings."""
    if schedule not in SCHEDULES:
        raise PipelineError(
            f"unknown pipeline schedule {schedule!r}; known: {', '.join(SCHEDULES)}",
            schedule=schedule,
        )
    if microbatches < 1 or pp < 1 or virtual_stages < 1:
        raise PipelineError(
            f"micro-batches ({microbatches}), pp ({pp}) and virtual stages ({virtual_stages}) "
            "must be positive"
        )
    if schedule != "interleaved" and virtual_stages != 1:
        raise PipelineError(
            f"virtual_stages={virtual_stages} needs the 'interleaved' schedule, not {schedule!r}"
        )
    if schedule == "interleaved" and microbatches % pp:
        raise PipelineError(
            f"the interleaved schedule needs micro-batches ({microbatches}) divisible by the "
            f"pipeline size ({pp})",
            microbatches=microbatches,
        )


def bubble_fraction(pp: int, microbatches: int, virtual_stages: int = 1) -> float:
    """Idle fraction of a step: (pp-1) / (v*M + pp-1); v = 1 for GPipe and 1F1B."""
    return (pp - 1) / (virtual_stages * microbatches + pp - 1)


# -- send/recv check ----------------------------------------------------------------------

Key = tuple[int, int, str]  # (sending stage, receiving stage, tag)


def p2p_key(stage: int, op: DistOp) -> Key:
    """The (src, dst, tag) a send or recv op on `stage` pairs by."""
    peer, tag = int(op.attrs["peer_stage"]), str(op.attrs["tag"])
    return (stage, peer, tag) if op.kind == "send" else (peer, stage, tag)


def _p2p(stages: Sequence[DistProgram], kind: str) -> dict[Key, tuple[int, DistOp]]:
    """Every send (or recv) by (src, dst, tag); a duplicate key is an error."""
    found: dict[Key, tuple[int, DistOp]] = {}
    for s, program in enumerate(stages):
        for op in program.ops:
            if op.kind != kind:
                continue
            peer = int(op.attrs["peer_stage"])
            if not 0 <= peer < len(stages) or peer == s:
                raise PipelineError(
                    f"{kind} {op.name!r} on stage {s} names peer stage {peer}; the pipeline has "
                    f"stages 0..{len(stages) - 1}",
                    op=op.name,
                )
            key = p2p_key(s, op)
            if key in found:
                raise PipelineError(
                    f"{kind} {op.name!r} on stage {s} repeats tag {key[2]!r} of {kind} "
                    f"{found[key][1].name!r} on stage {found[key][0]}",
                    op=op.name,
                )
            found[key] = (s, op)
    return found


def _describe(program: DistProgram, value: str) -> tuple[str, str]:
    """(comparable local type text, text with the global type and placements)."""
    t, spec = program.types[value], program.specs[value]
    try:
        local = f"{t.dtype}[{','.join(map(str, local_shape(t.shape, spec.mesh, spec.placements)))}]"
    except PlacementError:
        local = f"{t.dtype}[?] (global {t} does not divide as {spec})"
    placements = "".join(str(p) for p in spec.placements)
    return f"{local} {placements}", f"{local} (global {t}, {placements or 'R'})"


def _touching(program: DistProgram, value: str, reads: bool) -> str:
    """`, where op X reads it` (or writes it), for an error message; empty if none does."""
    for op in program.ops:
        if value in (op.inputs if reads else op.outputs):
            return f" (where op {op.name!r} {'reads' if reads else 'computes'} it)"
    return ""


def check_send_recv(pipeline: PipelineProgram) -> None:
    """Raise PipelineError unless every send meets one matching recv and nothing hangs."""
    stages = pipeline.stages
    sends, recvs = _p2p(stages, "send"), _p2p(stages, "recv")
    for key, (s, op) in sends.items():
        if key not in recvs:
            reader = _touching(stages[key[1]], key[2], reads=True)
            raise PipelineError(
                f"send {op.name!r} on stage {s} (tag {key[2]!r}) has no matching recv on stage "
                f"{key[1]}{reader}: the receiving stage never takes it and a blocking send "
                "would hang",
                send=op.name,
                stage=s,
                peer_stage=key[1],
            )
    for key, (s, op) in recvs.items():
        if key not in sends:
            producer = _touching(stages[key[0]], key[2], reads=False)
            raise PipelineError(
                f"recv {op.name!r} on stage {s} (tag {key[2]!r}) has no matching send on stage "
                f"{key[0]}{producer}: stage {s} would wait for ever",
                recv=op.name,
                stage=s,
                peer_stage=key[0],
            )
        src, send = sends[key]
        have, have_text = _describe(stages[src], send.inputs[0])
        want, want_text = _describe(stages[s], op.outputs[0])
        if have != want:
            raise PipelineError(
                f"send {send.name!r} on stage {src} sends {have_text} but recv {op.name!r} on "
                f"stage {s} expects {want_text}",
                send=send.name,
                recv=op.name,
            )
    execution_order(pipeline)


def execution_order(pipeline: PipelineProgram) -> list[tuple[int, DistOp]]:
    """(stage, op) in a run where sends never block and a recv waits for its send.

    Each stage runs until its next op is a recv whose send has not run yet, then the next
    stage gets its turn. Raises PipelineError on a deadlock (naming every waiting recv and
    the send it waits for) or when an op reads a value its stage does not hold yet.
    """
    stages = pipeline.stages
    pcs = [0] * len(stages)
    issued: set[Key] = set()
    held = [set(feeds) for feeds in pipeline.feeds]
    order: list[tuple[int, DistOp]] = []
    while any(pc < len(p.ops) for pc, p in zip(pcs, stages, strict=True)):
        progressed = False
        for s, program in enumerate(stages):
            while pcs[s] < len(program.ops):
                op = program.ops[pcs[s]]
                if op.kind == "recv" and p2p_key(s, op) not in issued:
                    break
                missing = [v for v in op.inputs if v not in held[s]]
                if missing:
                    raise PipelineError(
                        f"op {op.name!r} on stage {s} reads {missing[0]!r} before the stage "
                        "computes or receives it",
                        op=op.name,
                        stage=s,
                    )
                held[s].update(op.outputs)
                if op.kind == "send":
                    issued.add(p2p_key(s, op))
                order.append((s, op))
                pcs[s] += 1
                progressed = True
        if not progressed:
            raise _deadlock(pipeline, pcs)
    return order


def _deadlock(pipeline: PipelineProgram, pcs: list[int]) -> PipelineError:
    """The error naming each blocked recv and the send it waits for."""
    sends = _p2p(pipeline.stages, "send")
    waits = []
    for s, program in enumerate(pipeline.stages):
        if pcs[s] >= len(program.ops):
            continue
        recv = program.ops[pcs[s]]
        src = int(recv.attrs["peer_stage"])
        found = sends.get(p2p_key(s, recv))
        send = repr(found[1].name) if found else "(none)"
        waits.append(
            f"stage {s} waits in recv {recv.name!r} (op {pcs[s]}) for send {send} on stage {src}"
        )
    return PipelineError(
        f"pipeline deadlock under schedule {pipeline.schedule!r}: " + "; ".join(waits),
        waits=waits,
    )
