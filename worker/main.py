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
"""

from __future__ import annotations

import logging
import os
import queue as queues
import secrets
import socket
import threading
import time
from multiprocessing.context import SpawnProcess
from multiprocessing.queues import Queue
from typing import Any

from sqlalchemy.exc import OperationalError

from backend import ledger
from backend.db import make_engine, session_factory
from backend.orm import Job
from backend.settings import Settings
from backend.tenancy import team_limits
from shardlab.errors import ShardlabError
from worker.child import out_of_memory, start_child, stop_child
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


class Worker:
    """One worker: claims jobs from the ledger at `settings.database_url`."""

    def __init__(self, settings: Settings, worker_id: str | None = None, poll_s: float = 0.5):
        self.settings, self.poll_s = settings, poll_s
        self.worker_id = worker_id or default_worker_id()
        self.engine = make_engine(settings.database_url)
        self.factory = session_factory(self.engine)
        self._stop = threading.Event()

    def stop(self) -> None:
        """Finish the loop: the running job (if any) is given back to the queue."""
        self._stop.set()

    def close(self) -> None:
        self.engine.dispose()

    def run(self, once: bool = False) -> None:
        """Process jobs until `stop()`; with `once`, at most one job."""
        while not self._stop.is_set():
            try:
                job = self.run_one()
            except OperationalError as exc:  # the database is away: try again later
                log.warning("database error, retrying: %s", exc)
                job = None
            if once:
                return
            if job is None:
                self._stop.wait(self.poll_s)

    def run_one(self) -> Job | None:
        """Claim and process one job; returns it as claimed (None when the queue is empty)."""
        job = ledger.claim(self.factory, self.settings, self.worker_id)
        if job is None:
            return None
        try:
            with self.factory() as session:
                inputs = load_inputs(session, job)
                memory = team_limits(session, self.settings, job.team_id).job_memory_bytes
        except ShardlabError as exc:
            ledger.fail(self.factory, job.id, self.worker_id, exc.to_dict())
            return job
        proc, channel = start_child(job.kind, inputs, memory)
        log.info("job %s (%s) attempt %s: engine pid %s", job.id, job.kind, job.attempts, proc.pid)
        try:
            state, data = self._supervise(job, proc, channel, memory)
        finally:
            stop_child(proc, channel)
        self._record(job, state, data)
        return job

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

    def _supervise(
        self, job: Job, proc: SpawnProcess, channel: Queue[Any], memory: int
    ) -> tuple[str, Any]:
        """Watch the child until it answers or must be stopped: (state, data). A child
        killed by a signal before answering (the kernel's OOM killer, an abort on a failed
        allocation under its `memory` cap) ran out of memory."""
        start = last_beat = last_write = time.monotonic()
        progress, message, written = 0.0, "starting", True
        while True:
            try:
                msg = channel.get(timeout=0.05 if proc.is_alive() else 1.0)
            except queues.Empty:
                msg = None
                if not proc.is_alive() and not self._stop.is_set():
                    code = proc.exitcode
                    if code is not None and code < 0:
                        return "error", out_of_memory(memory, f"killed by signal {-code}")
                    return "error", {
                        "code": "engine_crashed",
                        "message": f"the engine process exited with code {code} before "
                        "answering (out of memory?)",
                        "detail": {"exitcode": code},
                    }
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
