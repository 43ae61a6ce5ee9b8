"""Predicted against measured steps on real ranks, with a profile calibrated on this machine.

What it is for: the cost model's end-to-end check on hardware we have. `shardlab calibrate`
(`runtime.calibrate`, full sizes and repeats: a quick profile moved whole halves of the
table by 20% from run to run) measures this machine's torch-backend ranks once per rank
count (2 and 4: ranks share the cores, so a rank of a 4-rank run is a slower device than one of a
2-rank run); then tiny GPT-2 and Llama plans - dp, megatron_tp, megatron_tp +
sequence_parallel, fsdp, zero2 and a 1F1B pipeline (pp=2; pp=2 x dp=2 on 4 ranks) - are
built against that profile and their step measured (`runtime.measure`: gloo ranks, torch
ops, median of the kept steps of the slowest rank; every case in `ROUNDS` rounds, its
median round kept: this machine is shared, and a slow burst should cost one round).
Error % = (predicted - measured) / measured. The goal (issue 20): median |error| within 10%,
none beyond 25%. Nothing is fitted per plan; the profile is the only input from the machine.

BLAS threads are pinned to one per rank (`OPENBLAS_NUM_THREADS=1` unless set, by `run` before
its first rank starts; calibration and measurement alike): several ranks each with one BLAS
thread per core oversubscribe the cores and make matmul times swing by orders of magnitude.

`python -m bench.bench_measured` runs this benchmark alone and prints its section.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import Section
from shardlab.models import build_model
from shardlab.plan import Plan, build_plan
from shardlab.runtime.calibrate import THREAD_VARS, calibrate, write
from shardlab.runtime.measure import Measurement, compare, measure
from shardlab.strategy import Strategy

TITLE = "Measured: predicted vs measured step on local gloo ranks (calibrated profile)"
HEADER = ["plan", "ranks", "predicted step", "measured step", "error", "worst op kind"]
RANKS = (2, 4)
MICROBATCHES = 4
STEPS, WARMUP = 5, 1
#: rounds over every case, each case's median round kept (`measure_rounds`)
ROUNDS = 3
GPT2 = {"layers": 2, "hidden": 256, "heads": 4, "ffn": 1024, "vocab": 512, "seq": 64,
        "batch": 8, "dtype": "float32"}  # fmt: skip
LLAMA = {"layers": 2, "hidden": 256, "heads": 4, "kv_heads": 2, "ffn": 768, "vocab": 512,
         "seq": 64, "batch": 8, "dtype": "float32"}  # fmt: skip


@dataclass(frozen=True)
class Case:
    """One plan: a label, its model, templates and its mesh on each rank count (`RANKS`);
    a mesh with a pp axis runs 1F1B over `MICROBATCHES` micro-batches."""

    label: str
    model: str
    templates: tuple[str, ...]
    meshes: tuple[str, str]

    def strategy(self, n: int) -> Strategy:
        mesh = self.meshes[RANKS.index(n)]
        pipeline = {"schedule": "1f1b", "microbatches": MICROBATCHES}
        options = {"pipeline": pipeline} if "pp=" in mesh else {}
        # a mesh of only pp has no axis for templates
        templates = list(self.templates) if "," in mesh or "pp=" not in mesh else []
        return Strategy.build(mesh, templates, [], options)

    def overrides(self) -> dict[str, object]:
        return GPT2 if self.model == "gpt2" else LLAMA


DP, TP = ("dp=2", "dp=4"), ("tp=2", "tp=4")
CASES = [
    Case("gpt2 dp", "gpt2", ("dp",), DP),
    Case("llama dp", "llama3-8b", ("dp",), DP),
    Case("gpt2 tp", "gpt2", ("megatron_tp",), TP),
    Case("llama tp", "llama3-8b", ("megatron_tp",), TP),
    Case("llama tp+sp", "llama3-8b", ("megatron_tp", "sequence_parallel"), TP),
    Case("gpt2 fsdp", "gpt2", ("fsdp",), DP),
    Case("llama fsdp", "llama3-8b", ("fsdp",), DP),
    Case("llama zero2", "llama3-8b", ("dp", "zero2"), DP),
    Case("llama pp 1F1B (+dp)", "llama3-8b", ("dp",), ("pp=2", "pp=2,dp=2")),
]


@dataclass(frozen=True)
class Result:
    case: Case
    ranks: int
    predicted_s: float
    measured_s: float
    worst_kind: str

    @property
    def error(self) -> float:
        return self.predicted_s / self.measured_s - 1


def build_case(case: Case, n: int, cluster: Path) -> Plan:
    """The case's plan on `n` ranks, built against the calibrated profile."""
    graph = build_model(case.model, case.overrides())
    return build_plan(graph, case.strategy(n), cluster=str(cluster))


