"""The worker loop: claim a job, run it in a child process, beat, store the outcome.

An engine bug's traceback is logged here under a short reference (`internal_error`); the job's
error shows the user only a message and the reference.

`Worker.run_one()` handles at most one job (tests call it in-process); `Worker.run()` loops
until `stop()` (SIGTERM / SIGINT in `shardlab worker`). While the child works the worker
beats every `heartbeat_interval_s` (and when progress changes), kills the child when the
job's cancellation is requested (-> cancelled), when its `deadline_s` passes (-> timed_out),
or when the job was taken over by another worker (nothing written), and on shutdown gives
the job back to the queue. The child's address space is capped at the team's
`job_memory_bytes` (`backend/tenancy.py`, read when the job is claimed): running out of it,
or being killed by a signal before answering, fails the job with `out_of_memory`.

Workers own devices (`worker/devices.py`): a worker logs and registers its `Devices` when it
starts (`backend/workers.py`, refreshed every `heartbeat_interval_s` with a sweep of the
queued jobs no worker can serve), and claims only the jobs it can serve
(`backend/devices.can_serve`). With `engine="ray"` a job that requires devices runs as a Ray
task in a placement group of its ranks (`worker/ray_engine.py`); every other job, and every
job of the default `local` engine, runs in a child process here.
"""

from __future__ import annotations

import logging
import os
import queue as queues
import secrets
import socket
import threading
import time
import traceback
from multiprocessing.context import SpawnProcess
from multiprocessing.queues import Queue
from typing import Any

from sqlalchemy.exc import OperationalError

from backend import ledger, workers
from backend.db import make_engine, session_factory
from backend.devices import Devices
from backend.orm import Job
from backend.settings import Settings
from backend.tenancy import team_limits
from shardlab.errors import ShardlabError
from worker.child import out_of_memory, start_child, stop_child
from worker.devices import discover
from worker.jobs import load_inputs, outcome

log = logging.getLogger("shardlab.worker")

#: At most one progress write per this many seconds (heartbeats aside).
PROGRESS_WRITE_S = 0.2


def internal_error(job: Job, crash: dict[str, Any]) -> dict[str, Any]:
    """The job's error for an engine bug: a message and a short random reference; the
    traceback goes to this worker's log (ERROR) under that reference, never to the user."""
    reference = secrets.token_hex(4)
    log.error(
        "job %s (%s): engine failure, reference %s: %s\n%s",
        job.id,
        job.kind,
        reference,
        crash.get("error", "?"),
        str(crash.get("traceback", "")).rstrip(),
    )
    return {
        "code": "internal_error",
        "message": f"the engine failed unexpectedly; report reference {reference} "
        "(the server log has the details)",
        "detail": {"reference": reference},
    }


def default_worker_id() -> str:
    """`<host>-<pid>`: unique among the workers sharing a database."""
    return f"{socket.gethostname()}-{os.getpid()}"


#: the engines a worker runs device jobs on
ENGINES = ("local", "ray")


class _LocalRun:
    """A job's engine child process, watched by `Worker._supervise`."""

    def __init__(self, proc: SpawnProcess, channel: Queue[Any], memory: int) -> None:
        self.proc, self.channel, self.memory = proc, channel, memory

    def poll(self, stopping: bool) -> tuple[Any, ...] | None:
        """The child's next message, or its death as an error; None when it has none yet. A
        child killed by a signal before answering (the kernel's OOM killer, an abort on a
        failed allocation under its `memory` cap) ran out of memory."""
        proc = self.proc
        try:
            msg: tuple[Any, ...] = self.channel.get(timeout=0.05 if proc.is_alive() else 1.0)
            return msg
        except queues.Empty:
            if proc.is_alive() or stopping:
                return None
        code = proc.exitcode
        if code is not None and code < 0:
            return "error", out_of_memory(self.memory, f"killed by signal {-code}")
        return "error", {
            "code": "engine_crashed",
            "message": f"the engine process exited with code {code} before answering "
            "(out of memory?)",
            "detail": {"exitcode": code},
        }

    def stop(self) -> None:
        stop_child(self.proc, self.channel)


