"""Run a pipeline's stage programs together under random interleavings, policing buffers.

`runtime.pipeline_exec` runs the stages in one fixed order (`execution_order`). Here every
op of every stage is an event in one random linear extension (`simulated.random_events`), as
in `run_simulated(..., interleave=seed)` for one program, with the asynchronous semantics of
`runtime.hazards` on each stage:

- an op is issued once its deps and its stream predecessor (on its own stage) are done;
- `send` and `recv` are asynchronous: a send reads its input when it completes (the latest
  moment it may, so a free or an in-place write while it is in flight is caught) and posts a
  copy to the `Mailbox`; a recv completes only after its send has, taking the copy. Sends are
  eager (they never wait for the recv to be posted), as `execution_order` assumes;
- compute ops run where they are issued; comm ops complete at a random later point.

The first hazard raises `HazardError` naming the stage, both ops and the value. If the run
stalls, every stage still blocked is named with the op it is stuck at: the cross-stage hang
that a pipeline with mismatched send/recv order hits. A hazard-free pipeline gives
bit-identical blocks under every interleaving and in program order (`run_interleavings`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping

from shardlab.errors import ExecutionError
from shardlab.ops.base import Array
from shardlab.passes.pipeline import PipelineProgram
from shardlab.passes.pipeline_schedule import Key, p2p_key
from shardlab.program import DistOp
from shardlab.runtime import hazards as hz
from shardlab.runtime.pipeline_exec import stage_feeds
from shardlab.runtime.simulated import Blocks, Mailbox, ProgramRun, random_events

__all__ = ["run_pipeline_interleaved", "run_pipeline_interleavings"]


def _stage_key(stage: int) -> Callable[[DistOp], Key]:
    """How a send or recv op of `stage` names its message: (src, dst, tag)."""

    def key(op: DistOp) -> Key:
        return p2p_key(stage, op)

    return key


def run_pipeline_interleaved(
    pipeline: PipelineProgram, sources: Mapping[str, Array], seed: int = 0, interleave: int = 0
) -> list[Blocks]:
    """Every stage's blocks after one step run in the random order picked by `interleave`
    (sources split with `seed`). HazardError on the first hazard; ExecutionError on a stall."""
    blocks = stage_feeds(pipeline, sources, seed)
    offsets: list[int] = []
    preds: list[list[int]] = []
    asynchronous: list[bool] = []
    runs: list[ProgramRun] = []
    shared = Mailbox(_stage_key(0))
    for s, program in enumerate(pipeline.stages):
        base = len(preds)
        offsets.append(base)
        preds += [[base + p for p in ps] for ps in hz.predecessors(program.ops)]
        asynchronous += [hz.is_async(op) for op in program.ops]
        mailbox = shared.view(_stage_key(s))
        run = ProgramRun(program, hz.buffers_of(program), blocks[s], interleave, mailbox)
        run.context = f" on stage {s} (pipeline interleaving seed {interleave})"
        runs.append(run)
    where = [(s, i) for s, p in enumerate(pipeline.stages) for i in range(len(p.ops))]
    sends = {
        p2p_key(s, op): offsets[s] + i
        for s, p in enumerate(pipeline.stages)
        for i, op in enumerate(p.ops)
        if op.kind == hz.SEND
    }
    done_after: dict[int, list[int]] = {}
    for s, program in enumerate(pipeline.stages):
        for i, op in enumerate(program.ops):
            if op.kind == hz.RECV and p2p_key(s, op) in sends:
                done_after[offsets[s] + i] = [sends[p2p_key(s, op)]]
    finished = [False] * len(preds)
    for g, done in random_events(preds, asynchronous, random.Random(interleave), done_after):
        s, i = where[g]
        if done and asynchronous[g]:
            runs[s].complete(i)
        else:
            runs[s].issue(i)
        finished[g] = done
    if not all(finished):
        raise _stalled(pipeline, offsets, finished, interleave)
    return blocks


def run_pipeline_interleavings(
    pipeline: PipelineProgram, sources: Mapping[str, Array], n: int = 10, seed: int = 0
) -> list[Blocks]:
    """Blocks of `n` random interleavings (seeds `seed`, `seed + 1`, ...), checked to be
    bit-identical to each other; HazardError on the first hazard, ExecutionError if two runs
    differ or one stalls."""
    if n < 1:
        raise ExecutionError(f"run_pipeline_interleavings needs n >= 1, got {n}")
    first = run_pipeline_interleaved(pipeline, sources, seed, seed)
    for k in range(1, n):
        again = run_pipeline_interleaved(pipeline, sources, seed, seed + k)
        same_stage_blocks(first, again, f"pipeline interleavings {seed} and {seed + k}")
    return first


def same_stage_blocks(want: list[Blocks], got: list[Blocks], what: str) -> None:
    """ExecutionError naming the first stage, value and rank where two runs differ bit-wise."""
    for s, (a, b) in enumerate(zip(want, got, strict=True)):
        if a.keys() != b.keys():
            diff = sorted(a.keys() ^ b.keys())[:5]
            raise ExecutionError(f"{what} made different values on stage {s}: {diff}", stage=s)
        for name, ranks in a.items():
            for r, x in ranks.items():
                y = b[name][r]
                if x.shape != y.shape or x.dtype != y.dtype or x.tobytes() != y.tobytes():
                    raise ExecutionError(
                        f"{what} disagree on {name!r} at rank {r} of stage {s}",
                        stage=s,
                        value=name,
                        rank=r,
                    )


def _stalled(
    pipeline: PipelineProgram, offsets: list[int], finished: list[bool], interleave: int
) -> ExecutionError:
    """The error naming, per blocked stage, the first op that never completed."""
    stuck = []
    for s, program in enumerate(pipeline.stages):
        for i, op in enumerate(program.ops):
            if not finished[offsets[s] + i]:
                peer = f" from stage {op.attrs.get('peer_stage')}" if op.kind == hz.RECV else ""
                stuck.append(f"stage {s} at {op.name!r} ({op.kind}{peer}, op {i})")
                break
    return ExecutionError(
        f"pipeline stalled (interleaving seed {interleave}): " + "; ".join(stuck), stuck=stuck
    )
