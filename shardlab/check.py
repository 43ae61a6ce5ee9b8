"""A CI gate's verdict: a plan's predicted figures against budgets, each budget named with its
limit, the plan's figure and pass or fail; written as Markdown for a pull-request comment and
as a JUnit XML report for CI systems.

`judge(summary, budgets, baseline)` reads a plan's summary (`Plan.summary()`, the JSON the
service stores) and, for `max_regression_pct`, a baseline plan's; it works on plans built in
this process (`shardlab check --local`) and on stored ones alike. Budgets:

- `must_fit` (default on): the peak memory per rank is within the cluster's;
- `max_step_time_s`: the predicted step;
- `max_regression_pct`: the step against the baseline's, in percent (slower is positive);
- `max_fallback_ops`: ops placed by the generic replicated fallback (no SPMD rule);
- `min_mfu`: model FLOPs utilisation, a fraction (0.4 for 40%);
- `verify`: one training step on the simulated mesh matches one device
  (`shardlab.runtime.verify`); judged from the verification report. Verification holds every
  rank's tensors in float64, so it is refused up front for models too large for it
  (`verification_bytes`).
"""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any

from shardlab.errors import ShardlabError


class CheckError(ShardlabError):
    """A budget that cannot be judged: a negative limit, a plan without a cost."""

    code = "invalid_check"