class Worker:
    """One worker: claims the jobs its `devices` can serve from the ledger at
    `settings.database_url` and runs them on its `engine` (`ENGINES`)."""

    def __init__(
        self,
        settings: Settings,
        worker_id: str | None = None,
        poll_s: float = 0.5,
        devices: Devices | None = None,
        engine: str = "local",
        ray_address: str | None = None,
        restarts: int = 0,
    ):
        if engine not in ENGINES:
            raise ValueError(f"unknown engine {engine!r}; available: {', '.join(ENGINES)}")
        self.settings, self.poll_s = settings, poll_s
        self.worker_id = worker_id or default_worker_id()
        self.engine = make_engine(settings.database_url)
        self.factory = session_factory(self.engine)
        self._stop = threading.Event()
        self.ray: Any = None
        if engine == "ray":
            from worker.ray_engine import RayEngine

            self.ray = RayEngine(ray_address)
        self.engine_name = engine
        self.restarts = restarts  # before this worker: `shardlab serve` restarts its worker
        self.devices = devices or (self.ray.devices() if self.ray else discover())
        self._tended: float | None = None

    def stop(self) -> None:
        """Finish the loop: the running job (if any) is given back to the queue."""
        self._stop.set()

    def close(self) -> None:
        """Leave the registry and let go of the database (and of Ray)."""
        try:
            workers.forget(self.factory, self.worker_id)
        except OperationalError as exc:
            log.warning("could not unregister worker %s: %s", self.worker_id, exc)
        if self.ray is not None:
            self.ray.close()
        self.engine.dispose()

    def announce(self) -> None:
        """Log and register this worker's devices (done by the first `run_one` too)."""
        log.info("worker %s (%s engine): %s", self.worker_id, self.engine_name,
                 self.devices.describe())  # fmt: skip
        workers.register(self.factory, self.worker_id, self.devices, self.engine_name,
                         self.restarts)  # fmt: skip
        self._tended = time.monotonic()

    def tend(self) -> None:
        """Every `heartbeat_interval_s`: say this worker is alive, and flag or fail the
        queued jobs no worker can serve (`backend.workers.sweep_unservable`)."""
        now = time.monotonic()
        if self._tended is None:
            self.announce()
        elif now - self._tended < self.settings.heartbeat_interval_s:
            return
        else:
            self._tended = now
            workers.touch(self.factory, self.worker_id, self.devices, self.engine_name,
                          self.restarts)  # fmt: skip
        for job_id in workers.sweep_unservable(self.factory, self.settings):
            log.info("job %s: failed, no worker can serve it", job_id)

    def run(self, once: bool = False) -> None:
        """Process jobs until `stop()`; with `once`, at most one job."""
        while not self._stop.is_set():
            try:
                job = self.run_one()
            except OperationalError as exc:  # the database is away: try again later
                log.warning("database error, retrying: %s", exc)
                job = None
            except Exception:  # a bug outside any one job: this worker goes on all the same
                log.exception("worker %s: unexpected error, going on", self.worker_id)
                job = None
            if once:
                return
            if job is None:
                self._stop.wait(self.poll_s)

    def run_one(self) -> Job | None:
        """Claim and process one job; returns it as claimed (None when the queue is empty).

        Whatever goes wrong with the job (its inputs, its engine, storing its outcome: a
        result the database refuses) fails that job as an `internal_error`, never this
        worker: one team's bad job must not stop every team's queue."""
        self.tend()
        job = ledger.claim(self.factory, self.settings, self.worker_id, self.devices)
        if job is None:
            return None
        try:
            self._process(job)
        except OperationalError:  # the database is away: `run` retries, the job is taken over
            raise
        except Exception as exc:
            self._fail_unexpectedly(job, exc)
        return job

    def _process(self, job: Job) -> None:
        """Run the claimed `job` on its engine and record how it ended."""
        try:
            with self.factory() as session:
                inputs = load_inputs(session, job)
                memory = team_limits(session, self.settings, job.team_id).job_memory_bytes
        except ShardlabError as exc:
            ledger.fail(self.factory, job.id, self.worker_id, exc.to_dict())
            return
        run: Any
        if self.ray is not None and job.requires_device is not None:
            need = workers.requirement_of(job)
            assert need is not None
            run = self.ray.start(job.kind, inputs, need)
            log.info("job %s (%s) attempt %s: ray task, %s", job.id, job.kind, job.attempts,
                     need.describe())  # fmt: skip
        else:
            spawns = inputs.get("backend") == "torch"
            proc, channel = start_child(job.kind, inputs, memory, spawns)
            run = _LocalRun(proc, channel, memory)
            log.info("job %s (%s) attempt %s: engine pid %s", job.id, job.kind, job.attempts,
                     proc.pid)  # fmt: skip
        try:
            state, data = self._supervise(job, run)
        finally:
            run.stop()
        self._record(job, state, data)

    def _fail_unexpectedly(self, job: Job, exc: Exception) -> None:
        """Fail `job` as an `internal_error` (the traceback logged under its reference); if
        even that cannot be written, log it: the job is taken over once its beats stop, and
        gives up after `max_attempts`."""
        crash = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        try:
            ledger.fail(self.factory, job.id, self.worker_id, internal_error(job, crash))
        except Exception:
            log.exception("job %s: could not record its failure", job.id)

    def run_until_empty(self) -> int:
        """Process jobs until the queue is empty (tests, benchmarks); how many it processed."""
        done = 0
        while self.run_one() is not None:
            done += 1
        return done

    def _record(self, job: Job, state: str, data: Any) -> None:
        log.info("job %s: %s", job.id, state)
        wid, factory = self.worker_id, self.factory
        if state == "result":
            store, result = outcome(job, data)
            try:
                ledger.finish(factory, job.id, wid, result, store)
            except ShardlabError as exc:  # its resource row went away meanwhile
                ledger.fail(factory, job.id, wid, exc.to_dict())
        elif state == "error":
            ledger.fail(factory, job.id, wid, data)
        elif state == "crash":
            ledger.fail(factory, job.id, wid, internal_error(job, data))
        elif state == "stopped":  # cancel requested, or the job is no longer ours
            ledger.cancel(factory, job.id, wid)
        elif state == "timed_out":
            ledger.time_out(factory, job.id, wid, job.deadline_s)
        elif state == "shutdown":
            ledger.release(factory, job.id, wid)

    def _supervise(self, job: Job, run: Any) -> tuple[str, Any]:
        """Watch the job's run (`_LocalRun`, `ray_engine.RayRun`) until it answers or must
        be stopped: (state, data)."""
        start = last_beat = last_write = time.monotonic()
        progress, message, written = 0.0, "starting", True
        while True:
            msg = run.poll(self._stop.is_set())
            if msg is not None and msg[0] == "progress":
                progress, message, written = float(msg[1]), str(msg[2]), False
            elif msg is not None:
                return str(msg[0]), msg[1]
            now = time.monotonic()
            if self._stop.is_set():
                return "shutdown", None
            if now - start > job.deadline_s:
                return "timed_out", None
            due = now - last_beat >= self.settings.heartbeat_interval_s
            if due or (not written and now - last_write >= PROGRESS_WRITE_S):
                if not ledger.heartbeat(self.factory, job.id, self.worker_id, progress, message):
                    return "stopped", None
                last_beat = last_write = now
                written = True
                self.tend()
