"""The engine's process: `start_child` spawns it, `child_main` runs one job in it.

The child never touches the database. It sends messages on a queue:
`("progress", fraction, message)` while it works, then exactly one of
`("result", data)` or `("error", {code, message, detail})`. It exits on its own when its
parent (the worker) dies, so a killed worker leaves no engine running.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
import traceback
from multiprocessing.context import SpawnProcess
from multiprocessing.queues import Queue
from typing import Any

#: Seconds between the child's checks that its parent is still alive.
PARENT_CHECK_S = 0.5


def _watch_parent(parent: int) -> None:
    """Exit the child at once when the worker that started it is gone."""
    while True:
        time.sleep(PARENT_CHECK_S)
        if os.getppid() != parent:
            os._exit(3)


def child_main(kind: str, inputs: dict[str, Any], queue: Queue[Any], parent: int) -> None:
    """Run job `kind` on `inputs`, reporting progress and the outcome on `queue`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the worker's to handle
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    from shardlab.errors import ShardlabError
    from worker.engine import RUNNERS, jsonable

    def progress(fraction: float, message: str) -> None:
        fraction = round(max(0.0, min(1.0, fraction)), 4)
        queue.put(("progress", fraction, message))

    try:
        result = RUNNERS[kind](inputs, progress)
        queue.put(("result", jsonable(result)))
    except ShardlabError as exc:
        queue.put(("error", jsonable(exc.to_dict())))
    except MemoryError:
        queue.put(
            (
                "error",
                {"code": "out_of_memory", "message": "the job ran out of memory", "detail": {}},
            )
        )
    except Exception as exc:  # an engine bug: report it rather than die silently
        queue.put(
            (
                "error",
                {
                    "code": "internal_error",
                    "message": f"the engine failed: {type(exc).__name__}: {exc}",
                    "detail": {"traceback": traceback.format_exc(limit=8)},
                },
            )
        )


def start_child(kind: str, inputs: dict[str, Any]) -> tuple[SpawnProcess, Queue[Any]]:
    """Spawn the engine process for one job; returns it and the queue it reports on."""
    ctx = multiprocessing.get_context("spawn")
    queue: Queue[Any] = ctx.Queue()
    proc = ctx.Process(
        target=child_main,
        args=(kind, inputs, queue, os.getpid()),
        name=f"shardlab-{kind}",
        daemon=True,
    )
    proc.start()
    return proc, queue


def stop_child(proc: SpawnProcess, queue: Queue[Any]) -> None:
    """Kill the engine process (if still running) and wait until it is gone."""
    if proc.is_alive():
        proc.kill()
    proc.join(timeout=10)
    queue.cancel_join_thread()
    queue.close()
