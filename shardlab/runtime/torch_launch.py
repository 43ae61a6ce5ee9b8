"""Launching the torch backend's ranks: one process per rank, joined in a gloo group.

What it is for: `runtime.torchdist` (a flat program) and `runtime.torch_pipeline` (a
pipeline's stages) both run a *job* in every rank process; this module starts those
processes, hands each its input and brings back what each returns, so neither deals with
spawning, stores or error files.

A job is a module-level function `job(proc, common, mine) -> result`, called in process
`proc` (0..n-1, its rank in the default torch group) once the group is joined: `common` is
the same for every process (e.g. the program), `mine` is the process's own input. Jobs and
their payloads travel by pickle, so a job is named by its module, which each process
imports.

- `spawn` starts n processes (`torch.multiprocessing`, "forkserver" where the platform has
  it, a group over a FileStore in a temporary directory) and returns every result in
  process order; a rank's ShardlabError comes back as an ExecutionError naming the rank.
- `run_job` is `spawn`, or, under `torchrun` (RANK, WORLD_SIZE and MASTER_ADDR set), runs
  this process's part in the launched group and shares every result (`all_gather_object`).
- the device (`runtime.torch_device.RankDevice`, default CPU) picks the group's library,
  gloo on CPU and NCCL on CUDA; each process binds its GPU (process index, or torchrun's
  LOCAL_RANK, modulo the node's GPUs) before it joins, and the caller's process checks the
  machine has a GPU per rank first.

Threads: a rank stands for one device, and the ranks share this machine's cores, so each
computes with a one-thread BLAS / OpenMP (`RANK_THREADS`: n ranks each running a threaded
BLAS oversubscribe the cores, and a busy machine makes that many times slower), and keeps
freed memory for its next op's temporaries (`RANK_MALLOC`: glibc's thresholds), unless the
caller's environment sets those variables itself.

Rank setup hook: when the environment variable `SHARDLAB_TORCH_RANK_SETUP` holds
`MODULE:FUNCTION` (a dotted module name, or the path of a `.py` file), every spawned rank
calls that function before its job runs. The value is read when `spawn` is called and
passed to the ranks with the job: forked ranks do not see later changes to the caller's
environment. Tests use it to inject faults into the ranks' kernels.
"""

from __future__ import annotations

import importlib
import importlib.util
import multiprocessing
import os
import pickle
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

from shardlab.errors import ExecutionError, ShardlabError
from shardlab.runtime.torch_device import RankDevice

BACKEND = "torch"
_TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR")
#: Environment variable naming a function every spawned rank calls first (module doc).
SETUP_ENV = "SHARDLAB_TORCH_RANK_SETUP"
#: Modules the forkserver imports once, so that forked ranks start warm.
_PRELOAD = [
    "torch",
    "torch.distributed",
    "shardlab.program",
    "shardlab.runtime.sharded",
    "shardlab.runtime.torch_rank",
    "shardlab.runtime.torch_pipeline",
]

#: Thread counts a rank starts with (where the caller's environment does not set them).
RANK_THREADS = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
#: glibc malloc settings a rank starts with (where the caller's environment does not set
#: them): keep freed blocks of up to 32 MiB in the heap instead of returning them to the
#: kernel, so an op's temporaries reuse memory already mapped, not fresh pages that fault
#: on first touch (steps about a third faster; what jemalloc / tcmalloc do for CPU torch)
RANK_MALLOC = {
    "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
    "MALLOC_TRIM_THRESHOLD_": str(64 << 30),
    "MALLOC_TOP_PAD_": str(256 << 20),
}

#: A rank's job: (process index, input common to all, this process's input) -> result.
Job = Callable[[int, Any, Any], Any]


