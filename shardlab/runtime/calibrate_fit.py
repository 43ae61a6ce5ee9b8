"""Calibration fits: the `Cluster` figures that best explain the measured samples.

What it is for: `shardlab calibrate` measures (`runtime.calibrate_measure`) and fits here;
the fits are pure functions of the samples, so they are tested on synthetic measurements.
Each fit is the cost model's own formula, solved for its constants by least squares on
relative error (every sample counts alike, whatever its size):

- matmul (`cost.compute.roofline_time` for a matmul kind): t = c + f / R, where
  R = peak_flops[dtype] x matmul_efficiency and c = launch_overhead + MATMUL_RAMP_SECONDS.
  `peak_flops` is the best rate any sample reached (or R if higher), `matmul_efficiency`
  R / peak;
- elementwise (memory-bound): t = launch + bytes / B with B = hbm_bandwidth x
  memory_efficiency; `hbm_bandwidth` is the best rate reached (or B), `memory_efficiency`
  B / hbm_bandwidth, `launch_overhead` the intercept (unless the backend's per-op floor
  was measured: `Measurements.op_floor_s`);
- collectives (`cost.comm.ring_time`): t = latency x steps(kind, n) + factor(kind, n) x S /
  bandwidth over every kind and group size at once (the alpha-beta fit of one Link);
- kernels: per kind, measured = `kernel_overhead` + `kernel_scale` x roofline seconds, fitted
  through the kind's ops in reference plans run by the torch backend (kernels make
  temporaries and passes the roofline does not count, and small ones cost a fixed time
  whatever their size: a pure factor fitted on one size mispredicts another); kinds whose
  ops span too few sizes keep the ratio of the sums as their scale and no overhead; kinds
  whose ops the roofline gives under `MIN_ROOFLINE_S` in all get neither;
- overlap: `overlap_slowdown` is the timeline's own figure (compute runs 1 + s times slower
  while a collective is in flight) solved for the contention sample: compute of t_m
  seconds alone and a collective of t_c alone took T at once, so t_c / (1 + s) = t_m + t_c
  - T (T at or above t_m + t_c: one after the other, `MAX_SLOWDOWN`); without that sample,
  a matmul's time while an all_reduce runs / alone - 1;
- in-step collectives: `comm_scale[kind]` = the summed seconds of the kind's collectives
  timed inside reference training steps / their summed ring time on the isolated link (the
  step's total of that kind is what the factor keeps right);
- op overhead: `op_overhead` o solves measured = predicted + o x per_overhead over the
  reference steps (`StepSample`: each step as the model predicts it with every other figure
  fitted, and how much it grows per second of overhead), least squares on relative error,
  never below 0.

A fitted intercept below zero is dropped (the line is refitted through the origin).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shardlab.cost.clusters import Cluster, Link
from shardlab.cost.comm import factor, ring_time, steps
from shardlab.errors import ExecutionError
from shardlab.runtime.calibrate_measure import (
    CommSample,
    ComputeSample,
    KernelSample,
    Measurements,
    StepSample,
)

#: overlap_slowdown is kept within [0, MAX_SLOWDOWN] (at 20, compute gets under 5% of its
#: speed while a collective runs: the two take turns)
MAX_SLOWDOWN = 20.0
#: a kind's summed roofline seconds below this give it no kernel_scale (too small to read)
MIN_ROOFLINE_S = 2e-6
#: a kind's ops must span this ratio of roofline times for a fixed cost to be fitted
MIN_SPAN = 3.0


@dataclass(frozen=True, slots=True)
class Residual:
    """One sample against its fit: what, measured and predicted seconds."""

    label: str
    measured_s: float
    predicted_s: float

    @property
    def error_pct(self) -> float:
        return (self.predicted_s - self.measured_s) / self.measured_s * 100.0


@dataclass(frozen=True, slots=True)
class LineFit:
    """y = intercept + slope x, fitted on relative error."""

    intercept: float
    slope: float

    def __call__(self, x: float) -> float:
        return self.intercept + self.slope * x


def fit_line(xs: Sequence[float], ys: Sequence[float], relative: bool = True) -> LineFit:
    """Least squares on (fit - y) / y (`relative`; else on fit - y: the largest samples
    weigh most) with intercept >= 0 (else through the origin) and slope > 0."""
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    if len(x) < 2 or np.any(y <= 0):
        raise ExecutionError(f"a line fit needs 2 or more positive samples, got {len(x)}")
    w = 1.0 / y if relative else np.ones_like(y)
    (a, b), *_ = np.linalg.lstsq(np.stack([w, x * w], axis=1), y * w, rcond=None)
    if a < 0:
        a, b = 0.0, float(np.sum(x * w * w * y) / np.sum((x * w) ** 2))
    if b <= 0:
        raise ExecutionError("the fitted time does not grow with size: samples too noisy")
    return LineFit(float(a), float(b))


@dataclass(frozen=True, slots=True)
class ComputeFit:
    """Matmul and elementwise fits of one dtype."""

    dtype: str
    peak_flops: float
    matmul_efficiency: float
    hbm_bandwidth: float
    memory_efficiency: float
    launch_overhead: float
    residuals: tuple[Residual, ...]


def fit_matmul(samples: Sequence[ComputeSample]) -> tuple[float, float, list[Residual]]:
    """(peak FLOP/s, matmul_efficiency, residuals) of matmul samples of one dtype."""
    line = fit_line([s.flops for s in samples], [s.seconds for s in samples])
    rate = 1.0 / line.slope
    peak = max(rate, max(s.flops / s.seconds for s in samples))
    res = [Residual(f"matmul {s.dtype} {s.size}^3", s.seconds, line(s.flops)) for s in samples]
    return peak, rate / peak, res


def fit_memory(samples: Sequence[ComputeSample]) -> tuple[float, float, float, list[Residual]]:
    """(hbm_bandwidth, memory_efficiency, launch_overhead, residuals) of elementwise samples."""
    line = fit_line([s.bytes for s in samples], [s.seconds for s in samples])
    rate = 1.0 / line.slope
    best = max(rate, max(s.bytes / s.seconds for s in samples))
    res = [Residual(f"add {s.dtype} {s.size}", s.seconds, line(s.bytes)) for s in samples]
    return best, rate / best, line.intercept, res


def fit_compute(samples: Sequence[ComputeSample], dtype: str) -> ComputeFit:
    """Every compute figure of `dtype` (matmul samples of float32 too: the fallback)."""
    mm = [s for s in samples if s.kind == "matmul" and s.dtype == dtype]
    ew = [s for s in samples if s.kind == "elementwise" and s.dtype == dtype]
    peak, eff, res = fit_matmul(mm)
    hbm, mem_eff, launch, res2 = fit_memory(ew)
    return ComputeFit(dtype, peak, eff, hbm, mem_eff, launch, tuple(res + res2))


def fit_link(samples: Sequence[CommSample]) -> tuple[Link, list[Residual]]:
    """The Link (bus bandwidth, latency per ring step) that best explains every collective."""
    use = [s for s in samples if s.ranks > 1 and s.seconds > 0]
    if len(use) < 2:
        raise ExecutionError("a link fit needs collectives on 2 or more ranks")
    t = np.array([s.seconds for s in use])
    a = np.array([steps(s.kind, s.ranks) for s in use], dtype=float)
    b = np.array([factor(s.kind, s.ranks) * s.size for s in use], dtype=float)
    w = 1.0 / t
    (lat, inv_bw), *_ = np.linalg.lstsq(np.stack([a * w, b * w], axis=1), t * w, rcond=None)
    if lat < 0:
        lat, inv_bw = 0.0, float(np.sum(b * w * w * t) / np.sum((b * w) ** 2))
    if inv_bw <= 0:
        raise ExecutionError("collective times do not grow with message size: too noisy")
    link = Link(1.0 / float(inv_bw), float(lat))
    return link, _residuals("", link, use)


def _residuals(prefix: str, link: Link, samples: Sequence[CommSample]) -> list[Residual]:
    """Each collective's measured seconds against the cost model's ring time on `link`."""
    return [Residual(f"{prefix}{s.kind} n={s.ranks} {s.size} B", s.seconds,
                     ring_time(s.kind, s.size, s.ranks, link)) for s in samples]  # fmt: skip


def fit_comm_scales(
    link: Link, samples: Sequence[CommSample]
) -> tuple[dict[str, float], list[Residual]]:
    """Per collective kind, the factor on its ring time over `link` that the collectives of
    training steps show (`samples`: timed inside reference steps): summed measured / summed
    ring seconds. Inside a step the ranks arrive at a collective apart and gloo's threads
    share the cores with compute, so a collective costs more than the same one timed alone."""
    use = [s for s in samples if s.ranks > 1 and s.seconds > 0 and steps(s.kind, s.ranks)]
    sums: dict[str, list[float]] = {}
    for s in use:
        acc = sums.setdefault(s.kind, [0.0, 0.0])
        acc[0] += s.seconds
        acc[1] += ring_time(s.kind, s.size, s.ranks, link)
    scales = {k: m / p for k, (m, p) in sorted(sums.items()) if p > 0}
    residuals = [
        Residual(f"in step: {s.kind} n={s.ranks} {s.size} B", s.seconds,
                 scales.get(s.kind, 1.0) * ring_time(s.kind, s.size, s.ranks, link))
        for s in use
    ]  # fmt: skip
    return scales, residuals


def fit_op_overhead(samples: Sequence[StepSample]) -> tuple[float, list[Residual]]:
    """Seconds of overhead per op that best explain the reference steps (module docstring),
    and each step's residual under the linear model."""
    use = [s for s in samples if s.measured_s > 0 and s.per_overhead_s > 0]
    if not use:
        return 0.0, []
    m = np.array([s.measured_s for s in use])
    p = np.array([s.predicted_s for s in use])
    k = np.array([s.per_overhead_s for s in use])
    overhead = max(0.0, float(np.sum(k / m * (m - p) / m) / np.sum((k / m) ** 2)))
    residuals = [Residual(f"step: {s.label}", s.measured_s,
                          s.predicted_s + overhead * s.per_overhead_s) for s in use]  # fmt: skip
    return overhead, residuals