@dataclass(frozen=True)
class Budgets:
    """What a plan must meet; None leaves a budget out."""

    must_fit: bool = True
    max_step_time_s: float | None = None
    max_regression_pct: float | None = None
    max_fallback_ops: int | None = None
    min_mfu: float | None = None
    verify: bool = False

    def __post_init__(self) -> None:
        for name in ("max_step_time_s", "max_regression_pct", "max_fallback_ops", "min_mfu"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise CheckError(f"budget {name} must be a number >= 0, got {value}", field=name)
        if self.min_mfu is not None and self.min_mfu > 1:
            raise CheckError(f"budget min_mfu is a fraction of peak (0 to 1), got {self.min_mfu}",
                             field="min_mfu")  # fmt: skip


@dataclass(frozen=True)
class Result:
    """One budget judged: its name, the limit, the plan's figure, and whether it held."""

    budget: str
    limit: str
    figure: str
    passed: bool

    def to_json(self) -> dict[str, Any]:
        return {"budget": self.budget, "limit": self.limit, "figure": self.figure,
                "passed": self.passed}  # fmt: skip


@dataclass
class Verdict:
    """Every budget's result for one plan; it passes when all of them do."""

    plan: str  # what was checked: model, mesh, templates
    results: list[Result] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    def to_json(self) -> dict[str, Any]:
        return {"plan": self.plan, "passed": self.passed,
                "results": [r.to_json() for r in self.results]}  # fmt: skip

    def markdown(self, link: str | None = None) -> str:
        """A pull-request comment: the verdict, then one table row per budget."""
        head = "✅ **Shardlab check passed**" if self.passed else "❌ **Shardlab check failed**"
        failed = [r.budget for r in self.results if not r.passed]
        plan = markdown_text(self.plan)  # the user's model and strategy: text, never markup
        lines = [f"{head}: {plan}" + (f" ({', '.join(failed)})" if failed else ""), ""]
        lines += ["| budget | limit | plan | result |", "|---|---|---|---|"]
        lines += [f"| {r.budget} | {r.limit} | {r.figure} | {'pass' if r.passed else '**FAIL**'} |"
                  for r in self.results]  # fmt: skip
        if link:
            lines += ["", f"[Open the plan in Shardlab]({link})"]
        return "\n".join(lines) + "\n"

    def junit(self) -> str:
        """A JUnit XML report: one test case per budget, a failure for each that did not hold."""
        suite = ET.Element("testsuite", name="shardlab check", tests=str(len(self.results)),
                           failures=str(sum(not r.passed for r in self.results)))  # fmt: skip
        for r in self.results:
            case = ET.SubElement(suite, "testcase", classname=self.plan, name=r.budget)
            if not r.passed:
                failure = ET.SubElement(case, "failure", message=f"{r.figure} against {r.limit}")
                failure.text = f"{r.budget}: the plan's {r.figure} does not meet {r.limit}"
        return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


#: what Markdown (GitHub's included) reads as markup
_MARKDOWN = re.compile(r"([\\`*_\[\]<>!|~])")


def markdown_text(text: str) -> str:
    """`text` shown as itself in Markdown: every markup character escaped, line breaks as
    spaces (a name cannot add a link, an image, a heading or a table row to a comment)."""
    return _MARKDOWN.sub(r"\\\1", " ".join(text.splitlines()))


def figures(summary: dict[str, Any]) -> dict[str, Any]:
    """The costed figures of a plan summary, flat or pipelined: step, MFU, peak and capacity
    memory, fits. A CheckError for a plan built without a cluster."""
    cost = summary.get("pipeline") if summary.get("pipeline") else summary.get("cost")
    if not isinstance(cost, dict) or "step_time_s" not in cost:
        raise CheckError("the plan has no predicted cost: build it on a cluster (--cluster)")
    return cost


#: Bytes a verification may need before a check refuses to run it (`verification_bytes`).
MAX_VERIFICATION_BYTES = 4 << 30


def verification_bytes(params: int, ranks: int, dtype_bytes: int = 8) -> int:
    """About what verifying a plan holds: the reference run and each of the `ranks` simulated
    ranks keep parameters, gradients and two optimizer moments (4 tensors per parameter,
    `dtype_bytes` each); replicated parameters are held by every rank, so this bounds it."""
    return (ranks + 1) * params * 4 * dtype_bytes


def check_verifiable(
    params: int,
    ranks: int,
    limit: int = MAX_VERIFICATION_BYTES,
    dtype: str = "float64",
    field: str = "verify",
) -> None:
    """A CheckError naming `field` when verifying in `dtype` would need more than `limit`
    bytes."""
    need = verification_bytes(params, ranks, 4 if dtype == "float32" else 8)
    if need > limit:
        raise CheckError(
            f"{field}: a verification of {params:,} parameters on {ranks} ranks would hold "
            f"about {gib(need)} in {dtype} (limit {gib(limit)}); verify a smaller shape of "
            "the model (fewer layers, a smaller hidden size) under the same strategy instead",
            field=field,
            bytes=need,
            limit=limit,
        )


def judge(
    summary: dict[str, Any],
    budgets: Budgets,
    baseline: dict[str, Any] | None = None,
    verification: dict[str, Any] | None = None,
    baseline_gone: str | None = None,
) -> Verdict:
    """The verdict on a plan (its `summary`) against `budgets`; `baseline` is the summary of
    the plan `max_regression_pct` compares with, `verification` the report `verify` reads
    (`ok`, `compute_dtype`, `failed`, `checks`, `first_divergence`). `baseline_gone` says
    why a baseline the check had is no more (its plan was deleted): `max_regression_pct`
    then fails saying so, rather than the verdict being refused."""
    cost = figures(summary)
    verdict = Verdict(f"{summary.get('model', '?')}: {summary.get('strategy', '?')}")
    add = verdict.results.append
    step = float(cost["step_time_s"])
    if budgets.must_fit:
        peak, capacity = cost.get("peak_memory_bytes"), cost.get("memory_capacity_bytes")
        add(Result("must_fit", f"peak memory per rank <= {gib(capacity)}",
                   f"{gib(peak)}", bool(cost.get("fits"))))  # fmt: skip
    if budgets.max_step_time_s is not None:
        add(Result("max_step_time_s", f"<= {_ms(budgets.max_step_time_s)}", _ms(step),
                   step <= budgets.max_step_time_s))  # fmt: skip
    if budgets.max_regression_pct is not None:
        add(_regression(step, budgets.max_regression_pct, baseline, baseline_gone))
    if budgets.max_fallback_ops is not None:
        n = len(summary.get("fallback_ops", []))
        add(Result("max_fallback_ops", f"<= {budgets.max_fallback_ops}", str(n),
                   n <= budgets.max_fallback_ops))  # fmt: skip
    if budgets.min_mfu is not None:
        mfu = float(cost.get("mfu") or 0.0)
        add(Result("min_mfu", f">= {budgets.min_mfu:.1%}", f"{mfu:.1%}", mfu >= budgets.min_mfu))
    if budgets.verify:
        add(_verified(verification))
    return verdict


def _regression(
    step: float, most_pct: float, baseline: dict[str, Any] | None, gone: str | None
) -> Result:
    """`max_regression_pct`: the step against the baseline's; failed, saying why, when the
    baseline is `gone`."""
    if baseline is None:
        if gone is None:
            raise CheckError("max_regression_pct needs a baseline plan", field="baseline")
        return Result("max_regression_pct", f"<= {most_pct:+.1f}% against the baseline", gone,
                      False)  # fmt: skip
    before = float(figures(baseline)["step_time_s"])
    change = (step / before - 1.0) * 100.0
    return Result("max_regression_pct", f"<= {most_pct:+.1f}% against {_ms(before)}",
                  f"{change:+.1f}% ({_ms(step)})", change <= most_pct)  # fmt: skip


def _verified(report: dict[str, Any] | None) -> Result:
    if report is None:
        raise CheckError("verify needs a verification report", field="verify")
    checks = report.get("checks")
    total = len(checks) if isinstance(checks, list) else int(checks or 0)
    dtype = report.get("compute_dtype", "float64")
    limit = f"every tensor matches one device ({dtype})"
    if report.get("ok"):
        return Result("verify", limit, f"{total} tensors match", True)
    where = report.get("first_divergence") or "?"
    return Result("verify", limit, f"{report.get('failed', '?')} of {total} tensors differ; "
                  f"first at {where}", False)  # fmt: skip


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def gib(nbytes: float | None) -> str:
    """Bytes in GiB with two decimals, as messages and reports print them."""
    return f"{(nbytes or 0) / (1 << 30):.2f} GiB"
