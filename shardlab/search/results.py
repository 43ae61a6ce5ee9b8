"""A search's answer: candidates ranked, the Pareto front of step time against memory, and
why the winner won.

Ranking: a candidate that fits always comes before one that does not; among those that fit,
the faster first (then the leaner). The Pareto front holds the fitting candidates no other
fitting candidate beats on both step time and peak memory per rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shardlab.search.evaluate import Evaluation
from shardlab.search.identical import merge_identical, simplicity
from shardlab.search.refine import Refinement
from shardlab.search.space import Pruned

SEARCH_FORMAT = "shardlab.search/1"


@dataclass
class SearchResult:
    """Every evaluated candidate (ranked), the pruned ones with their reasons, the front."""

    model: str
    cluster: str
    gpus: int
    global_batch: int
    ranked: list[Evaluation]
    pruned: list[Pruned]  # meshes that cannot run
    #: candidates not planned: their bounds say they cannot fit or cannot win (`bound`)
    skipped: list[Pruned] = field(default_factory=list)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    #: the per-op refinement of the best tensor-parallel plan, when one was made
    refinement: Refinement | None = None
    #: how many candidates were screened on shallow copies of the model, and how far the
    #: screened figures were from the full plans of those planned after (`screen`)
    screening: dict[str, Any] | None = None

    @property
    def planned(self) -> int:
        """How many candidates were planned in full: every row and the candidates merged
        into it (`identical`)."""
        return sum(1 + len(e.same_plan) for e in self.ranked)

    @property
    def feasible(self) -> list[Evaluation]:
        return [e for e in self.ranked if e.fits]

    @property
    def winner(self) -> Evaluation | None:
        return self.feasible[0] if self.feasible else None

    def pareto(self) -> list[Evaluation]:
        """The fitting candidates no other fitting one beats on both time and memory,
        fastest first."""
        front: list[Evaluation] = []
        best_memory = None
        for e in sorted(self.feasible, key=lambda e: (e.step_time_s, e.peak_memory_bytes)):
            if best_memory is None or (e.peak_memory_bytes or 0) < best_memory:
                front.append(e)
                best_memory = e.peak_memory_bytes
        return front

    def why(self) -> list[str]:
        """The winner against the runner-up: step-time terms, memory, communication."""
        feasible = self.feasible
        if not feasible:
            return ["no candidate fits: " + _closest(self.ranked, self.skipped)]
        win = feasible[0]
        lines = [f"winner: {win.candidate.label()}: step {_ms(win.step_time_s)}, peak "
                 f"{_gib(win.peak_memory_bytes)} GiB, MFU {(win.mfu or 0):.1%}"]  # fmt: skip
        if len(feasible) < 2:
            return [*lines, "no other candidate fits"]
        run = feasible[1]
        lines.append(f"runner-up: {run.candidate.label()}: step {_ms(run.step_time_s)} "
                     f"(+{(run.step_time_s or 0) / (win.step_time_s or 1) - 1:.1%}), peak "
                     f"{_gib(run.peak_memory_bytes)} GiB")  # fmt: skip
        for term in sorted(set(win.terms) | set(run.terms)):
            a, b = win.terms.get(term), run.terms.get(term)
            if a is None or b is None:
                continue
            shown = (lambda x: f"{x:.1%}") if term.endswith("fraction") else _ms
            lines.append(f"  {term}: {shown(a)} against {shown(b)}")
        lines.append(f"  communication per rank: {win.comm_bytes_per_rank / 1e9:.2f} GB against "
                     f"{run.comm_bytes_per_rank / 1e9:.2f} GB")  # fmt: skip
        return lines + self._refinement_lines()

    def _refinement_lines(self) -> list[str]:
        """What the per-op program found against the templates it started from."""
        r = self.refinement
        if r is None:
            return []
        if r.evaluation is None or r.evaluation.step_time_s is None:
            return [f"per-op refinement of {r.base.candidate.label()}: {r.error or 'none'}"]
        e, b = r.evaluation, r.base
        change = (e.step_time_s or 0.0) / (b.step_time_s or 1.0) - 1
        verdict = (
            "beats every template combination"
            if e is self.winner
            else (f"{'fits' if e.fits else 'does not fit'}, {change:+.1%} against its templates")
        )
        lines = [f"per-op refinement of {b.candidate.label()}: step {_ms(e.step_time_s)}, "
                 f"{verdict}"]  # fmt: skip
        if not r.differs:
            lines.append("  it places every value of the layer as the templates do")
        lines += [f"  {v}: {t} in the templates, {i} in the program" for v, t, i in r.differs]
        return lines

    def to_json(self) -> dict[str, Any]:
        return {
            "format": SEARCH_FORMAT,
            "model": self.model,
            "cluster": self.cluster,
            "gpus": self.gpus,
            "global_batch": self.global_batch,
            "seconds": self.seconds,
            "planned": self.planned,
            "candidates": [e.to_json() for e in self.ranked],
            "pareto": [self.ranked.index(e) for e in self.pareto()],
            "pruned": [p.to_json() for p in self.pruned],
            "skipped": [p.to_json() for p in self.skipped],
            "why": self.why(),
            "notes": list(self.notes),
            "refinement": self.refinement.to_json() if self.refinement else None,
            "screening": self.screening,
        }

    def screening_line(self) -> str | None:
        """One line on screening: how many, and how far off where checked."""
        s = self.screening
        if not s or not s["screened"]:
            return None
        (s_lo, s_hi), (m_lo, m_hi) = s["step_error"], s["memory_error"]
        return (f"screened {s['screened']} candidates on shallow copies of the model; the "
                f"{s['checked']} then planned in full: step {s_lo:+.2%} to {s_hi:+.2%}, peak "
                f"memory {m_lo:+.2%} to {m_hi:+.2%} off their full plans")  # fmt: skip


def rank(evaluations: list[Evaluation]) -> list[Evaluation]:
    """Fitting first, then by step time and memory (the simpler recipe first among equals,
    `identical.simplicity`); unplannable last; each plan once (`identical`: the candidates
    with an identical plan are listed in its row)."""

    def key(e: Evaluation) -> tuple[int, float, float, tuple[int, ...]]:
        if e.error is not None:
            return (2, 0.0, 0.0, ())
        return (0 if e.fits else 1, e.step_time_s or 0.0, float(e.peak_memory_bytes or 0),
                simplicity(e.candidate))  # fmt: skip

    return merge_identical(sorted(evaluations, key=key))


def _closest(ranked: list[Evaluation], skipped: list[Pruned]) -> str:
    planned = [e for e in ranked if e.error is None]
    sized = [p for p in skipped if p.least_bytes is not None]
    if not planned and sized:
        least = min(sized, key=lambda p: p.least_bytes or 0.0)
        return f"the leanest, {least.what}, {least.reason}"
    if not planned:
        return "none could be planned"
    best = min(planned, key=lambda e: e.peak_memory_bytes or 0)
    return f"the leanest, {best.candidate.label()}, {best.reason}"


def _ms(seconds: float | None) -> str:
    return f"{(seconds or 0) * 1e3:.1f} ms"


def _gib(nbytes: int | None) -> str:
    return f"{(nbytes or 0) / (1 << 30):.1f}"