def kernel_scales(samples: Sequence[KernelSample]) -> dict[str, float]:
    """Per op kind, measured / roofline seconds (kinds too small to read are left out)."""
    out: dict[str, float] = {}
    for k in samples:
        if k.roofline_s >= MIN_ROOFLINE_S and k.measured_s > 0:
            out[k.kind] = k.measured_s / k.roofline_s
    return dict(sorted(out.items()))


def kernel_fits(samples: Sequence[KernelSample]) -> tuple[dict[str, float], dict[str, float]]:
    """Per op kind, (`kernel_scale`, `kernel_overhead`): the line measured = overhead +
    scale x roofline through the kind's ops (`fit_line` on absolute error: the step sums
    the kind's times, and its largest ops decide the rate that larger models extrapolate),
    where its ops' roofline times span at least `MIN_SPAN` (a fixed cost and a rate can be
    told apart);
    else the ratio of the sums (`kernel_scales`) and no overhead. A kind whose ops do not
    grow with their size keeps the ratio too."""
    scales, overheads = kernel_scales(samples), {}
    for k in samples:
        if k.kind not in scales:
            continue
        pts = [(w, m) for w, m in k.points if w > 0 and m > 0]
        if len(pts) < 2 or max(w for w, _ in pts) < MIN_SPAN * min(w for w, _ in pts):
            continue
        try:
            line = fit_line([w for w, _ in pts], [m for _, m in pts], relative=False)
        except ExecutionError:
            continue
        scales[k.kind], overheads[k.kind] = line.slope, line.intercept
    return scales, {k: v for k, v in sorted(overheads.items()) if v > 0}


