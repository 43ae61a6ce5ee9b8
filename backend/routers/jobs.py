"""Jobs: list and read the team's jobs, cancel one, follow one as server-sent events."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from backend import ledger
from backend.deps import PrincipalDep, SessionDep
from backend.errors import ApiError
from backend.orm import Job
from backend.routers.plans import owned
from backend.schemas.common import PathId, errors
from backend.schemas.jobs import JobOut, JobStatus

router = APIRouter(prefix="/api/jobs", tags=["jobs"])

#: Seconds between two looks at a followed job.
POLL_S = 0.3


@router.get("", response_model=list[JobOut], responses=errors(401, 422))
def list_jobs(
    session: SessionDep,
    principal: PrincipalDep,
    status: JobStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[dict[str, Any]]:
    """The team's jobs, newest first, optionally only those in `status`."""
    query = select(Job).where(Job.team_id == principal.team_id)
    if status is not None:
        query = query.where(Job.status == status)
    rows = session.scalars(query.order_by(Job.id.desc()).limit(limit))
    return [ledger.ledger_row_json(job) for job in rows]


@router.get("/{job_id}", response_model=JobOut, responses=errors(401, 404, 422))
def get_job(job_id: PathId, session: SessionDep, principal: PrincipalDep) -> dict[str, Any]:
    """One job: state, progress, attempts, outcome."""
    return ledger.ledger_row_json(owned(session, Job, principal.team_id, job_id, "job"))


@router.post("/{job_id}/cancel", response_model=JobOut, responses=errors(401, 404, 409, 422))
def cancel_job(job_id: PathId, session: SessionDep, principal: PrincipalDep) -> dict[str, Any]:
    """Cancel a job: a queued one at once, a running one at its worker's next heartbeat.
    409 `job_finished` for a job already in a final state."""
    job: Job = owned(session, Job, principal.team_id, job_id, "job")
    if job.status in ledger.FINAL:
        raise ApiError(
            409,
            "job_finished",
            f"job {job_id} is already {job.status}",
            job_id=job_id,
            job_status=job.status,
        )
    ledger.request_cancel(session, job)
    session.commit()
    return ledger.ledger_row_json(job)


def _events(sessions: sessionmaker[Session], job_id: int, limit_s: float) -> Iterator[str]:
    """`progress` events on every change of the job's state, then `end`."""
    last: dict[str, Any] | None = None
    stop = time.monotonic() + limit_s
    while True:
        with sessions() as session:
            job = session.get(Job, job_id)
            state: dict[str, Any] | None = (
                None
                if job is None
                else {
                    "id": job_id,
                    "status": job.status,
                    "progress": job.progress,
                    "message": job.message,
                    "error": job.error,
                }
            )
        if state is None:
            yield f"event: end\ndata: {json.dumps({'id': job_id, 'status': 'gone'})}\n\n"
            return
        if state != last:
            yield f"event: progress\ndata: {json.dumps(state)}\n\n"
            last = state
        if state["status"] in ledger.FINAL:
            yield f"event: end\ndata: {json.dumps(state)}\n\n"
            return
        if time.monotonic() > stop:
            yield f"event: timeout\ndata: {json.dumps(state)}\n\n"
            return
        time.sleep(POLL_S)


@router.get("/{job_id}/events", response_class=StreamingResponse, responses=errors(401, 404, 422))
def job_events(
    job_id: PathId,
    request: Request,
    session: SessionDep,
    principal: PrincipalDep,
    timeout_s: Annotated[float, Query(gt=0, le=3600)] = 600.0,
) -> StreamingResponse:
    """Server-sent events: `progress` (data: status, progress, message, error) on every
    change until the job reaches a final state, then `end`; `timeout` after `timeout_s`."""
    owned(session, Job, principal.team_id, job_id, "job")
    session.rollback()
    return StreamingResponse(
        _events(request.app.state.sessions, job_id, timeout_s),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
