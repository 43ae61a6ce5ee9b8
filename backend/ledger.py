"""The job ledger: jobs are rows; the web process only enqueues, reads and flags them.

Workers (`worker/`) claim, run, beat and finish jobs through the functions here, so every
state change of a job is written in one place. A worker owns a job while the row says
`status = running` and `worker_id = <its id>`; every write a worker makes checks that, so a
worker that lost its job (its heartbeat went stale and another worker took the job over)
can never finish, fail or beat it again.

Claiming is exclusive: PostgreSQL locks the candidate row (`FOR UPDATE SKIP LOCKED`), SQLite
takes the database write lock at BEGIN (`BEGIN IMMEDIATE`).

Claiming is fair across teams (`backend/tenancy.py` has their limits): the next job is that
of the team served least recently (whose latest claimed job started longest ago, or never),
its oldest job first, so one team's long queue cannot hold another team's job for more than
one of its jobs per free worker. A team running its `max_running_jobs` is skipped; creating
a job beyond a team's `max_queued_jobs` is a 429.

Workers own devices: a job may require some (`requires_device`, `requires_nproc`: the
ranks on CPU or CUDA of a torch-backend verification or of a measurement), and a worker
claims only the jobs its `Devices` can serve (`backend/devices.can_serve`, here as SQL in
`_servable`); a worker that names no devices claims only jobs that require none. Queued
jobs no worker can serve are flagged, then failed, by `backend/workers.sweep_unservable`
(`give_up_unservable`).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Select, and_, func, or_, select
from sqlalchemy.orm import Session, sessionmaker

from backend.db import transaction
from backend.devices import Devices, Requirement
from backend.errors import ApiError
from backend.orm import Job, Team, TeamLimits, utcnow
from backend.settings import Settings
from backend.tenancy import team_limits

#: Job states; the last four are final.
STATES = ("queued", "running", "succeeded", "failed", "cancelled", "timed_out")
FINAL = frozenset(STATES[2:])
KINDS = ("plan", "verify", "compare", "search", "measure", "import")

#: the Retry-After of a 429 `too_many_jobs` (seconds)
QUEUE_RETRY_S = 30
Factory = sessionmaker[Session]
#: Writes a job's resource rows and artifacts inside `finish`'s transaction.
Store = Callable[[Session, Job], None]


def enqueue(
    session: Session,
    settings: Settings,
    team_id: int,
    kind: str,
    payload: dict[str, Any],
    deadline_s: float | None = None,
    requires: Requirement | None = None,
) -> Job:
    """Add a queued job (flushed, not committed: the caller commits it with its resource),
    claimable only by workers that have what it `requires` (None: any worker).

    Its deadline is `deadline_s`, else the team's `job_deadline_s` limit. A team that already
    has its `max_queued_jobs` queued or running gets a 429 `too_many_jobs` instead (on
    PostgreSQL the team's row is locked while counting, so concurrent creates cannot
    overshoot; SQLite writes one at a time anyway)."""
    assert kind in KINDS, kind
    limits = team_limits(session, settings, team_id)
    _check_queue_room(session, team_id, limits.max_queued_jobs)
    job = Job(
        team_id=team_id,
        kind=kind,
        payload=payload,
        max_attempts=settings.max_attempts,
        deadline_s=limits.job_deadline_s if deadline_s is None else deadline_s,
        requires_device=None if requires is None else requires.device,
        requires_nproc=None if requires is None else requires.nproc,
    )
    session.add(job)
    session.flush()
    return job


def _lock_team(session: Session, team_id: int) -> None:
    """Hold the team's row until the transaction ends (PostgreSQL), so that counting its
    jobs and adding or claiming one is done by one transaction at a time."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(select(Team.id).where(Team.id == team_id).with_for_update())


def _check_queue_room(session: Session, team_id: int, limit: int) -> None:
    """429 `too_many_jobs` when the team has `limit` jobs queued or running."""
    _lock_team(session, team_id)
    active = session.scalar(
        select(func.count())
        .select_from(Job)
        .where(Job.team_id == team_id, Job.status.in_(("queued", "running")))
    )
    if active is not None and active >= limit:
        raise ApiError(
            429,
            "too_many_jobs",
            f"the team has {active} jobs queued or running, its limit is {limit}: wait for "
            "some to finish (or cancel some) and try again",
            headers={"Retry-After": str(QUEUE_RETRY_S)},
            limit=limit,
            active=active,
        )


def _end(job: Job, status: str, message: str, error: dict[str, Any] | None = None) -> None:
    job.status, job.message, job.error = status, message, error
    job.finished_at = utcnow()