def torch_modules() -> tuple[ModuleType, ModuleType]:
    """torch and torch.distributed, or an ExecutionError naming the backend."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        raise ExecutionError(
            f"backend {BACKEND!r} needs PyTorch with torch.distributed ({exc}); "
            "install torch or use --backend simulated",
            backend=BACKEND,
        ) from None
    if not dist.is_available():
        raise ExecutionError(
            f"backend {BACKEND!r}: this PyTorch build has no torch.distributed", backend=BACKEND
        )
    return torch, dist


def under_torchrun() -> bool:
    """Whether this process is one rank that torchrun (or a similar launcher) started."""
    return all(k in os.environ for k in _TORCHRUN_ENV)


def run_job(
    job: Job,
    common: Any,
    inputs: Sequence[Any],
    timeout_s: float,
    ranks: Sequence[int] | None = None,
    device: RankDevice | None = None,
) -> list[Any]:
    """Every process's result of `job`, one process per input: spawned, or under torchrun
    this process's share of the launched group (`timeout_s` bounds every collective;
    `ranks` and `device` as for `spawn`)."""
    if not under_torchrun():
        return spawn(job, common, inputs, timeout_s, ranks, device)
    _, dist = torch_modules()
    device = device or RankDevice()
    if not dist.is_initialized():
        device.bind(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(device.collective_backend, timeout=timedelta(seconds=timeout_s))
    world = dist.get_world_size()
    if world != len(inputs):
        raise ExecutionError(
            f"backend {BACKEND!r}: the launcher started {world} processes but the run needs "
            f"{len(inputs)} ranks; they must be equal",
            backend=BACKEND,
            nproc=world,
            mesh_size=len(inputs),
        )
    me = dist.get_rank()
    mine = job(me, common, inputs[me])
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, mine)
    return gathered


def spawn(
    job: Job,
    common: Any,
    inputs: Sequence[Any],
    timeout_s: float,
    ranks: Sequence[int] | None = None,
    device: RankDevice | None = None,
) -> list[Any]:
    """Spawn one process per input; what each process's `job` returned, in process order.
    `ranks`, when given, are the mesh ranks the processes run (an error names them);
    `device` (default CPU) is what every process binds and whose library the group uses."""
    torch, _ = torch_modules()
    n = len(inputs)
    device = device or RankDevice()
    device.check_devices(n)
    with tempfile.TemporaryDirectory(prefix="shardlab-torch-") as tmp:
        work = Path(tmp)
        _dump(work / "job.pkl", (job, common, os.environ.get(SETUP_ENV), device))
        for p, mine in enumerate(inputs):
            _dump(work / f"in{p}.pkl", mine)
        try:
            with rank_environment():
                torch.multiprocessing.start_processes(
                    _spawned_rank,
                    args=(n, str(work), timeout_s),
                    nprocs=n,
                    start_method=start_method(),
                )
        except Exception as exc:  # a rank failed; its own error file says why
            raise _rank_failure(work, ranks or range(n), exc) from None
        return [_load(work / f"out{p}.pkl") for p in range(n)]


def start_method() -> str:
    """The start method: "forkserver" where the platform has it, else "spawn".

    A forkserver imports torch and shardlab once and forks every rank of every run (a fresh
    interpreter per rank costs seconds). Either way each rank imports the caller's
    `__main__` module, as multiprocessing does: a calling script needs an
    `if __name__ == "__main__"` guard.
    """
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return "spawn"
    # not runtime.torchdist: under `python -m` a child runs it again as `__mp_main__`
    multiprocessing.get_context("forkserver").set_forkserver_preload(_PRELOAD)
    return "forkserver"


@contextmanager
def rank_environment() -> Iterator[None]:
    """`RANK_THREADS` and `RANK_MALLOC` in this process's environment while ranks (or the
    forkserver they fork from, started with the first run) are started; the caller's
    values win."""
    wanted = {**RANK_THREADS, **RANK_MALLOC}
    added = {k: v for k, v in wanted.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


def _spawned_rank(proc: int, nproc: int, work: str, timeout_s: float) -> None:
    """Body of one rank's process: join the group, run the setup hook and the job, write its
    result, and leave at once (`os._exit`: an interpreter holding torch takes seconds to
    tear down, and nothing is left to clean up)."""
    _, dist = torch_modules()
    where = Path(work)
    job, common, setup, device = _load(where / "job.pkl")
    device.bind(proc)
    dist.init_process_group(
        device.collective_backend,
        init_method=f"file://{where / 'store'}",
        rank=proc,
        world_size=nproc,
        timeout=timedelta(seconds=timeout_s),
    )
    try:
        if setup:
            _setup_function(setup)()
        _dump(where / f"out{proc}.pkl", job(proc, common, _load(where / f"in{proc}.pkl")))
    except ShardlabError as exc:
        (where / f"error{proc}.txt").write_text(exc.message)
        raise
    finally:
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _setup_function(spec: str) -> Callable[[], Any]:
    """The function `MODULE:FUNCTION` names (MODULE: dotted, or a `.py` file's path)."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise ExecutionError(f"{SETUP_ENV}={spec!r}: expected MODULE:FUNCTION", setup=spec)
    if where.endswith(".py"):
        loaded = importlib.util.spec_from_file_location(Path(where).stem, where)
        if loaded is None or loaded.loader is None:
            raise ExecutionError(f"{SETUP_ENV}: cannot load {where!r}", setup=spec)
        module = importlib.util.module_from_spec(loaded)
        loaded.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ExecutionError(f"{SETUP_ENV}: {where!r} has no function {name!r}", setup=spec)
    return fn  # type: ignore[no-any-return]


def _rank_failure(work: Path, ranks: Sequence[int], exc: Exception) -> ExecutionError:
    """An ExecutionError naming the backend and the first rank that reported an error."""
    for p, r in enumerate(ranks):
        note = work / f"error{p}.txt"
        if note.exists():
            return ExecutionError(
                f"backend {BACKEND!r}, rank {r}: {note.read_text()}", backend=BACKEND, rank=r
            )
    last = str(exc).strip().splitlines()[-1:] or [type(exc).__name__]
    return ExecutionError(
        f"backend {BACKEND!r}: a rank process failed: {last[0]} (each rank imports the "
        'calling script: does it run under an `if __name__ == "__main__"` guard?)',
        backend=BACKEND,
    )


def _dump(path: Path, obj: object) -> None:
    with path.open("wb") as f:
        pickle.dump(obj, f, protocol=pickle.HIGHEST_PROTOCOL)


def _load(path: Path) -> Any:
    with path.open("rb") as f:
        return pickle.load(f)
