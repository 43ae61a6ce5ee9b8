"""Calibration measurements: what this machine's torch-backend ranks achieve, raw.

What it is for: `shardlab calibrate` (`runtime.calibrate`) fits a `Cluster` to these samples.
The "device" of the torch backend is one CPU process running torch ops, and its "links"
are gloo collectives between local processes, so everything is measured the way
`runtime.torchdist` runs a plan: `nproc` processes at once (they share the cores and the
memory bus, as a plan's ranks do), spawned with `torch.multiprocessing` and joined in one
gloo group over a FileStore.

Every rank, in lockstep (a barrier before every sample):

- matmul: `torch.matmul(a, b)` of square float matrices of several sizes (FLOPs 2 n^3):
  torch's BLAS, the one the ranks compute with (numpy's may be another library, at another
  rate);
- elementwise: `torch.add(a, b)` into a new tensor of several lengths (bytes 3 x n x
  itemsize);
- collectives, on the first n ranks for every group size n in 2..nproc: all_reduce,
  all_gather, reduce_scatter and all_to_all of several message sizes S (the nccl-tests size:
  the buffer, the gathered output, the input before scattering, each rank's buffer), each
  timed from the block's copy into a flat tensor to the result (as the backend
  runs them);
- overlap: the matmul of the middle size alone, then while an all_reduce is in flight;
- contention: an all_reduce of 4 MiB alone, as many of those matmuls as take about as long
  alone, then both at once (the all_reduce issued, the matmuls run, the all_reduce waited
  for): whether the collective progresses while the rank computes (on a CPU whose cores
  the ranks' compute fills, gloo's threads get none and the two run one after the other).

A sample's seconds are the median of `repeats` timed runs (each a loop of calls long enough
to be read) on each rank, then the median over the ranks that ran it.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

from shardlab.errors import ExecutionError
from shardlab.runtime.torch_launch import rank_environment, start_method

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
#: all_reduces of 4 MiB the overlap measurement runs matmuls under
#: paired rounds of the contention sample (matmuls, all_reduce, both)
CONTENTION_RUNS = 25
OVERLAP_ALL_REDUCES = 8
#: most calls one timed run loops over
MAX_CALLS = 1000


@dataclass(frozen=True, slots=True)
class Sizes:
    """What to sweep: matmul sides, elementwise lengths, message bytes, timing budget."""

    matmul: tuple[int, ...]
    elementwise: tuple[int, ...]
    messages: tuple[int, ...]
    repeats: int
    #: seconds one timed run should last at least (calls are looped until it does)
    min_run_s: float

    @classmethod
    def preset(cls, quick: bool) -> Sizes:
        if quick:
            return cls((64, 128, 256, 384, 512), (1 << 12, 1 << 16, 1 << 19, 1 << 21),
                       (1 << 12, 1 << 16, 1 << 20, 1 << 22), 5, 2e-3)  # fmt: skip
        return cls(
            (32, 64, 96, 128, 192, 256, 384, 512, 768),
            (1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 21, 1 << 22),
            (1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 23),
            5,
            5e-3,
        )


@dataclass(frozen=True, slots=True)
class ComputeSample:
    """One compute measurement: `kind` is matmul or elementwise, `size` its n."""

    kind: str
    dtype: str
    size: int
    flops: int
    bytes: int
    seconds: float


@dataclass(frozen=True, slots=True)
class CommSample:
    """One collective on `ranks` ranks with nccl-tests message size `size` bytes."""

    kind: str
    ranks: int
    size: int
    seconds: float


@dataclass(frozen=True, slots=True)
class KernelSample:
    """One op kind of a reference plan run by the torch backend: its summed roofline seconds
    (launch overhead left out) and summed measured seconds (each op's longest over the
    ranks), and per op (`points`) its (roofline, measured) seconds."""

    kind: str
    ops: int
    roofline_s: float
    measured_s: float
    points: tuple[tuple[float, float], ...] = ()

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> KernelSample:
        points = tuple((float(r), float(m)) for r, m in data.get("points", ()))
        return cls(str(data["kind"]), int(data["ops"]), float(data["roofline_s"]),
                   float(data["measured_s"]), points)  # fmt: skip


@dataclass(frozen=True, slots=True)
class StepSample:
    """One reference plan's training step as the torch backend runs it (slowest rank's
    median step), against the cost model on the calibrated cluster without `op_overhead`:
    `predicted_s`, and `per_overhead_s`, how many seconds the predicted step grows per
    second of `op_overhead` (about the ops on its critical path; `ops` counts them all)."""

    label: str
    ops: int
    measured_s: float
    predicted_s: float
    per_overhead_s: float


@dataclass
class Measurements:
    """Everything one calibration measured (JSON: `to_json` / `from_json`)."""

    nproc: int
    dtype: str
    compute: list[ComputeSample] = field(default_factory=list)
    comm: list[CommSample] = field(default_factory=list)
    #: seconds of one matmul alone and while an all_reduce is in flight
    overlap: tuple[float, float] | None = None
    #: per op kind of the reference plans (`runtime.calibrate_steps.kernel_samples`)
    kernels: list[KernelSample] = field(default_factory=list)
    #: the torch backend's per-op seconds (ops that do no work), when measured
    op_floor_s: float | None = None
    #: collectives timed inside the reference steps, issue to wait
    #: (`runtime.calibrate_steps.step_collectives`)
    step_comm: list[CommSample] = field(default_factory=list)
    #: the reference steps (`runtime.calibrate_steps.step_samples`)
    steps: list[StepSample] = field(default_factory=list)
    #: seconds of matmuls alone, an all_reduce alone, and both at once (module docstring)
    contention: tuple[float, float, float] | None = None
    #: the reference steps' slowest-rank compute over the sum of their ops' own times, less
    #: one (`runtime.calibrate_steps.straggle_of`), when measured
    straggle: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "nproc": self.nproc,
            "dtype": self.dtype,
            "compute": [asdict(s) for s in self.compute],
            "comm": [asdict(s) for s in self.comm],
            "overlap": list(self.overlap) if self.overlap else None,
            "contention": list(self.contention) if self.contention else None,
            "kernels": [asdict(k) for k in self.kernels],
            "op_floor_s": self.op_floor_s,
            "step_comm": [asdict(s) for s in self.step_comm],
            "steps": [asdict(s) for s in self.steps],
            "straggle": self.straggle,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Measurements:
        overlap = data.get("overlap")
        return cls(
            int(data["nproc"]),
            str(data["dtype"]),
            [ComputeSample(**s) for s in data["compute"]],
            [CommSample(**s) for s in data["comm"]],
            (float(overlap[0]), float(overlap[1])) if overlap else None,
            [KernelSample.from_json(k) for k in data.get("kernels", [])],
            data.get("op_floor_s"),
            [CommSample(**s) for s in data.get("step_comm", [])],
            [StepSample(**s) for s in data.get("steps", [])],
            _triple(data.get("contention")),
            data.get("straggle"),
        )


def _triple(raw: Any) -> tuple[float, float, float] | None:
    return (float(raw[0]), float(raw[1]), float(raw[2])) if raw else None


def measure_all(nproc: int, dtype: str, sizes: Sizes, timeout_s: float = 300.0) -> Measurements:
    """Spawn `nproc` gloo ranks and measure everything (module docstring)."""
    if nproc < 1:
        raise ExecutionError(f"calibration needs nproc >= 1, got {nproc}", nproc=nproc)
    tmp: Any = importlib.import_module("torch.multiprocessing")

    with tempfile.TemporaryDirectory(prefix="shardlab-calibrate-") as work:
        plan = {"dtype": dtype, "sizes": asdict(sizes), "timeout_s": timeout_s}
        (Path(work) / "plan.json").write_text(json.dumps(plan))
        try:  # the torch backend's start method and BLAS threads: ranks as measure runs them
            with rank_environment():
                tmp.start_processes(_rank_main, args=(nproc, work), nprocs=nproc,
                                    start_method=start_method())  # fmt: skip
        except Exception as exc:
            raise ExecutionError(f"calibration: a rank process failed: {exc}") from None
        per_rank = [json.loads((Path(work) / f"out{p}.json").read_text()) for p in range(nproc)]
    return _merge(nproc, dtype, per_rank)


def _merge(nproc: int, dtype: str, per_rank: list[dict[str, Any]]) -> Measurements:
    """Median over the ranks that ran each sample."""
    out = Measurements(nproc, dtype)
    first = per_rank[0]
    for i, s in enumerate(first["compute"]):
        secs = statistics.median(r["compute"][i]["seconds"] for r in per_rank)
        out.compute.append(ComputeSample(**{**s, "seconds": secs}))
    for i, s in enumerate(first["comm"]):
        secs = statistics.median(r["comm"][i]["seconds"] for r in per_rank[: s["ranks"]])
        out.comm.append(CommSample(**{**s, "seconds": secs}))
    both = [r["contention"] for r in per_rank if r.get("contention")]
    if both:
        out.contention = _triple([statistics.median(c[i] for c in both) for i in range(3)])
    overlaps = [r["overlap"] for r in per_rank if r["overlap"]]
    if overlaps:
        out.overlap = (
            statistics.median(o[0] for o in overlaps),
            statistics.median(o[1] for o in overlaps),
        )
    return out


# --- one rank -------------------------------------------------------------------------


def _rank_main(proc: int, nproc: int, work: str) -> None:
    """One rank: join the group, measure in lockstep, write `out<proc>.json`, exit."""
    import torch.distributed as dist

    plan = json.loads((Path(work) / "plan.json").read_text())
    raw = plan["sizes"]
    sizes = Sizes(tuple(raw["matmul"]), tuple(raw["elementwise"]), tuple(raw["messages"]),
                  int(raw["repeats"]), float(raw["min_run_s"]))  # fmt: skip
    store = f"file://{Path(work) / 'store'}"
    timeout = timedelta(seconds=plan["timeout_s"])
    dist.init_process_group("gloo", init_method=store, rank=proc, world_size=nproc,
                            timeout=timeout)  # fmt: skip
    groups = {n: dist.new_group(list(range(n))) for n in range(2, nproc + 1)}
    runner = _Runner(proc, plan["dtype"], sizes, dist.barrier)
    result = runner.compute()
    result["comm"] = runner.comm(groups)
    result["overlap"] = runner.overlap(groups.get(nproc)) if nproc > 1 else None
    result["contention"] = runner.contention(groups.get(nproc)) if nproc > 1 else None
    (Path(work) / f"out{proc}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


class _Runner:
    """This rank's timed loops."""

    def __init__(self, proc: int, dtype: str, sizes: Sizes, barrier: Callable[[], Any]) -> None:
        self.proc = proc
        self.dtype = np.dtype(dtype)
        self.sizes = sizes
        self.barrier = barrier
        self.rng = np.random.default_rng(proc)

    def timed(self, fn: Callable[[], object], group: Any = None) -> float:
        """Median seconds of one call: `repeats` runs, each looping until `min_run_s`;
        every rank of `group` (default: all) runs as many calls, a barrier before each run."""
        import torch
        import torch.distributed as dist

        fn()  # warm-up (allocations, first touch)
        dist.barrier(group=group)
        start = time.perf_counter()
        fn()
        once = time.perf_counter() - start
        agreed = torch.tensor([max(1, min(MAX_CALLS, int(self.sizes.min_run_s / once)))])
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=group)
        per_run = int(agreed.item())
        runs = []
        for _ in range(self.sizes.repeats):
            dist.barrier(group=group)
            t0 = time.perf_counter()
            for _ in range(per_run):
                fn()
            runs.append((time.perf_counter() - t0) / per_run)
        return float(statistics.median(runs))

    def tensor(self, shape: tuple[int, ...], dt: np.dtype[Any]) -> Any:
        """Random tensor of `shape` in numpy dtype `dt`: the rank computes with torch ops, as
        the torch backend's ranks do (`runtime.torch_ops`), so their library's rates are
        the ones measured."""
        import torch

        return torch.from_numpy(self.rng.random(shape).astype(dt))

    def compute(self) -> dict[str, Any]:
        import torch

        out: list[dict[str, Any]] = []
        dtypes = [self.dtype] + ([np.dtype("float32")] if self.dtype != np.float32 else [])
        for dt in dtypes:
            for n in self.sizes.matmul:
                a, b = self.tensor((n, n), dt), self.tensor((n, n), dt)
                secs = self.timed(functools.partial(torch.matmul, a, b))
                out.append(asdict(ComputeSample("matmul", dt.name, n, 2 * n**3,
                                                3 * n * n * dt.itemsize, secs)))  # fmt: skip
        for n in self.sizes.elementwise:
            a, b = self.tensor((n,), self.dtype), self.tensor((n,), self.dtype)
            secs = self.timed(functools.partial(torch.add, a, b))
            out.append(asdict(ComputeSample("elementwise", self.dtype.name, n, n,
                                            3 * n * self.dtype.itemsize, secs)))  # fmt: skip
        return {"compute": out}

    def comm(self, groups: dict[int, Any]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for n, group in groups.items():
            member = self.proc < n
            for kind in COLLECTIVES:
                for size in self.sizes.messages:
                    secs = 0.0
                    if member:
                        fn = _collective(kind, size, n, self.dtype, group)
                        secs = self.timed(fn, group)
                    self.barrier()
                    out.append(asdict(CommSample(kind, n, size, secs)))
        return out

    def overlap(self, group: Any) -> tuple[float, float]:
        """One matmul's seconds alone, and while all_reduces of 4 MiB run one after another."""
        import torch
        import torch.distributed as dist

        n = self.sizes.matmul[len(self.sizes.matmul) // 2]
        a = self.tensor((n, n), self.dtype)
        alone = self.timed(lambda: a @ a)
        buf = torch.zeros((1 << 22) // self.dtype.itemsize, dtype=_torch_dtype(self.dtype))
        times: list[float] = []
        self.barrier()
        for _ in range(OVERLAP_ALL_REDUCES):  # as many on every rank
            handle = dist.all_reduce(buf, group=group, async_op=True)
            while not handle.is_completed():
                t0 = time.perf_counter()
                a @ a
                times.append(time.perf_counter() - t0)
            handle.wait()
        self.barrier()
        return alone, float(statistics.median(times)) if times else alone

    def contention(self, group: Any) -> tuple[float, float, float]:
        """Seconds of k matmuls alone, of one all_reduce of 4 MiB alone, and of both at
        once (k: as many matmuls as the all_reduce takes): medians of `CONTENTION_RUNS`
        rounds, each timing the three one after another (paired, so that the machine's
        load drifts alike for all three: the overlap they imply is a small difference of
        large times, and five unpaired runs had put the fitted slowdown anywhere in 1..20)."""
        import torch
        import torch.distributed as dist

        n = self.sizes.matmul[len(self.sizes.matmul) // 2]
        a = self.tensor((n, n), self.dtype)
        buf = torch.zeros((1 << 22) // self.dtype.itemsize, dtype=_torch_dtype(self.dtype))
        comm = self.timed(lambda: dist.all_reduce(buf, group=group), group)
        one = self.timed(lambda: a @ a)
        count = torch.tensor([max(1, min(MAX_CALLS, round(comm / one)))])
        dist.all_reduce(count, op=dist.ReduceOp.MAX, group=group)  # as many on every rank
        k = int(count.item())

        def matmuls() -> None:
            for _ in range(k):
                a @ a

        def both() -> None:
            handle = dist.all_reduce(buf, group=group, async_op=True)
            matmuls()
            handle.wait()

        def collective() -> None:
            dist.all_reduce(buf, group=group)

        runs: list[list[float]] = [[], [], []]
        for _ in range(CONTENTION_RUNS):
            for fn, seen in zip((matmuls, collective, both), runs, strict=True):
                dist.barrier(group=group)
                t0 = time.perf_counter()
                fn()
                seen.append(time.perf_counter() - t0)
        compute, alone, together = (float(statistics.median(r)) for r in runs)
        return compute, alone, together


def _torch_dtype(dt: np.dtype[Any]) -> Any:
    import torch

    return torch.float64 if dt == np.float64 else torch.float32


def _collective(kind: str, size: int, n: int, dt: np.dtype[Any], group: Any) -> Callable[[], Any]:
    """One call of `kind` with message size `size` bytes as the torch backend makes it:
    numpy block -> torch copy -> collective -> numpy result."""
    import torch
    import torch.distributed as dist

    elems = max(n, size // dt.itemsize // n * n)
    full = np.ones(elems, dtype=dt)
    piece = np.ones(elems // n, dtype=dt)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    def all_reduce() -> Any:
        buf = torch.from_numpy(full.copy())
        dist.all_reduce(buf, group=group)
        return buf.numpy().reshape(full.shape)

    def all_gather() -> Any:
        out = torch.from_numpy(np.empty(elems, dtype=dt))
        gather(out, torch.from_numpy(piece.copy()), group=group)
        return out.numpy().reshape(n, -1)

    def reduce_scatter() -> Any:
        out = torch.from_numpy(np.empty(elems // n, dtype=dt))
        scatter(out, torch.from_numpy(full.copy()), group=group)
        return out.numpy()

    def all_to_all() -> Any:
        out = torch.from_numpy(np.empty(elems, dtype=dt))
        dist.all_to_all_single(out, torch.from_numpy(full.copy()), group=group)
        return out.numpy().reshape(n, -1)

    return {"all_reduce": all_reduce, "all_gather": all_gather,
            "reduce_scatter": reduce_scatter, "all_to_all": all_to_all}[kind]  # fmt: skip
