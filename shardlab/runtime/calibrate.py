"""`shardlab calibrate`: measure this machine's torch-backend ranks and write a Cluster file.

What it is for: the `cpu-local` preset holds rough guesses; a calibrated profile holds what
`nproc` gloo ranks running torch ops on this machine actually reach, so `shardlab plan
--cluster my.json` and `shardlab measure --cluster my.json` predict from measurements.

`calibrate` measures (`runtime.calibrate_measure`: matmuls and elementwise adds against size,
the four collectives against message and group size, compute under a collective), fits
(`runtime.calibrate_fit`), then runs one-layer reference plans (`REFERENCE_STEPS` on the
`REFERENCE` models) on the torch backend, in `REFERENCE_ROUNDS` rounds whose median each
reference keeps (a shared machine's slow seconds cost a round, not the fit), and fits what
only a training step shows:

- the data-parallel GPT-2 and Llama layers' (next to) no-work ops give `launch_overhead`
  (the backend's per-op time) and every other compute kind's `kernel_scale` and
  `kernel_overhead` its measured time against its roofline, op by op (`kernel_samples`,
  `calibrate_fit.kernel_fits`);
- every reference's collectives (all_reduce in dp and tp, all_gather and reduce_scatter in
  tp + sequence parallel, ZeRO-2 and FSDP), timed inside the step from issue to wait, give
  `comm_scale` per kind against the isolated link (`step_collectives`), and the 1F1B
  reference's hops between stages give `comm_scale["send"]` (`hop_samples`);
- the flat references' slowest rank's compute in a step against the sum of their ops'
  times gives `straggle` (`straggle_of`: ranks sharing cores lose whole time slices);
- every flat reference's measured step against the model's prediction on that cluster
  gives `op_overhead`, the seconds each op costs the rank beside its kernel
  (`step_samples`).

Compute ops count at their longest over the ranks (`Measurement.slowest_op_seconds`: the
step waits for the last rank), collectives at their median (`typical_op_seconds`: the
first rank to reach one waits inside it for the last).
`write` saves the Cluster JSON and, beside it, `<stem>.measurements.json` with every raw
sample and its fit residual (a Cluster file holds only the fields `Cluster` knows).
`report_lines` is the table the command prints.

BLAS threads: numpy's BLAS starts one thread per core in every rank, so nproc ranks on a
machine with fewer than nproc x threads cores oversubscribe it and matmul times swing by
orders of magnitude. Calibrate and measure with the same `OPENBLAS_NUM_THREADS` /
`OMP_NUM_THREADS` (1 when ranks fill the cores); the profile's description records them.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardlab.cost.clusters import Cluster
from shardlab.cost.comm import comm_op_group, factor
from shardlab.cost.compute import program_op_times
from shardlab.cost.pipeline_cost import cost_pipeline, sent_bytes
from shardlab.errors import ExecutionError
from shardlab.runtime import hazards as hz
from shardlab.runtime.calibrate_fit import (
    Fit,
    Residual,
    bus_bandwidth,
    cluster_of,
    fit_all,
    fit_comm_scales,
    median_abs_error,
)
from shardlab.runtime.calibrate_measure import (
    CommSample,
    KernelSample,
    Measurements,
    Sizes,
    StepSample,
    measure_all,
)

if TYPE_CHECKING:
    from shardlab.plan import Plan
    from shardlab.program import DistProgram
    from shardlab.runtime.measure import Measurement
    from shardlab.strategy import Strategy

DTYPES = ("float32", "float64")
#: The reference models: one GPT-2 and one Llama layer (`REFERENCE_STEPS` runs them; data
#: parallel, every compute kind of a training step is timed on a full-size block).
REFERENCE = (
    ("gpt2", {"layers": 1, "hidden": 128, "heads": 4, "ffn": 512, "vocab": 256, "seq": 64,
              "batch": 4}),
    ("llama3-8b", {"layers": 1, "hidden": 128, "heads": 4, "kv_heads": 2, "ffn": 384,
                   "vocab": 256, "seq": 64, "batch": 4}),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class RefStep:
    """One reference step: its label, its model (`REFERENCE` index), the mesh axis all ranks
    sit on, its templates, and whether its kernels give `kernel_scale`. A `pipelined`
    reference puts the ranks on `pp=2` (times `axis` over the rest), its model one layer per
    stage and a batch as many times larger as `axis` has ranks, and runs 1F1B over
    `PIPELINE_MICROBATCHES`: its sends give `comm_scale["send"]`."""

    label: str
    model: int
    axis: str
    templates: tuple[str, ...]
    kernels: bool = False
    pipelined: bool = False

    def strategy(self, nproc: int) -> Strategy:
        """The reference's strategy on `nproc` ranks."""
        from shardlab.strategy import Strategy

        if not self.pipelined:
            return Strategy.build(f"{self.axis}={nproc}", list(self.templates), [], {})
        rest = nproc // PIPELINE_STAGES
        mesh = f"pp={PIPELINE_STAGES}" + (f",{self.axis}={rest}" if rest > 1 else "")
        pipeline = {"schedule": "1f1b", "microbatches": PIPELINE_MICROBATCHES}
        templates = list(self.templates) if rest > 1 else []
        return Strategy.build(mesh, templates, [], {"pipeline": pipeline})

    def runs_on(self, nproc: int) -> bool:
        """A pipelined reference needs a rank count its stages divide."""
        return not self.pipelined or nproc % PIPELINE_STAGES == 0