def measure_rounds(plans: list[Plan]) -> list[Measurement]:
    """Every plan measured in `ROUNDS` rounds over all of them; per plan, the round whose
    step (slowest rank's median) is the median (a shared machine's slow seconds cost one
    round, not the comparison)."""
    tried: list[list[Measurement]] = [[] for _ in plans]
    for _ in range(ROUNDS):
        for plan, got in zip(plans, tried, strict=True):
            got.append(measure(plan, steps=STEPS, warmup=WARMUP, dtype="float32"))
    return [sorted(got, key=lambda m: m.step_max)[(ROUNDS - 1) // 2] for got in tried]


def result_of(case: Case, n: int, plan: Plan, got: Measurement) -> Result:
    """The case's predicted against measured step, and its worst op kind."""
    rows = compare(plan, got)
    step = next(r for r in rows if r.group == "step")
    kinds = [r for r in rows if r.group == "kind" and r.measured_s > 0.02 * step.measured_s]
    worst = max(kinds, key=lambda r: abs(r.predicted_s - r.measured_s), default=None)
    note = ""
    if worst is not None:
        note = (f"{worst.name}: {worst.predicted_s * 1e3:.1f} vs {worst.measured_s * 1e3:.1f} "
                "ms")  # fmt: skip
    return Result(case, n, step.predicted_s, step.measured_s, note)


def run() -> Section:
    """Calibrate per rank count, then measure and predict every case."""
    for var in THREAD_VARS:  # before the first rank starts (the forkserver keeps its env)
        os.environ.setdefault(var, "1")
    started = time.perf_counter()
    results: list[Result] = []
    profiles: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-measured-") as tmp:
        for n in RANKS:
            cal = calibrate(n, "float32", quick=False, name=f"bench-local-{n}")
            path, _ = write(cal, Path(tmp) / f"local-{n}.json")
            c = cal.cluster
            profiles.append(
                f"{n} ranks: {c.peak_flops['float32'] * c.matmul_efficiency / 1e9:.1f} GFLOP/s "
                f"matmul, {c.hbm_bandwidth * c.memory_efficiency / 1e9:.1f} GB/s memory, "
                f"{c.launch_overhead * 1e6:.1f} us per op, link {c.intra_node.bandwidth / 1e9:.2f} "
                f"GB/s + {c.intra_node.latency * 1e6:.0f} us per step, overlap slowdown "
                f"{c.overlap_slowdown:.2f}, in-step collectives "
                + ", ".join(f"{k} x{v:.2f}" for k, v in c.comm_scale.items())
                + f", op overhead {c.op_overhead * 1e6:.1f} us, straggle {c.straggle:.0%}"
            )
            plans = [build_case(case, n, path) for case in CASES]
            for case, plan, got in zip(CASES, plans, measure_rounds(plans), strict=True):
                results.append(result_of(case, n, plan, got))
    section = Section(TITLE, HEADER)
    for r in results:
        section.rows.append([r.case.label, str(r.ranks), f"{r.predicted_s * 1e3:.1f} ms",
                             f"{r.measured_s * 1e3:.1f} ms", f"{r.error:+.1%}",
                             r.worst_kind])  # fmt: skip
    errors = [abs(r.error) for r in results]
    worst = max(results, key=lambda r: abs(r.error))
    section.notes += [
        f"**Median |error| {statistics.median(errors):.1%}, max {max(errors):.1%} "
        f"({worst.case.label}, {worst.ranks} ranks); {sum(e > 0.25 for e in errors)} of "
        f"{len(errors)} beyond 25%.** Goal: median within 10%, none beyond 25%.",
        "",
        "Profiles (`shardlab calibrate --nproc N`, one per rank count; in-step "
        "collectives: `comm_scale`, each kind's time inside one-layer reference steps over "
        "its isolated ring time (send: a pipeline's hops, issue to the waiting receiver's "
        "completion); op overhead: `op_overhead`, the reference steps' measured "
        "time beyond the model's per op; straggle: `straggle`, the slowest rank's compute "
        "of a reference step beyond the sum of its ops' times; overlap slowdown: a "
        "collective and compute at once against each alone, 20 = they take turns): "
        + "; ".join(profiles)
        + ".",
        "",
        f"Models: `gpt2` with {GPT2} and `llama3-8b` with {LLAMA}; optimizer AdamW; "
        f"{STEPS} steps measured after {WARMUP} warm-up, median step of the slowest rank, "
        f"in {ROUNDS} rounds over all cases, each case's median round kept. "
        "Worst op kind: the kind (of those above 2% of the step) whose summed predicted "
        "time is furthest from its measured time (async collectives' measured spans include "
        f"waiting behind compute). Pipelines: 1F1B, {MICROBATCHES} micro-batches.",
        "",
        f"Calibrating and measuring took {time.perf_counter() - started:.0f} s on "
        f"{os.cpu_count()} cores{_oversubscribed()}.",
    ]
    return section


def _oversubscribed() -> str:
    """A note when the largest rank count is more than the cores."""
    cores = os.cpu_count() or 1
    if max(RANKS) <= cores:
        return ""
    return (f": {max(RANKS)} ranks oversubscribe them, so ranks wait on descheduled peers at "
            "every collective (the cost model takes each rank for its own device)")  # fmt: skip


def main() -> None:
    print(run().markdown())


if __name__ == "__main__":
    main()
