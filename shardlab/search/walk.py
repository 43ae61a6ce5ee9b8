"""The order in which a search plans its candidates, and what it skips (branch and bound).

Candidates wait in a queue; as each planned one comes back, the next is chosen, so every
worker stays busy and each choice knows every result so far. The queue is sorted: the meshes
without a pipeline first, down to the recomputation each needs (the pipelines' step bounds
stand on them, and the best of them is the first bar the pipelines must clear); then less
recomputation first (it only adds time); then each group's leanest candidate (same mesh,
recipe and recomputation: the probe that says whether any of them can fit); then
the least step bound. A candidate is skipped, with one line saying why,

- when a leaner candidate was clearly over the memory (`bound.leaner_or_equal`,
  `bound.clearly_short`): its own next recomputation is queued instead;
- when its step bound cannot beat the best plan so far (`bound.cannot_win`): the flat
  plans' work with the pipeline's bubble, its busiest stage and its warm-up, or the same
  with the layer units of a pipeline of its micro-batch planned before it
  (`bound.units_bound`), each then its first stage's gradient reduce-scatter
  (`floors.Floors`); or the stages of a pipelined sibling planned before it
  (`bound.sibling_bound`: the same units with another data-parallel recipe).

A candidate waits while a leaner one of its group is being planned, and a pipeline while a
mesh without one is. A planned candidate that does not fit queues its next recomputation
and, without pipeline stages, twice its micro-batches of gradient accumulation
(`space.leaner`), each bounded by its step (both only add work); a tensor-parallel one
without sequence parallelism queues nothing (its twin with it is leaner).

A candidate of a deep model is screened first (`screen`): planned on two shallow copies of
the model, its figures drawn to full depth, which less a margin
bound the full plan's from below. Over the memory, it is skipped as a candidate that does
not fit (and its leaner recipes queued, bounded by its step); else it goes back to the queue
with its screened step as its bound, and is planned at full depth unless that bound cannot
beat the best plan by then. Only full plans are ranked.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from shardlab.search.bound import (
    MEMORY_SLACK,
    FlatWork,
    LayerUnits,
    SiblingWork,
    bounds_sibling,
    cannot_win,
    clearly_short,
    flat_work,
    heavier_reason,
    leaner_or_equal,
    leanness,
    pipeline_basis,
    sibling_bound,
    sibling_work,
    step_bound,
    unit_work,
    units_bound,
)
from shardlab.search.evaluate import Evaluation
from shardlab.search.floors import Floors, gathered
from shardlab.search.screen import least_memory, least_step, screened_at, screens
from shardlab.search.space import GATHERING, RECOMPUTE, Candidate, ModelShape, Pruned, leaner

Progress = Callable[[float, str], None]


class Planner(Protocol):
    """Plans candidates in the background: `submit` one (to `screen` it, or plan it at full
    depth), `next_done` waits for any."""

    def submit(self, candidate: Candidate, screen: bool = False) -> None: ...

    def next_done(self) -> Evaluation: ...


@dataclass(frozen=True)
class _Waiting:
    """A queued candidate and, for a recomputation of a planned one, that one's step (its
    own cannot be shorter) and label."""

    candidate: Candidate
    parent_step: float | None = None
    parent: str = ""
    #: its screened figures (`screen`), once screened
    screened: Evaluation | None = None
    #: planned only for the pipelines' bound: kept out of the results
    reference: bool = False


@dataclass(frozen=True)
class Work:
    """What the bounds stand on so far: the flat plans' work per tensor-parallel degree, the
    pipelined siblings' stages and the layer units of pipelines of each micro-batch
    (`bound.flat_work`, `bound.sibling_work`, `bound.unit_work`)."""

    flat: dict[int, FlatWork]
    siblings: dict[tuple[object, ...], SiblingWork]
    units: dict[tuple[object, ...], dict[str, LayerUnits]]
    #: what a pipelined candidate's own parameters force (`floors.Floors`)
    floors: Floors | None = None


@dataclass
class Walk:
    """The evaluations made (full plans), the candidates skipped with their reasons, and
    every screening made."""

    evaluations: list[Evaluation]
    skipped: list[Pruned]
    screened: list[Evaluation] = field(default_factory=list)
    #: the flat plans made only for the pipelines' bound (`walk`'s `references`)
    references: list[Evaluation] = field(default_factory=list)


def walk(
    candidates: list[Candidate],
    shape: ModelShape,
    pool: Planner,
    width: int,
    report: Progress,
    references: Sequence[Candidate] = (),
    floors: Floors | None = None,
    flat_done: Callable[[Walk], None] | None = None,
) -> Walk:
    """Plan `candidates` (and the leaner recipes memory asks for), `width` at a time;
    `references`: flat candidates (screened where they can be) planned only for the
    pipelines' bound (`bound.flat_work`), kept out of the results; `floors`: what the
    candidates' own parameters force (`floors.Floors`: the first stage's tail, FSDP's
    gathers); `flat_done`: called once with the walk so far when every candidate without
    pipeline stages is planned (none is queued after: pipelines wait for them)."""
    out = Walk([], [])
    queue = [_Waiting(c) for c in candidates] + [_Waiting(c, reference=True) for c in references]
    short: list[Evaluation] = []  # planned or screened, and clearly over the memory
    running: dict[Candidate, _Waiting] = {}
    seen = {q.candidate for q in queue}  # a leaner recipe two parents ask for is queued once

    def queue_leaner(c: Candidate, parent_step: float | None = None, parent: str = "") -> None:
        for x in _next_leaner(c, shape):
            if x not in seen:
                seen.add(x)
                queue.append(_Waiting(x, parent_step, parent))

    while queue or running:
        if flat_done is not None and not _flat_left(queue, running):
            flat_done(out)
            flat_done = None
        known = out.evaluations + out.screened + out.references
        work = Work(flat_work(known), sibling_work(known), unit_work(known), floors)
        queue.sort(key=_order(queue, work, shape.layers))
        best = _best_step(out.evaluations)
        i = 0
        while i < len(queue) and len(running) < width:
            c = queue[i].candidate
            if _must_wait(c, queue, list(running)):
                i += 1
                continue
            q = queue.pop(i)
            if q.reference:
                pool.submit(c, screens(c, shape.layers))
                running[c] = q
                continue
            lean = next((e for e in short if leaner_or_equal(e.candidate, c)), None)
            if lean is not None:
                out.skipped.append(Pruned(c.label(), heavier_reason(lean)))
                queue_leaner(c)
                continue
            bound, basis = _bound(q, work, shape.layers)
            if cannot_win(bound, best):
                assert bound is not None and best is not None
                least = f"{basis} at least {bound * 1e3:.1f} ms"
                out.skipped.append(Pruned(c.label(), f"cannot beat {best * 1e3:.1f} ms: {least}"))
                continue
            pool.submit(c, q.screened is None and screens(c, shape.layers))
            running[c] = q
        if not running:
            continue
        report(0.05 + 0.9 * (1 - (len(queue) + len(running)) / len(seen)),
               _progress_line(out, len(seen), len(queue) + len(running)))  # fmt: skip
        e = pool.next_done()
        q = running.pop(e.candidate)
        if q.reference:
            out.references.append(e)
            continue
        if e.screened is not None and e.error is None:
            out.screened.append(e)
            need = least_memory(e)
            if need > e.usable_bytes * (1 + MEMORY_SLACK):
                short.append(e)
            if need <= e.usable_bytes:  # back to the queue, bounded by its screened step
                queue.append(replace(q, screened=e))
                continue
            out.skipped.append(Pruned(e.candidate.label(), _screened_short(e), need))
            queue_leaner(e.candidate, least_step(e), e.candidate.label())
            continue
        out.evaluations.append(e)
        if clearly_short(e):
            short.append(e)
        if e.error is None and not e.fits:
            queue_leaner(e.candidate, e.step_time_s, e.candidate.label())
    if flat_done is not None:
        flat_done(out)
    return out


def _flat_left(queue: list[_Waiting], running: dict[Candidate, _Waiting]) -> bool:
    """Whether a candidate without pipeline stages is queued or being planned."""
    return any(c.mesh.pp == 1 for c in running) or any(q.candidate.mesh.pp == 1 for q in queue)


def _progress_line(out: Walk, total: int, waiting: int) -> str:
    """`screened 40, planned 12, skipped 300 of 798 candidates (20 waiting); best 1018.6 ms:
    pp=8,...`: where the walk stands, for the progress callback."""
    line = (f"screened {len(out.screened)}, planned {len(out.evaluations)}, skipped "
            f"{len(out.skipped)} of {total} candidates ({waiting} waiting)")  # fmt: skip
    fitting = [e for e in out.evaluations if e.fits and e.step_time_s is not None]
    best = min(fitting, key=lambda e: e.step_time_s or 0.0, default=None)
    if best is not None:
        line += f"; best {(best.step_time_s or 0.0) * 1e3:.1f} ms: {best.candidate.label()}"
    return line


def _screened_short(e: Evaluation) -> str:
    """One line for a candidate whose screened memory is over the usable memory."""
    gib = float(1 << 30)
    return (f"needs at least {least_memory(e) / gib:.1f} GiB of "
            f"{e.usable_bytes / gib:.1f} GiB usable ({screened_at(e)})")  # fmt: skip


def _must_wait(c: Candidate, queue: list[_Waiting], running: list[Candidate]) -> bool:
    """Whether `c` waits for what is being planned: a pipeline for the meshes without one
    (its bound stands on them), any candidate for a leaner one in its group (which may rule
    it out), a pipelined one for a sibling whose stages bound its step (`bound`), and under
    FSDP for its queued siblings too (their units are no longer than its own)."""
    if c.mesh.pp > 1 and any(x.mesh.pp == 1 for x in running):
        return True
    if c.mesh.pp > 1 and any(q.candidate.mesh.pp == 1 for q in queue):
        return True
    if any(leaner_or_equal(x, c) or bounds_sibling(x, c) for x in running):
        return True
    return c.dp_recipe in GATHERING and any(bounds_sibling(q.candidate, c) for q in queue)


def _order(
    queue: list[_Waiting], work: Work, layers: int
) -> Callable[[_Waiting], tuple[bool, int, bool, float]]:
    leanest: dict[tuple[object, ...], tuple[int, ...]] = {}
    for q in queue:
        key = _group(q.candidate)
        leanest[key] = max(leanest.get(key, leanness(q.candidate)), leanness(q.candidate))

    def order(q: _Waiting) -> tuple[bool, int, bool, float]:
        c = q.candidate
        probe = leanness(c) == leanest[_group(c)]
        least = _bound(q, work, layers)[0] or 0.0
        return (c.mesh.pp > 1, RECOMPUTE.index(c.recompute), not probe, least)

    return order


def _group(c: Candidate) -> tuple[object, ...]:
    fsdp = (c.schedule, c.virtual_stages) if c.dp_recipe in GATHERING else None
    return (c.mesh, c.dp_recipe, c.recompute, c.schedule is None, fsdp)


def _bound(q: _Waiting, work: Work, layers: int) -> tuple[float | None, str]:
    """The least step `q` can have, and what that stands on: its screened step, its
    parent's step (a leaner recipe only adds work), its pipeline's bound or its siblings'
    stages (`bound`)."""
    bounds: list[tuple[float, str]] = []
    if q.screened is not None and q.screened.step_time_s is not None:
        bounds.append((least_step(q.screened), f"{screened_at(q.screened)}, it takes"))
    if q.parent_step is not None:
        bounds.append((q.parent_step, f"{q.parent} takes"))
    c, floors = q.candidate, work.floors
    gather = floors.gather(c) if floors is not None and c.mesh.pp > 1 else 0.0
    tp = c.mesh.tp
    flat = {tp: gathered(work.flat[tp], c, gather, layers)} if tp in work.flat else {}
    stages: list[tuple[float, str]] = []  # bounds on when the stages end their units
    pipeline = step_bound(c, flat, layers)
    if pipeline is not None:
        stages.append((pipeline, pipeline_basis(c, flat, layers)))
    units = units_bound(c, work.units, work.flat, layers, gather)
    if units is not None:
        stages.append(units)
    tail = floors.tail(c) if floors is not None and stages else 0.0
    for end, basis in stages:
        bounds.append((end + tail, _then_tail(basis) if tail > 0 else basis))
    sibling = sibling_bound(q.candidate, work.siblings)
    if sibling is not None:
        bounds.append((sibling[0], f"the stages of {sibling[1]} alone take"))
    if not bounds:
        return None, ""
    return max(bounds, key=lambda b: b[0])


def _then_tail(basis: str) -> str:
    """`its busiest stage takes` -> `its busiest stage, then its first stage's gradient
    reduce-scatter, take`."""
    subject = basis.removesuffix(" takes").removesuffix(" take")
    return f"{subject}, then its first stage's gradient reduce-scatter, take"


def _best_step(evaluations: list[Evaluation]) -> float | None:
    steps = [e.step_time_s for e in evaluations if e.fits and e.step_time_s is not None]
    return min(steps) if steps else None


def _next_leaner(c: Candidate, shape: ModelShape) -> list[Candidate]:
    """The next recomputation of `c`, which did not fit, and without a pipeline twice its
    micro-batches (module docstring)."""
    if c.mesh.tp > 1 and not c.sequence_parallel:
        return []
    return leaner(c, shape)