#: The reference steps: every collective kind the templates issue, and the sends between
#: pipeline stages, inside a training step.
REFERENCE_STEPS = (
    RefStep("gpt2 dp", 0, "dp", ("dp",), kernels=True),
    RefStep("llama dp", 1, "dp", ("dp",), kernels=True),
    RefStep("gpt2 tp", 0, "tp", ("megatron_tp",)),
    RefStep("llama tp+sp", 1, "tp", ("megatron_tp", "sequence_parallel")),
    RefStep("llama zero2", 1, "dp", ("dp", "zero2")),
    RefStep("llama fsdp", 1, "dp", ("fsdp",)),
    RefStep("llama pp 1F1B", 1, "dp", ("dp",), pipelined=True),
)
#: the pipelined reference's stages and micro-batches
PIPELINE_STAGES, PIPELINE_MICROBATCHES = 2, 4
#: steps timed per reference and round (after one warm-up), quick and full
REFERENCE_STEPS_TIMED = (6, 10)
#: rounds over every reference step, each reference's median round kept: a shared machine
#: slows everything for seconds at a time, and a burst should cost one round, not the fit
REFERENCE_ROUNDS = 3
#: op_overhead (s) at which the model's step is first differenced (then at the fitted one)
PROBE_OVERHEAD_S = 1e-4
#: roofline seconds under which an op counts as doing no work (its time is the backend's)
FLOOR_WORK_S = 1e-6
THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


@dataclass(frozen=True, slots=True)
class Calibration:
    """A measured and fitted profile."""

    cluster: Cluster
    measurements: Measurements
    fit: Fit


def calibrate(
    nproc: int = 2, dtype: str = "float32", quick: bool = False, name: str = "calibrated"
) -> Calibration:
    """Measure `nproc` ranks in `dtype` (fewer sizes and repeats when `quick`) and fit."""
    if dtype not in DTYPES:
        raise ExecutionError(f"calibrate measures {' or '.join(DTYPES)}, not {dtype!r}")
    if nproc < 2:
        raise ExecutionError(f"calibrate needs --nproc 2 or more (collectives), got {nproc}")
    m = measure_all(nproc, dtype, Sizes.preset(quick))
    fit = fit_all(m)
    base = cluster_of(fit, m, name, describe(m, quick), _memory_per_rank(nproc))
    runs = run_references(base, nproc, dtype, REFERENCE_STEPS_TIMED[0 if quick else 1])
    m.kernels, m.op_floor_s = kernel_samples([r for r in runs if r.ref.kernels], base)
    m.step_comm = step_collectives(runs)
    flat = [r for r in runs if not r.ref.pipelined]  # the model's flat step fits op_overhead
    m.straggle = straggle_of(flat)
    bare = cluster_of(fit, m, name, base.description, base.hbm_bytes)  # op_overhead 0
    m.steps = step_samples(flat, bare, PROBE_OVERHEAD_S)
    cluster = cluster_of(fit, m, name, base.description, base.hbm_bytes)
    if cluster.op_overhead > 0:  # the step is not linear in it: difference at the fitted value
        m.steps = step_samples(flat, bare, cluster.op_overhead)
        cluster = cluster_of(fit, m, name, base.description, base.hbm_bytes)
    _, in_step = fit_comm_scales(fit.link or cluster.intra_node, m.step_comm)
    steps = [Residual(f"step: {r.ref.label}", r.measured_s, _predicted(r, cluster)) for r in runs]
    fit = dataclasses.replace(fit, residuals=(*fit.residuals, *in_step, *steps))
    return Calibration(cluster, m, fit)


