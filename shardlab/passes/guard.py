"""The cost guard: with a cost model, a pass keeps its change only where the predicted step
does not get worse, and a pass's tunable option is chosen by cost.

`guard_pass` runs one pass under the guard, for any kind of program P (a `DistProgram`, a
pipeline of stage programs) and any cost C with a `step_time` (`PlanCost`, `PipelineCost`):

- the trials are the pass's options, or, for a pass with a tunable (`Pass.tune`) none of
  whose options the user set, one option set per candidate (`option_trials`). Candidates are
  tried as a descent from the default: the default first, then towards smaller values and
  towards larger ones, each direction until the step gets worse, so a pass whose default is
  best costs three trials, not one per candidate. A trial whose program equals the input or
  an earlier trial's is not costed again;
- the best trial (lowest step; on a tie, the one tried first, so the default wins) is kept
  when its step is no worse than the step without the pass (Δ step <= 0). Otherwise the stage
  keeps the program and cost it got, and its summary says what was declined and why.

Every guarded summary carries `declined` (bool), `declined_reason` (None when kept),
`step_before_s` (the step without the pass) and `step_after_s` (the best trial's step, kept
or not); a declined pass's own summary moves under `proposed`; a tuned pass adds `tuning`:
the chosen options and, for each trial in the order tried, its options and step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from shardlab.passes.base import Pass
from shardlab.program import DistProgram

__all__ = ["Costed", "Guarded", "guard_pass", "option_trials", "same_program"]


class Costed(Protocol):
    """What the guard reads of a cost: the predicted step time in seconds."""

    @property
    def step_time(self) -> float: ...


P = TypeVar("P")
C = TypeVar("C", bound=Costed)
#: runs the pass on a program with some options: (new program, the pass's summary)
Apply = Callable[[P, Mapping[str, Any]], tuple[P, dict[str, Any]]]


@dataclass(frozen=True, slots=True)
class Guarded(Generic[P, C]):
    """The program a guarded pass leaves (its input where declined), its cost and summary."""

    program: P
    cost: C
    summary: dict[str, Any]


@dataclass(frozen=True, slots=True)
class _Trial(Generic[P, C]):
    options: dict[str, Any]
    program: P
    summary: dict[str, Any]
    cost: C
    costed: bool  # False: the program equals the input or an earlier trial's


def option_trials(
    p: Pass, options: Mapping[str, Any], given: Mapping[str, Any], programs: Sequence[DistProgram]
) -> tuple[list[dict[str, Any]], int]:
    """The option sets to try and the index of the one to start from (the default): one
    per candidate of `p.tune` on `programs` when the user's options `given` set none of the
    options it tunes, else just `options`."""
    candidates = p.tune(programs) if p.tune is not None else []
    tuned = {k for c in candidates for k in c}
    if len(candidates) < 2 or tuned & set(given):
        return [dict(options)], 0
    trials = [{**options, **c} for c in candidates]
    default = {k: p.options.get(k) for k in tuned}
    start = next((i for i, c in enumerate(candidates) if c == default), 0)
    return trials, start


def same_program(a: DistProgram, b: DistProgram) -> bool:
    """True when two programs have equal ops (so equal costs: passes never change types of
    values they keep)."""
    return a is b or (len(a.ops) == len(b.ops) and a.ops == b.ops and a.specs == b.specs)


def guard_pass(
    trials: Sequence[Mapping[str, Any]],
    start: int,
    before: P,
    before_cost: C,
    apply: Apply[P],
    cost: Callable[[P], C],
    same: Callable[[P, P], bool],
) -> Guarded[P, C]:
    """Run a pass on `before` (which costs `before_cost`) with each option set of `trials`
    worth trying, descending from `trials[start]`; keep the best where it is no slower
    (module docstring). `same(a, b)`: a and b cost the same (equal programs)."""
    tried: list[_Trial[P, C]] = []

    def attempt(i: int) -> float:
        program, summary = apply(before, trials[i])
        twin = before_cost if same(program, before) else None
        for t in tried:
            if twin is None and same(program, t.program):
                twin = t.cost
        spent = twin if twin is not None else cost(program)
        tried.append(_Trial(dict(trials[i]), program, summary, spent, twin is None))
        return spent.step_time

    at_start = attempt(start)
    for direction in (-1, 1):
        i, current = start + direction, at_start
        while 0 <= i < len(trials):
            step = attempt(i)
            if step > current:
                break
            current, i = step, i + direction
    best = min(tried, key=lambda t: t.cost.step_time)  # min keeps the first of equals
    return _outcome(best, tried, before, before_cost)


def _outcome(
    best: _Trial[P, C], tried: Sequence[_Trial[P, C]], before: P, before_cost: C
) -> Guarded[P, C]:
    """The kept or declined stage, with the guard's fields in its summary."""
    old, new = before_cost.step_time, best.cost.step_time
    fields: dict[str, Any] = {"step_before_s": old, "step_after_s": new}
    tuning = _tuning(best, tried)
    chose = ""
    if tuning is not None:
        fields["tuning"] = tuning
        picked = ", ".join(f"{k} {_value(v)}" for k, v in tuning["chosen"].items())
        chose = f"; {picked} chosen by cost of {len(tried)} tried"
    message = str(best.summary.get("message", ""))
    if new <= old:
        summary = {**best.summary, "declined": False, "declined_reason": None, **fields}
        return Guarded(best.program, best.cost, {**summary, "message": message + chose})
    reason = f"step {_ms(new)} > {_ms(old)} without it"
    summary = {
        "declined": True,
        "declined_reason": reason,
        **fields,
        "proposed": best.summary,
        "message": f"declined: {reason} (it would have: {message}{chose})",
    }
    return Guarded(before, before_cost, summary)


def _tuning(best: _Trial[P, C], tried: Sequence[_Trial[P, C]]) -> dict[str, Any] | None:
    """The chosen values of the options the trials vary, and every trial's step."""
    keys = [k for k in best.options if len({repr(t.options[k]) for t in tried}) > 1]
    if not keys:
        return None
    trials = [
        {**{k: t.options[k] for k in keys}, "step_time_s": t.cost.step_time, "costed": t.costed}
        for t in tried
    ]
    return {"chosen": {k: best.options[k] for k in keys}, "trials": trials}


def tuning_text(tuning: Mapping[str, Any]) -> str:
    """One line of a tuned pass's trials: `bucket_mb 25: 2583.7 ms, 16: 2590.1 ms (chosen 25)`."""
    chosen = tuning["chosen"]
    parts = []
    for t in tuning["trials"]:
        values = "/".join(_value(t[k]) for k in chosen)
        parts.append(f"{values}: {_ms(float(t['step_time_s']))}")
    picked = "/".join(_value(v) for v in chosen.values())
    return f"{'/'.join(chosen)} {', '.join(parts)} (chosen {picked})"


def _ms(seconds: float) -> str:
    """Milliseconds, with enough digits to tell small steps apart."""
    ms = seconds * 1e3
    return f"{ms:.1f} ms" if ms >= 100 else f"{ms:.4g} ms"


def _value(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float | int) and not isinstance(v, bool) else str(v)
