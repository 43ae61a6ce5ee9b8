"""The workers' registry: which workers are up with which devices, and the queued jobs that
none of them can serve.

A worker registers its `Devices` when it starts (`register`), refreshes `seen_at` while it
runs (`touch`, every `heartbeat_interval_s`) and removes itself when it stops cleanly
(`forget`); a worker is live while seen within `heartbeat_timeout_s`. `GET /api/workers`
lists the live ones.

A queued job that needs devices (`backend/devices.py`) no live worker has is flagged in its
message (`waiting: no worker has 2 CUDA devices; workers seen: ...`) by `sweep_unservable`,
which every worker runs every `heartbeat_interval_s`. Once it has waited `unservable_after_s`
and no worker seen in that time could have served it, it fails `no_capable_worker`
(`ledger.give_up_unservable`): a job for hardware that is not there does not hold its team's
queue forever, and a capable worker that was up a moment ago (restarting) keeps it waiting.
With no worker running at all nothing sweeps: the job waits, as every job then does.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from backend import ledger
from backend.db import transaction
from backend.devices import Devices, Requirement, can_serve
from backend.orm import Job, WorkerRow, utcnow
from backend.settings import Settings

#: how many workers a waiting job's message names
NAMED_WORKERS = 5
#: the message of a job that waited for devices and may now be served
WAITING = "waiting: no worker has"


@dataclass(frozen=True, slots=True)
class SeenWorker:
    """A registered worker: its id, devices, engine and when it was last seen (UTC)."""

    id: str
    devices: Devices
    engine: str
    seen_at: datetime
    started_at: datetime | None = None
    restarts: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "engine": self.engine,
            "devices": self.devices.to_json(),
            "seen_at": self.seen_at.isoformat(),
            "started_at": self.started_at.isoformat() if self.started_at else None,
            "restarts": self.restarts,
        }


def aware(moment: datetime) -> datetime:
    """`moment` with a time zone (SQLite gives naive datetimes: they are UTC)."""
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def register(
    factory: ledger.Factory, worker_id: str, devices: Devices, engine: str, restarts: int = 0
) -> None:
    """Record (or replace) the worker's devices and the restarts before it (`shardlab
    serve` restarts a worker that died); it is seen now."""
    with transaction(factory, immediate=True) as session:
        row = session.get(WorkerRow, worker_id)
        now = utcnow()
        if row is None:
            session.add(
                WorkerRow(
                    id=worker_id,
                    devices=devices.to_json(),
                    engine=engine,
                    restarts=restarts,
                    started_at=now,
                    seen_at=now,
                )
            )
        else:
            row.devices, row.engine, row.restarts = devices.to_json(), engine, restarts
            row.started_at = row.seen_at = now


def touch(
    factory: ledger.Factory, worker_id: str, devices: Devices, engine: str, restarts: int = 0
) -> None:
    """The worker is alive (re-registered if its row went away)."""
    with transaction(factory, immediate=True) as session:
        row = session.get(WorkerRow, worker_id)
        if row is not None:
            row.seen_at = utcnow()
            return
    register(factory, worker_id, devices, engine, restarts)


def forget(factory: ledger.Factory, worker_id: str) -> None:
    """Remove the worker's row (it stopped)."""
    with transaction(factory, immediate=True) as session:
        session.execute(delete(WorkerRow).where(WorkerRow.id == worker_id))


def seen(session: Session, since: datetime) -> list[SeenWorker]:
    """The workers seen since `since`, most recently seen first (rows it cannot read skipped)."""
    out = []
    rows = session.scalars(
        select(WorkerRow).where(WorkerRow.seen_at >= since).order_by(WorkerRow.seen_at.desc())
    )
    for row in rows:
        try:
            devices = Devices.from_json(row.devices)
        except (KeyError, TypeError, ValueError):
            continue
        out.append(SeenWorker(row.id, devices, row.engine, aware(row.seen_at),
                              aware(row.started_at), row.restarts))  # fmt: skip
    return out


def live(session: Session, settings: Settings) -> list[SeenWorker]:
    """The workers seen within the heartbeat timeout."""
    return seen(session, utcnow() - timedelta(seconds=settings.heartbeat_timeout_s))


def waiting_message(need: Requirement, workers: list[SeenWorker]) -> str:
    """`waiting: no worker has 2 CUDA devices; workers seen: w1 (4 CPU cores, ...)`."""
    names = [f"{w.id} ({w.devices.describe()})" for w in workers[:NAMED_WORKERS]]
    if len(workers) > NAMED_WORKERS:
        names.append(f"{len(workers) - NAMED_WORKERS} more")
    return f"{WAITING} {need.describe()}; workers seen: {', '.join(names) or 'none'}"


def requirement_of(job: Job) -> Requirement | None:
    if job.requires_device is None:
        return None
    return Requirement(job.requires_device, job.requires_nproc or 1)


def sweep_unservable(factory: ledger.Factory, settings: Settings) -> list[int]:
    """Flag the queued jobs no live worker can serve, fail those unservable for
    `unservable_after_s` (the module's rule); the ids failed."""
    failed: list[int] = []
    waiting = (Job.status == "queued", Job.requires_device.is_not(None))
    with factory() as session:  # most of the time there are none: no write lock for that
        if session.scalar(select(Job.id).where(*waiting).limit(1)) is None:
            return failed
    now = utcnow()
    window = max(settings.unservable_after_s, settings.heartbeat_timeout_s)
    with transaction(factory, immediate=True) as session:
        stmt = select(Job).where(*waiting)
        if session.get_bind().dialect.name == "postgresql":
            stmt = stmt.with_for_update(skip_locked=True)
        jobs = list(session.scalars(stmt))
        if not jobs:
            return failed
        recent = seen(session, now - timedelta(seconds=window))
        live_since = now - timedelta(seconds=settings.heartbeat_timeout_s)
        alive = [w for w in recent if w.seen_at >= live_since]
        for job in jobs:
            need = requirement_of(job)
            if any(can_serve(w.devices, need) for w in alive):
                if job.message.startswith(WAITING):
                    job.message = "queued (a worker can serve it)"
                continue
            message = waiting_message(need, alive) if need is not None else job.message
            waited = (now - aware(job.created_at)).total_seconds()
            capable_lately = any(can_serve(w.devices, need) for w in recent)
            if waited >= settings.unservable_after_s and not capable_lately:
                ledger.give_up_unservable(job, message, settings.unservable_after_s)
                failed.append(job.id)
            elif job.message != message:
                job.message = message
    return failed