@dataclass(frozen=True, slots=True)
class RefRun:
    """One reference step: its plan (built on the cluster fitted before any step ran) and
    its measurement."""

    ref: RefStep
    plan: Plan
    got: Measurement

    @property
    def slowest(self) -> int:
        return max(self.got.ranks, key=self.got.step_time)

    @property
    def measured_s(self) -> float:
        """The slowest rank's median step."""
        return self.got.step_time(self.slowest)


def run_references(
    cluster: Cluster, nproc: int, dtype: str, steps: int, rounds: int = REFERENCE_ROUNDS
) -> list[RefRun]:
    """Build every `REFERENCE_STEPS` plan on `nproc` ranks against `cluster` and time it on
    the torch backend (`steps` kept after one warm-up), in `rounds` rounds over all of
    them; each reference keeps its round of median step time (`median_run`)."""
    from shardlab.models import build_model
    from shardlab.plan import build_plan
    from shardlab.runtime.measure import measure

    refs = [ref for ref in REFERENCE_STEPS if ref.runs_on(nproc)]
    plans = []
    for ref in refs:
        model, overrides = REFERENCE[ref.model]
        if ref.pipelined:  # one layer per stage, a micro-batch row per data-parallel rank
            rest = nproc // PIPELINE_STAGES
            overrides = {**overrides, "layers": PIPELINE_STAGES,
                         "batch": int(overrides["batch"]) * rest}  # fmt: skip
        graph = build_model(model, {**overrides, "dtype": dtype})
        plans.append(build_plan(graph, ref.strategy(nproc), cluster=cluster))
    tried: list[list[RefRun]] = [[] for _ in plans]
    for _ in range(rounds):
        for ref, plan, runs in zip(refs, plans, tried, strict=True):
            runs.append(RefRun(ref, plan, measure(plan, steps=steps, warmup=1, dtype=dtype)))
    return [median_run(runs) for runs in tried]


