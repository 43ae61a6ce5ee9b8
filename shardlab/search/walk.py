"""The order in which a search plans its candidates, and what it skips (branch and bound).

Candidates wait in a queue; as each planned one comes back, the next is chosen, so every
worker stays busy and each choice knows every result so far. The queue is sorted: the meshes
without a pipeline first, down to the recomputation each needs (the pipelines' step bounds
stand on them, and the best of them is the first bar the pipelines must clear); then less
recomputation first (it only adds time); then each group's leanest candidate (same mesh,
schedule, recipe and recomputation: the probe that says whether any of them can fit); then
the least step bound. A candidate is skipped, with one line saying why,

- when a leaner candidate was clearly over the memory (`bound.leaner_or_equal`,
  `bound.clearly_short`): its own next recomputation is queued instead;
- when its step bound cannot beat the best plan so far (`bound.cannot_win`).

A candidate waits while a leaner one of its group is being planned, and a pipeline while a
mesh without one is. A planned candidate that does not fit queues its next recomputation
and, without pipeline stages, twice its micro-batches of gradient accumulation
(`space.leaner`), each bounded by its step (both only add work); a tensor-parallel one
without sequence parallelism queues nothing (its twin with it is leaner).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from shardlab.search.bound import (
    cannot_win,
    clearly_short,
    flat_work,
    heavier_reason,
    leaner_or_equal,
    leanness,
    pipeline_basis,
    step_bound,
)
from shardlab.search.evaluate import Evaluation
from shardlab.search.space import RECOMPUTE, Candidate, ModelShape, Pruned, leaner

Progress = Callable[[float, str], None]


class Planner(Protocol):
    """Plans candidates in the background: `submit` one, `next_done` waits for any."""

    def submit(self, candidate: Candidate) -> None: ...

    def next_done(self) -> Evaluation: ...


@dataclass(frozen=True)
class _Waiting:
    """A queued candidate and, for a recomputation of a planned one, that one's step (its
    own cannot be shorter) and label."""

    candidate: Candidate
    parent_step: float | None = None
    parent: str = ""


@dataclass
class Walk:
    """The evaluations made and the candidates skipped, with their reasons."""

    evaluations: list[Evaluation]
    skipped: list[Pruned]


def walk(
    candidates: list[Candidate], shape: ModelShape, pool: Planner, width: int, report: Progress
) -> Walk:
    """Plan `candidates` (and the leaner recipes memory asks for), `width` at a time."""
    out = Walk([], [])
    queue = [_Waiting(c) for c in candidates]
    short: list[Evaluation] = []  # planned, and clearly over the memory
    running: list[Candidate] = []
    while queue or running:
        work = flat_work(out.evaluations)
        queue.sort(key=_order(queue, work))
        best = _best_step(out.evaluations)
        i = 0
        while i < len(queue) and len(running) < width:
            c = queue[i].candidate
            if _must_wait(c, queue, running):
                i += 1
                continue
            q = queue.pop(i)
            lean = next((e for e in short if leaner_or_equal(e.candidate, c)), None)
            if lean is not None:
                out.skipped.append(Pruned(c.label(), heavier_reason(lean)))
                queue += [_Waiting(x) for x in _next_leaner(c, shape)]
                continue
            bound, basis = _bound(q, work)
            if cannot_win(bound, best):
                assert bound is not None and best is not None
                least = f"{basis} at least {bound * 1e3:.1f} ms"
                out.skipped.append(Pruned(c.label(), f"cannot beat {best * 1e3:.1f} ms: {least}"))
                continue
            pool.submit(c)
            running.append(c)
        if not running:
            continue
        planned = len(out.evaluations)
        report(0.05 + 0.9 * planned / (planned + len(running) + len(queue)),
               f"planned {planned} candidates, skipped {len(out.skipped)}, "
               f"{len(queue) + len(running)} waiting")  # fmt: skip
        e = pool.next_done()
        running.remove(e.candidate)
        out.evaluations.append(e)
        if clearly_short(e):
            short.append(e)
        if e.error is None and not e.fits:
            label = e.candidate.label()
            queue += [_Waiting(c, e.step_time_s, label) for c in _next_leaner(e.candidate, shape)]
    return out


def _must_wait(c: Candidate, queue: list[_Waiting], running: list[Candidate]) -> bool:
    """Whether `c` waits for what is being planned: a pipeline for the meshes without one
    (its bound stands on them), any candidate for a leaner one in its group (which may rule
    it out)."""
    if c.mesh.pp > 1 and any(x.mesh.pp == 1 for x in running):
        return True
    if c.mesh.pp > 1 and any(q.candidate.mesh.pp == 1 for q in queue):
        return True
    return any(leaner_or_equal(x, c) for x in running)


def _order(
    queue: list[_Waiting], work: dict[int, float]
) -> Callable[[_Waiting], tuple[bool, int, bool, float]]:
    leanest: dict[tuple[object, ...], tuple[int, int, int]] = {}
    for q in queue:
        key = _group(q.candidate)
        leanest[key] = max(leanest.get(key, leanness(q.candidate)), leanness(q.candidate))

    def order(q: _Waiting) -> tuple[bool, int, bool, float]:
        c = q.candidate
        probe = leanness(c) == leanest[_group(c)]
        return (c.mesh.pp > 1, RECOMPUTE.index(c.recompute), not probe, _bound(q, work)[0] or 0.0)

    return order


def _group(c: Candidate) -> tuple[object, ...]:
    return (c.mesh, c.schedule, c.virtual_stages, c.dp_recipe, c.recompute)


def _bound(q: _Waiting, work: dict[int, float]) -> tuple[float | None, str]:
    """The least step `q` can have, and what that stands on."""
    pipeline = step_bound(q.candidate, work)
    if q.parent_step is not None and (pipeline is None or q.parent_step > pipeline):
        return q.parent_step, f"{q.parent} takes"
    if pipeline is not None:
        return pipeline, pipeline_basis(q.candidate)
    return None, ""


def _best_step(evaluations: list[Evaluation]) -> float | None:
    steps = [e.step_time_s for e in evaluations if e.fits and e.step_time_s is not None]
    return min(steps) if steps else None


def _next_leaner(c: Candidate, shape: ModelShape) -> list[Candidate]:
    """The next recomputation of `c`, which did not fit, and without a pipeline twice its
    micro-batches (module docstring)."""
    if c.mesh.tp > 1 and not c.sequence_parallel:
        return []
    return leaner(c, shape)