def bus_bandwidth(s: CommSample) -> float:
    """nccl-tests' bus bandwidth of a sample: S / t x factor(kind, n)."""
    return s.size / s.seconds * factor(s.kind, s.ranks)


def overlap_slowdown(
    overlap: tuple[float, float] | None,
    contention: tuple[float, float, float] | None = None,
) -> float:
    """Fraction by which compute slows while a collective runs (module docstring): from the
    contention sample when measured, else from the overlap one; 0 when neither was."""
    if contention is not None and min(contention) > 0:
        compute, comm, both = contention
        spare = compute + comm - both  # what ran at the same time
        if spare <= comm / (1.0 + MAX_SLOWDOWN):
            return MAX_SLOWDOWN
        return min(MAX_SLOWDOWN, max(0.0, comm / spare - 1.0))
    if overlap is None or overlap[0] <= 0:
        return 0.0
    return min(MAX_SLOWDOWN, max(0.0, overlap[1] / overlap[0] - 1.0))


@dataclass(frozen=True, slots=True)
class Fit:
    """Every fitted figure and the residuals of every sample."""

    compute: tuple[ComputeFit, ...]
    link: Link | None
    overlap_slowdown: float
    residuals: tuple[Residual, ...]


def fit_all(m: Measurements) -> Fit:
    """Fit every figure a `Cluster` needs from one calibration's samples."""
    dtypes = [m.dtype] + (["float32"] if m.dtype != "float32" else [])
    compute = [fit_compute(m.compute, m.dtype)]
    for d in dtypes[1:]:
        mm = [s for s in m.compute if s.kind == "matmul" and s.dtype == d]
        peak, eff, res = fit_matmul(mm)
        base = compute[0]
        compute.append(ComputeFit(d, peak, eff, base.hbm_bandwidth, base.memory_efficiency,
                                  base.launch_overhead, tuple(res)))  # fmt: skip
    residuals = [r for c in compute for r in c.residuals]
    link = None
    if m.nproc > 1:
        link, comm_res = fit_link(m.comm)
        residuals += comm_res
    return Fit(tuple(compute), link, overlap_slowdown(m.overlap, m.contention), tuple(residuals))