def median_run(runs: list[RefRun]) -> RefRun:
    """The run whose (slowest rank's median) step is the median of `runs` (the lower of the
    two middle ones for an even count)."""
    ordered = sorted(runs, key=lambda r: r.measured_s)
    return ordered[(len(ordered) - 1) // 2]


def kernel_samples(runs: list[RefRun], cluster: Cluster) -> tuple[list[KernelSample], float | None]:
    """Every compute kind of `runs` as the torch backend ran it, each op its longest time
    over the ranks (`Measurement.slowest_op_seconds`), and the backend's per-op floor.

    The floor is the median measured seconds of the ops that do (next to) no work: views
    and ops whose roofline is under `FLOOR_WORK_S` - the backend's own per-op time. Each
    kind's sample holds its ops' roofline seconds on `cluster` (launch overhead left out)
    and their measured seconds less one floor per op, summed and op by op."""
    from shardlab.runtime.measure import is_comm

    launch = cluster.launch_overhead
    timed: list[tuple[str, float, float]] = []  # (kind, roofline less launch, measured)
    for run in runs:
        seen = run.got.slowest_op_seconds()
        roof = program_op_times(run.plan.program, cluster)
        for op in run.plan.program.ops:
            if op.kind in hz.SYNC_KINDS or is_comm(op) or op.name not in seen:
                continue
            work = max(0.0, roof.get(op.name, 0.0) - launch)
            timed.append((op.kind, work, seen[op.name]))
    idle = [t for _, work, t in timed if work < FLOOR_WORK_S]
    floor = statistics.median(idle) if idle else None
    points: dict[str, list[tuple[float, float]]] = {}
    for kind, work, t in timed:
        if work > 0:
            beyond = max(0.0, t - (floor if floor is not None else launch))
            points.setdefault(kind, []).append((work, beyond))
    samples = [
        KernelSample(k, len(p), sum(w for w, _ in p), sum(m for _, m in p), tuple(p))
        for k, p in sorted(points.items())
    ]
    return samples, floor


def straggle_of(runs: list[RefRun]) -> float:
    """How much longer the slowest rank's compute of a step is than the sum of its compute
    ops' own times (each its longest over the ranks, `Measurement.slowest_op_seconds`),
    summed over `runs`, less one (never below 0): ranks that share cores are descheduled
    for whole time slices, now this rank, now that one, and the step waits for the rank
    that lost the most. A step's compute on a rank is the sum of its compute ops' spans
    (`RankTiming.compute_ns`); per reference, the median over its steps of the slowest
    rank's."""
    from shardlab.runtime.measure import is_comm

    own = slowest = 0.0
    for run in runs:
        compute = [op.name for op in run.plan.program.ops
                   if not is_comm(op) and op.kind not in hz.SYNC_KINDS]  # fmt: skip
        per_step = [max(step) for step in
                    zip(*(t.compute_ns for t in run.got.ranks.values()), strict=False)]  # fmt: skip
        if not per_step:
            continue
        times = run.got.slowest_op_seconds()
        own += sum(times.get(name, 0.0) for name in compute)
        slowest += statistics.median(per_step) * 1e-9
    return max(0.0, slowest / own - 1.0) if own > 0 else 0.0


def step_collectives(runs: list[RefRun]) -> list[CommSample]:
    """The collectives of every reference step as a typical rank ran them (each one's median
    over the ranks), from issue to the wait of the op that reads it (the compute it was
    issued ahead of runs inside that span, as it does in the model's timeline): the samples
    `calibrate_fit.fit_comm_scales` fits `comm_scale` to."""
    samples: list[CommSample] = []
    for run in runs:
        seen = run.got.typical_op_seconds()
        for program in _programs(run):
            for op in program.ops:
                if op.comm is None or op.name not in seen:
                    continue
                n = len(comm_op_group(program.mesh, program.mesh.ranks[0], op.comm.axis))
                f = factor(op.comm.kind, n) if n > 1 else 0.0
                if f > 0:
                    size = int(op.comm.bytes_per_rank / f)
                    samples.append(CommSample(op.comm.kind, n, size, seen[op.name]))
        samples += hop_samples(run)
    return samples


def _programs(run: RefRun) -> list[DistProgram]:
    """The programs a reference's ranks ran: the plan's, or each pipeline stage's once."""
    if run.got.pipeline is None:
        return [run.plan.program]
    return list(run.got.pipeline.stages)


def hop_samples(run: RefRun) -> list[CommSample]:
    """A pipelined reference's hops between stages as `send` samples: from the sender's
    issue to the end of the matching recv (same tag, same position in the peer stage's
    ranks), where the receiver was already waiting, on the clock the ranks of this host
    share (`RankTiming.t0_ns`, the same step on every rank). Inside a step a waiting
    receiver is woken only when a core comes free, which the isolated link never shows."""
    if run.got.pipeline is None:
        return []
    stages = run.got.pipeline.stages
    out = []
    for program in stages:
        for op in program.ops:
            if op.kind != "send":
                continue
            peer = stages[int(op.attrs["peer_stage"])]
            recv = next(
                o for o in peer.ops if o.kind == "recv" and o.attrs["tag"] == op.attrs["tag"]
            )
            size = int(sent_bytes(program, op.inputs[0]))
            for sender, receiver in zip(program.mesh.ranks, peer.mesh.ranks, strict=True):
                issued = _clock(run.got, sender, op.name, 0)
                posted, done = (
                    _clock(run.got, receiver, recv.name, 0),
                    _clock(run.got, receiver, recv.name, 1),
                )
                if posted <= issued < done:
                    out.append(CommSample("send", 2, size, (done - issued) * 1e-9))
    return out


def _clock(got: Measurement, rank: int, op: str, end: int) -> int:
    """When op `op` started (`end` 0) or ended (1) on `rank`, on the host's clock (ns)."""
    timing = got.ranks[rank]
    return timing.t0_ns + timing.spans[op][end]


def step_samples(runs: list[RefRun], cluster: Cluster, probe_s: float) -> list[StepSample]:
    """Every reference step measured against the model on `cluster` without op overhead,
    and the growth of the predicted step per second of `op_overhead` (differenced at
    `probe_s`)."""
    out = []
    for run in runs:
        bare = _predicted(run, dataclasses.replace(cluster, op_overhead=0.0))
        probed = _predicted(run, dataclasses.replace(cluster, op_overhead=probe_s))
        ops = sum(1 for op in run.plan.program.ops if op.kind not in hz.SYNC_KINDS)
        out.append(StepSample(run.ref.label, ops, run.measured_s, bare,
                              (probed - bare) / probe_s))  # fmt: skip
    return out


def _predicted(run: RefRun, cluster: Cluster) -> float:
    """The model's step of a reference's program on `cluster` (a pipelined one's: the
    op-level model of the stage programs its ranks ran)."""
    from shardlab.cost.model import cost_program

    if run.got.pipeline is not None:
        return cost_pipeline(run.got.pipeline, run.plan.training, cluster).step_time
    return cost_program(run.plan.program, run.plan.training, cluster).step_time


def describe(m: Measurements, quick: bool) -> str:
    """What was measured, where and when (the profile's description)."""
    threads = ", ".join(f"{v}={os.environ[v]}" for v in THREAD_VARS if v in os.environ)
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f"Calibrated on {platform.node() or 'this machine'} ({os.cpu_count()} cores) at "
        f"{when}{' (quick)' if quick else ''}: {m.nproc} torch-backend ranks (gloo, torch "
        f"ops) in {m.dtype}, measured at once. peak_flops x matmul_efficiency: square "
        "matmuls against size; hbm_bandwidth x memory_efficiency: "
        "elementwise adds against length; intra_node (= inter_node, one node): all_reduce, "
        "all_gather, reduce_scatter and all_to_all against message size and group size "
        "(alpha-beta fit); overlap_slowdown: a matmul under an all_reduce; launch_overhead "
        "(the backend's per-op time), kernel_scale and kernel_overhead (per op kind, "
        "measured = overhead + scale x roofline, fitted op by op): one-layer GPT-2 and "
        "Llama reference plans run data parallel on the torch "
        "backend; comm_scale (per collective kind, in-step / isolated time): the "
        "collectives of one-layer dp, tp, tp + sequence parallel, ZeRO-2 and FSDP reference "
        "steps, and send: a 1F1B reference's hops; straggle: the slowest rank's compute of "
        "those steps over the sum of their ops' times; op_overhead (seconds per op beside "
        "its kernel): those steps' measured time against the model's. "
        f"BLAS threads: {threads or 'library default'}. Raw samples: the "
        ".measurements.json beside it."
    )


