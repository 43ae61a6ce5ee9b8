"""The job worker `shardlab serve` runs beside the service, kept running.

A worker survives any one job's failure (`worker.main.Worker.run_one`), but a process can
still die: the kernel's OOM killer, a `kill -9`, a bug outside any job. `WorkerKeeper`
starts the worker and, whenever it exits while the server still runs, starts a new one
after a backoff: `first_delay_s`, doubling up to `max_delay_s`, and back to the first once
a worker has lived `healthy_s` (so a worker that dies at once does not spin). Each worker is
told how many restarts came before it (`RESTARTS_ENV`); it reports them in the workers'
registry, so `GET /api/workers` shows a restarted worker as such.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable

#: the environment variable that tells a worker how many restarts came before it
RESTARTS_ENV = "SHARDLAB_WORKER_RESTARTS"
#: how long a worker gets to finish after the server stops before it is killed
WORKER_STOP_S = 10.0


def restarts_from_env() -> int:
    """The restarts before this worker (0 when not started by a keeper, or unreadable)."""
    try:
        return max(0, int(os.environ.get(RESTARTS_ENV, "0")))
    except ValueError:
        return 0


class WorkerKeeper:
    """Keeps one `shardlab worker` process running until `stop()` (module docstring)."""

    def __init__(
        self,
        say: Callable[[str], None],
        first_delay_s: float = 1.0,
        max_delay_s: float = 60.0,
        healthy_s: float = 60.0,
    ) -> None:
        self.say = say
        self.first_delay_s, self.max_delay_s, self.healthy_s = first_delay_s, max_delay_s, healthy_s
        self.restarts = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._keep, name="worker-keeper", daemon=True)

    def start(self) -> None:
        """Start the first worker now, and the watch that restarts it."""
        self._launch()
        self._thread.start()

    @property
    def pid(self) -> int | None:
        """The running worker's process id."""
        with self._lock:
            return self._proc.pid if self._proc is not None else None

    def _launch(self) -> None:
        """Start a worker, unless `stop()` came first (checked under the lock `stop` takes)."""
        env = {**os.environ, RESTARTS_ENV: str(self.restarts)}
        with self._lock:
            if self._stopping.is_set():
                return
            self._proc = subprocess.Popen([sys.executable, "-m", "backend", "worker"], env=env)
            pid = self._proc.pid
        restarted = f", restart {self.restarts}" if self.restarts else ""
        self.say(f"shardlab: worker started (pid {pid}{restarted})")

    def _keep(self) -> None:
        delay = self.first_delay_s
        while not self._stopping.is_set():
            with self._lock:
                proc = self._proc
            assert proc is not None
            started = time.monotonic()
            code = proc.wait()
            if self._stopping.is_set():
                return
            if time.monotonic() - started >= self.healthy_s:
                delay = self.first_delay_s
            self.say(f"shardlab: worker (pid {proc.pid}) exited with code {code}; "
                     f"starting another in {delay:g} s")  # fmt: skip
            if self._stopping.wait(delay):
                return
            self.restarts += 1
            self._launch()
            delay = min(delay * 2, self.max_delay_s)

    def stop(self) -> None:
        """Stop restarting; terminate the worker (its job goes back to the queue), killing it
        if it does not exit within `WORKER_STOP_S`."""
        with self._lock:
            self._stopping.set()
            proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=WORKER_STOP_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