def give_up_unservable(job: Job, message: str, after_s: float) -> None:
    """Fail a queued job no worker could serve for `after_s` seconds (`no_capable_worker`);
    `message` says what it waited for and which workers were seen."""
    text = f"no worker could serve it for {after_s:g} s; {message}"
    detail = {"requires_device": job.requires_device, "requires_nproc": job.requires_nproc,
              "unservable_after_s": after_s}  # fmt: skip
    _end(job, "failed", text, {"code": "no_capable_worker", "message": text, "detail": detail})


def _servable(devices: Devices | None) -> Any:
    """SQL: the job's requirement is one `devices` meets (`backend.devices.can_serve`)."""
    ok: list[Any] = [Job.requires_device.is_(None)]
    if devices is not None and devices.torch is not None:
        cpu = and_(Job.requires_device == "cpu", Job.requires_nproc <= devices.max_cpu_ranks)
        ok.append(cpu)
        if devices.cuda:
            ok.append(and_(Job.requires_device == "cuda", Job.requires_nproc <= len(devices.cuda)))
    return or_(*ok)


def _candidates(
    session: Session, settings: Settings, full: set[int], devices: Devices | None = None
) -> Select[Job]:
    """The claimable jobs, fairest first: queued or running with a stale heartbeat (its
    worker died), that `devices` can serve, of teams below their `max_running_jobs` (and
    not in `full`); the team served least recently first (its latest claim started longest
    ago, or never), then the team's oldest job."""
    stale = utcnow() - timedelta(seconds=settings.heartbeat_timeout_s)
    live = and_(Job.status == "running", Job.heartbeat_at >= stale)
    running = (
        select(Job.team_id, func.count().label("n")).where(live).group_by(Job.team_id).subquery()
    )
    served = (
        select(Job.team_id, func.max(Job.started_at).label("last")).group_by(Job.team_id).subquery()
    )
    cap = func.coalesce(TeamLimits.max_running_jobs, settings.team_max_running_jobs)
    lost = and_(Job.status == "running", or_(Job.heartbeat_at.is_(None), Job.heartbeat_at < stale))
    stmt = (
        select(Job)
        .outerjoin(running, running.c.team_id == Job.team_id)
        .outerjoin(served, served.c.team_id == Job.team_id)
        .outerjoin(TeamLimits, TeamLimits.team_id == Job.team_id)
        .where(or_(Job.status == "queued", lost), func.coalesce(running.c.n, 0) < cap)
        .where(_servable(devices))
        .order_by(served.c.last.asc().nulls_first(), Job.created_at, Job.id)
        .limit(1)
    )
    if full:
        stmt = stmt.where(Job.team_id.not_in(full))
    if session.get_bind().dialect.name == "postgresql":
        return stmt.with_for_update(skip_locked=True, of=Job)
    return stmt


def _running_room(session: Session, settings: Settings, team_id: int) -> bool:
    """Whether the team runs fewer live jobs than its `max_running_jobs`, counted under the
    team's row lock (PostgreSQL: two workers claiming for one team at once take turns)."""
    _lock_team(session, team_id)
    stale = utcnow() - timedelta(seconds=settings.heartbeat_timeout_s)
    live = session.scalar(
        select(func.count())
        .select_from(Job)
        .where(Job.team_id == team_id, Job.status == "running", Job.heartbeat_at >= stale)
    )
    return (live or 0) < team_limits(session, settings, team_id).max_running_jobs


def claim(
    factory: Factory, settings: Settings, worker_id: str, devices: Devices | None = None
) -> Job | None:
    """Take the fairest claimable job (`_candidates`: queued, or running with a stale
    heartbeat, that `devices` can serve (None: only jobs requiring no devices); across
    teams the one served least recently, below its running limit); None when there is none.

    The claim counts an attempt; a job that has used up `max_attempts` is marked failed
    (`worker_lost`) instead and the next candidate is tried. A dead worker's job whose
    cancellation was requested is marked cancelled.
    """
    full: set[int] = set()  # teams found at their running limit by the exact count
    while True:
        with transaction(factory, immediate=True) as session:
            found = session.scalars(_candidates(session, settings, full, devices))
            job: Job | None = found.first()
            if job is None:
                return None
            if job.status == "running" and job.cancel_requested:
                _end(job, "cancelled", "cancelled (its worker stopped)")
                continue
            if job.attempts + 1 > job.max_attempts:
                message = (
                    f"gave up after {job.attempts} attempts: the worker running it stopped "
                    f"beating each time (limit {job.max_attempts})"
                )
                error = {
                    "code": "worker_lost",
                    "message": message,
                    "detail": {"attempts": job.attempts},
                }
                _end(job, "failed", message, error)
                continue
            if not _running_room(session, settings, job.team_id):
                full.add(job.team_id)
                continue
            now = utcnow()
            job.attempts += 1
            job.status, job.worker_id = "running", worker_id
            job.heartbeat_at = job.started_at = now
            job.progress, job.message = 0.0, f"claimed by {worker_id} (attempt {job.attempts})"
            session.flush()
            return job


