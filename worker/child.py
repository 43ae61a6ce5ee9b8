"""The engine's process: `start_child` spawns it, `child_main` runs one job in it.

The child never touches the database. It sends messages on a queue:
`("progress", fraction, message)` while it works, then exactly one of
`("result", data)`, `("error", {code, message, detail})` (a user error, shown as it is) or
`("crash", {error, traceback})` (an engine bug: the worker logs it and shows the user only a
reference). It exits on its own when its parent (the worker) dies, so a killed worker leaves
no engine running.

The child's address space is capped (`RLIMIT_AS`) at the team's `job_memory_bytes`: an
allocation beyond it raises MemoryError, answered as the error `out_of_memory` naming the
limit (the worker says the same of a child killed by a signal before it answered).

The child leads a process group of its own: what it starts (a torch-backend verification's
rank processes) is in it, so stopping the child (`stop_child`), or the child finding its
worker gone, kills them all. A child that starts processes is not daemonic (multiprocessing
forbids a daemonic process children); `stop_child` ends it all the same.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import resource
import signal
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.context import SpawnProcess
from multiprocessing.queues import Queue
from typing import Any

#: Seconds between the child's checks that its parent is still alive.
PARENT_CHECK_S = 0.5
#: the engine's builds are batch work: on a machine shared with the API (`make run`, a small
#: deployment) they yield the CPU to requests, which wait on them (niceness 0 -> 10)
ENGINE_NICENESS = 10


def _watch_parent(parent: int) -> None:
    """End the child and its process group at once when the worker that started it is gone."""
    while True:
        time.sleep(PARENT_CHECK_S)
        if os.getppid() != parent:
            try:
                os.killpg(os.getpgrp(), signal.SIGKILL)
            finally:
                os._exit(3)


def gib(n_bytes: float) -> str:
    """`n_bytes` in GiB for messages: `8 GiB`, `0.5 GiB`."""
    return f"{n_bytes / 1024**3:.3g} GiB"


def out_of_memory(limit_bytes: int | None, how: str) -> dict[str, Any]:
    """The job's error when its engine process ran out of memory (`how`: what happened)."""
    if limit_bytes is None:
        return {"code": "out_of_memory", "message": f"the job ran out of memory ({how})",
                "detail": {"how": how}}  # fmt: skip
    return {
        "code": "out_of_memory",
        "message": f"the job ran out of memory ({how}): its engine process may use at most "
        f"{gib(limit_bytes)} (the team's job_memory_bytes limit)",
        "detail": {"how": how, "limit_bytes": limit_bytes},
    }


def cap_memory(limit_bytes: int | None) -> None:
    """Limit this process's address space to `limit_bytes` (RLIMIT_AS; never above the hard
    limit it was given): an allocation beyond it fails (MemoryError) instead of the machine
    swapping or the kernel killing a bystander."""
    if limit_bytes is None:
        return
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = limit_bytes if hard == resource.RLIM_INFINITY else min(limit_bytes, hard)
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def child_main(
    kind: str,
    inputs: dict[str, Any],
    queue: Queue[Any],
    parent: int,
    memory_bytes: int | None = None,
) -> None:
    """Run job `kind` on `inputs`, reporting progress and the outcome on `queue`; the process
    may use at most `memory_bytes` of address space (None: no cap), the engine's imports
    included (about 150 MiB virtual for numpy and the engine)."""
    os.setpgid(0, 0)
    cap_memory(memory_bytes)
    os.nice(ENGINE_NICENESS)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the worker's to handle
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()

    def progress(fraction: float, message: str) -> None:
        fraction = round(max(0.0, min(1.0, fraction)), 4)
        queue.put(("progress", fraction, message))

    queue.put(run_job(kind, inputs, progress, memory_bytes))


def run_job(
    kind: str,
    inputs: dict[str, Any],
    progress: Callable[[float, str], None],
    memory_bytes: int | None = None,
) -> tuple[str, Any]:
    """Run job `kind` on `inputs` here: `("result", data)`, `("error", {code, message,
    detail})` or `("crash", {error, traceback})` (the worker's engines share it)."""
    from shardlab.errors import ShardlabError
    from worker.engine import RUNNERS, jsonable

    try:
        return "result", jsonable(RUNNERS[kind](inputs, progress))
    except ShardlabError as exc:
        return "error", jsonable(exc.to_dict())
    except MemoryError:
        return "error", out_of_memory(memory_bytes, "an allocation failed")
    except Exception as exc:  # an engine bug: for the worker's log, not for the user
        return "crash", {"error": f"{type(exc).__name__}: {exc}",
                         "traceback": traceback.format_exc()}  # fmt: skip


def start_child(
    kind: str, inputs: dict[str, Any], memory_bytes: int | None = None, spawns: bool = False
) -> tuple[SpawnProcess, Queue[Any]]:
    """Spawn the engine process for one job, its address space capped at `memory_bytes`
    (`spawns`: it starts processes of its own, so it is not daemonic); returns it and the
    queue it reports on."""
    ctx = multiprocessing.get_context("spawn")
    queue: Queue[Any] = ctx.Queue()
    proc = ctx.Process(
        target=child_main,
        args=(kind, inputs, queue, os.getpid(), memory_bytes),
        name=f"shardlab-{kind}",
        daemon=not spawns,
    )
    proc.start()
    return proc, queue


def stop_child(proc: SpawnProcess, queue: Queue[Any]) -> None:
    """Kill the engine process (if still running) and its process group (what it started),
    and wait until it is gone."""
    if proc.pid is not None:  # gone already, or the child never made the group: nothing to do
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    if proc.is_alive():
        proc.kill()
    proc.join(timeout=10)
    queue.cancel_join_thread()
    queue.close()
