"""`shardlab calibrate`: measure this machine's torch-backend ranks and write a Cluster file.

What it is for: the `cpu-local` preset holds rough guesses; a calibrated profile holds what
`nproc` gloo ranks running torch ops on this machine actually reach, so `shardlab plan
--cluster my.json` and `shardlab measure --cluster my.json` predict from measurements.

`calibrate` measures (`runtime.calibrate_measure`: matmuls and elementwise adds against size,
the four collectives against message and group size, compute under a collective), fits
(`runtime.calibrate_fit`), then runs one-layer reference plans on the torch backend
(`runtime.calibrate_steps`: `REFERENCE_STEPS` on the `REFERENCE` models, in
`REFERENCE_ROUNDS` rounds whose median each reference keeps: a shared machine's slow
seconds cost a round, not the fit), and fits what only a training step shows:

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardlab.cost.clusters import Cluster
from shardlab.errors import ExecutionError
from shardlab.runtime.calibrate_fit import (
    Fit,
    Residual,
    bus_bandwidth,
    cluster_of,
    fit_all,
    fit_comm_scales,
    median_abs_error,
)
from shardlab.runtime.calibrate_measure import Measurements, Sizes, measure_all
from shardlab.runtime.calibrate_steps import (
    PROBE_OVERHEAD_S,
    REFERENCE_STEPS_TIMED,
    kernel_samples,
    predicted_step,
    run_references,
    step_collectives,
    step_samples,
    straggle_of,
)

DTYPES = ("float32", "float64")
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
    steps = [
        Residual(f"step: {r.ref.label}", r.measured_s, predicted_step(r, cluster)) for r in runs
    ]
    fit = dataclasses.replace(fit, residuals=(*fit.residuals, *in_step, *steps))
    return Calibration(cluster, m, fit)


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