def _owned(session: Session, job_id: int, worker_id: str) -> Job | None:
    """The job if it is still running under `worker_id` (row-locked on PostgreSQL)."""
    stmt = select(Job).where(Job.id == job_id, Job.worker_id == worker_id, Job.status == "running")
    if session.get_bind().dialect.name == "postgresql":
        stmt = stmt.with_for_update()
    return session.scalars(stmt).first()


def heartbeat(factory: Factory, job_id: int, worker_id: str, progress: float, message: str) -> bool:
    """Record that the worker is alive and how far it got. False when the job is no longer
    this worker's or its cancellation was requested: the worker should stop it."""
    with transaction(factory, immediate=True) as session:
        job = _owned(session, job_id, worker_id)
        if job is None:
            return False
        job.heartbeat_at = utcnow()
        job.progress, job.message = max(0.0, min(1.0, progress)), message
        return not job.cancel_requested


def finish(
    factory: Factory,
    job_id: int,
    worker_id: str,
    result: dict[str, Any],
    store: Store | None = None,
    message: str = "done",
) -> bool:
    """Mark the job succeeded with `result`, and write its resource rows with `store` in the
    same transaction, only if the worker still owns it (else nothing is written: False)."""
    with transaction(factory, immediate=True) as session:
        job = _owned(session, job_id, worker_id)
        if job is None:
            return False
        if store is not None:
            store(session, job)
        job.result, job.progress = result, 1.0
        _end(job, "succeeded", message)
        return True


def fail(factory: Factory, job_id: int, worker_id: str, error: dict[str, Any]) -> bool:
    """Mark the job failed with `error` ({code, message, detail}) if the worker owns it."""
    with transaction(factory, immediate=True) as session:
        job = _owned(session, job_id, worker_id)
        if job is None:
            return False
        _end(job, "failed", str(error.get("message", "failed")), error)
        return True


def cancel(factory: Factory, job_id: int, worker_id: str) -> bool:
    """Mark the job cancelled (its worker stopped it) if the worker owns it."""
    with transaction(factory, immediate=True) as session:
        job = _owned(session, job_id, worker_id)
        if job is None:
            return False
        _end(job, "cancelled", "cancelled on request")
        return True


def time_out(factory: Factory, job_id: int, worker_id: str, limit_s: float) -> bool:
    """Mark the job timed out (it ran past its `deadline_s`) if the worker owns it."""
    with transaction(factory, immediate=True) as session:
        job = _owned(session, job_id, worker_id)
        if job is None:
            return False
        message = f"stopped after the job's time limit of {limit_s:g} s"
        _end(
            job,
            "timed_out",
            message,
            {"code": "timed_out", "message": message, "detail": {"deadline_s": limit_s}},
        )
        return True


def release(factory: Factory, job_id: int, worker_id: str) -> bool:
    """Give a job back to the queue (its worker is shutting down); the attempt is not
    counted. False when the worker did not own it."""
    with transaction(factory, immediate=True) as session:
        job = _owned(session, job_id, worker_id)
        if job is None:
            return False
        job.status, job.worker_id, job.heartbeat_at = "queued", None, None
        job.attempts = max(0, job.attempts - 1)
        job.progress, job.message = 0.0, f"released by {worker_id} (shutting down)"
        return True


def request_cancel(session: Session, job: Job) -> None:
    """Cancel a job: a queued one at once, a running one by flagging it for its worker
    (which stops it at its next heartbeat). The caller commits; final jobs are left alone."""
    if job.status == "queued":
        _end(job, "cancelled", "cancelled before it started")
    elif job.status == "running":
        job.cancel_requested = True
        job.message = "cancellation requested"


def iso(moment: datetime | None) -> str | None:
    """`moment` in ISO 8601 (SQLite gives naive datetimes: they are UTC)."""
    if moment is None:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).isoformat()


def ledger_row_json(job: Job) -> dict[str, Any]:
    """The job as the API shows it (times in ISO 8601, UTC)."""
    return {
        "id": job.id,
        "kind": job.kind,
        "status": job.status,
        "progress": job.progress,
        "message": job.message,
        "payload": job.payload,
        "result": job.result,
        "error": job.error,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "deadline_s": job.deadline_s,
        "cancel_requested": job.cancel_requested,
        "worker_id": job.worker_id,
        "requires": None
        if job.requires_device is None
        else {"device": job.requires_device, "nproc": job.requires_nproc},
        "created_at": iso(job.created_at),
        "started_at": iso(job.started_at),
        "heartbeat_at": iso(job.heartbeat_at),
        "finished_at": iso(job.finished_at),
    }