def _memory_per_rank(nproc: int) -> float:
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = 8 * 2**30
    return float(total // nproc)


def side_file(path: Path) -> Path:
    """Where the raw measurements of the profile at `path` go."""
    return path.with_name(path.name.removesuffix(".json") + ".measurements.json")


def write(cal: Calibration, path: str | Path) -> tuple[Path, Path]:
    """Write the Cluster JSON at `path` and the raw samples beside it; both paths."""
    out = Path(path)
    out.write_text(json.dumps(cal.cluster.to_json(), indent=2) + "\n", encoding="utf-8")
    raw = side_file(out)
    raw.write_text(json.dumps(measurements_json(cal), indent=2) + "\n", encoding="utf-8")
    return out, raw


def measurements_json(cal: Calibration) -> dict[str, Any]:
    """Raw samples, bus bandwidths and every fit residual."""
    body = cal.measurements.to_json()
    for s, js in zip(cal.measurements.comm, body["comm"], strict=True):
        js["bus_bandwidth"] = bus_bandwidth(s) if s.seconds > 0 else None
    body["residuals"] = [
        {"sample": r.label, "measured_s": r.measured_s, "predicted_s": r.predicted_s,
         "error_pct": r.error_pct}
        for r in cal.fit.residuals
    ]  # fmt: skip
    body["cluster"] = cal.cluster.name
    return body


def report_lines(cal: Calibration) -> list[str]:
    """The measurements, their fits and residuals, then the fitted figures."""
    m, c = cal.measurements, cal.cluster
    fitted = {r.label: r for r in cal.fit.residuals}
    lines = [f"{'sample':<34} {'measured':>12} {'rate':>16} {'fit':>12} {'resid %':>8}"]
    for s in m.compute:
        label = (f"matmul {s.dtype} {s.size}^3" if s.kind == "matmul"
                 else f"add {s.dtype} {s.size}")  # fmt: skip
        rate = (f"{s.flops / s.seconds / 1e9:.1f} GFLOP/s" if s.kind == "matmul"
                else f"{s.bytes / s.seconds / 1e9:.2f} GB/s")  # fmt: skip
        lines.append(_row(label, s.seconds, rate, fitted.get(label)))
    for k in m.comm:
        if k.seconds <= 0:
            continue
        label = f"{k.kind} n={k.ranks} {k.size} B"
        lines.append(_row(label, k.seconds, f"{bus_bandwidth(k) / 1e9:.2f} GB/s bus",
                          fitted.get(label)))  # fmt: skip
    for k in m.step_comm:
        label = f"in step: {k.kind} n={k.ranks} {k.size} B"
        lines.append(_row(label, k.seconds, f"{bus_bandwidth(k) / 1e9:.2f} GB/s bus",
                          fitted.get(label)))  # fmt: skip
    for st in m.steps:
        label = f"step: {st.label}"
        lines.append(_row(label, st.measured_s, f"{st.ops} ops", fitted.get(label)))
    flops = ", ".join(f"{d} {v / 1e9:.1f}" for d, v in c.peak_flops.items())
    for ks in m.kernels:
        scale, fixed = c.kernel_scale.get(ks.kind), c.kernel_overhead.get(ks.kind)
        plus = f" + {fixed * 1e6:.1f} us per op" if fixed else ""
        head = f"kernel {ks.kind:<27}"
        lines.append(f"{head} {ks.measured_s * 1e6:>9.1f} us {ks.ops:>5} ops x{scale:.2f}{plus}"
                     if scale else f"{head} (too small)")  # fmt: skip
    lines += [
        "",
        f"peak_flops (GFLOP/s): {flops}; matmul_efficiency {c.matmul_efficiency:.3f}",
        f"hbm_bandwidth {c.hbm_bandwidth / 1e9:.2f} GB/s, memory_efficiency "
        f"{c.memory_efficiency:.3f}, launch_overhead {c.launch_overhead * 1e6:.2f} us",
        f"intra_node: bandwidth {c.intra_node.bandwidth / 1e9:.3f} GB/s (bus), latency "
        f"{c.intra_node.latency * 1e6:.1f} us per ring step; overlap_slowdown "
        f"{c.overlap_slowdown:.2f}",
        "in-step comm_scale: "
        + (", ".join(f"{k} x{v:.2f}" for k, v in c.comm_scale.items()) or "none")
        + f"; op_overhead {c.op_overhead * 1e6:.1f} us per op; straggle {c.straggle:.1%}",
        f"fit residuals: median |error| {median_abs_error(cal.fit.residuals):.1f}% over "
        f"{len(cal.fit.residuals)} samples",
    ]
    cores = os.cpu_count() or 1
    if m.nproc > cores:
        note = f"note: {m.nproc} ranks share {cores} cores: each rank is a slice of a core"
        lines.append(note + ", and a collective competes with the other ranks' compute for it")
    return lines


def _row(label: str, seconds: float, rate: str, r: Residual | None) -> str:
    fit = f"{r.predicted_s * 1e6:>9.1f} us" if r else f"{'':>12}"
    err = f"{r.error_pct:+8.1f}" if r else f"{'':>8}"
    return f"{label:<34} {seconds * 1e6:>9.1f} us {rate:>16} {fit} {err}"
