"""The engine process's memory cap: the child runs under RLIMIT_AS, and a child killed by a
signal before it answered (the kernel's OOM killer) fails its job with `out_of_memory`
naming the team's limit. (tests/api/test_team_limits.py runs a job past a team's cap.)"""

from __future__ import annotations

import multiprocessing
import signal
import subprocess
import sys
from multiprocessing.queues import Queue
from pathlib import Path
from typing import Any

from backend.orm import Job
from tests.worker.conftest import settings_for
from worker.child import out_of_memory
from worker.main import Worker, _LocalRun

GIB = 1024**3


#: run in a fresh interpreter: cap itself at 1 GiB, then try to allocate 2 GiB
CAPPED = """
import resource
from worker.child import cap_memory
cap_memory(1 << 30)
print(resource.getrlimit(resource.RLIMIT_AS)[0])
import numpy  # the engine's imports still work under the cap
try:
    bytearray(2 << 30)
except MemoryError:
    print("MemoryError")
"""


def test_the_cap_limits_the_address_space() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CAPPED], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == [str(GIB), "MemoryError"]


def test_a_child_killed_by_a_signal_ran_out_of_memory(sqlite_url: str, tmp_path: Path) -> None:
    worker = Worker(settings_for(sqlite_url, tmp_path), "w")
    ctx = multiprocessing.get_context("spawn")
    channel: Queue[Any] = ctx.Queue()
    proc = ctx.Process(target=signal.raise_signal, args=(signal.SIGKILL,))
    proc.start()
    try:
        run = _LocalRun(proc, channel, 2 * GIB)
        state, error = worker._supervise(Job(id=1, deadline_s=60.0), run)
    finally:
        proc.join(10)
        worker.close()
    assert state == "error"
    assert error == out_of_memory(2 * GIB, "killed by signal 9")
    assert error["code"] == "out_of_memory"
    assert error["message"] == (
        "the job ran out of memory (killed by signal 9): its engine process may use at most "
        "2 GiB (the team's job_memory_bytes limit)"
    )