def cluster_of(fit: Fit, m: Measurements, name: str, description: str, hbm_bytes: float) -> Cluster:
    """The Cluster of a fit: one node of `m.nproc` devices. The launch overhead is the
    backend's measured per-op floor, else the elementwise intercept; matmul's ramp
    (`cost.compute.MATMUL_RAMP_SECONDS`) is the model's own; `comm_scale`, `op_overhead`
    and `straggle` come from the reference steps when measured (else none and 0)."""
    main = fit.compute[0]
    # the model's matmul efficiency is on the dtype's peak: keep each dtype's own
    flops = {c.dtype: c.peak_flops * c.matmul_efficiency / main.matmul_efficiency
             for c in fit.compute}  # fmt: skip
    # one link for both: a single node has no inter-node traffic; inside a step collectives
    # cost what the reference steps' collectives show (`comm_scale`), each op what the
    # reference steps' totals show beside their kernels (`op_overhead`)
    link = fit.link or Link(main.hbm_bandwidth, 0.0)
    comm_scale, _ = fit_comm_scales(link, m.step_comm)
    op_overhead, _ = fit_op_overhead(m.steps)
    scales, fixed = kernel_fits(m.kernels)
    return Cluster(
        kernel_scale=scales,
        kernel_overhead=fixed,
        name=name,
        nodes=1,
        devices_per_node=m.nproc,
        peak_flops=flops,
        hbm_bytes=hbm_bytes,
        hbm_bandwidth=main.hbm_bandwidth,
        intra_node=link,
        inter_node=link,
        overlap_slowdown=fit.overlap_slowdown,
        launch_overhead=m.op_floor_s if m.op_floor_s is not None else main.launch_overhead,
        matmul_efficiency=main.matmul_efficiency,
        memory_efficiency=main.memory_efficiency,
        comm_scale=comm_scale,
        op_overhead=op_overhead,
        straggle=m.straggle or 0.0,
        description=description,
        source="shardlab calibrate",
    )


def median_abs_error(residuals: Sequence[Residual]) -> float:
    """Median |error %| of residuals (nan when there are none)."""
    errs = sorted(abs(r.error_pct) for r in residuals)
    return float(np.median(errs)) if errs else math.nan
