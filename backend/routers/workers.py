"""Workers: the live workers and their devices (`backend/workers.py`), so a client can tell
whether a torch-backend run of a plan would be claimed (`can_run`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from backend import workers
from backend.deps import PrincipalDep, SessionDep, SettingsDep
from backend.schemas.common import errors

router = APIRouter(prefix="/api/workers", tags=["workers"])


class WorkerOut(BaseModel):
    """A live worker: its id, engine (local | ray), devices, when it started and was last
    seen, and how often `shardlab serve` restarted its worker before this one."""

    id: str
    engine: str
    devices: dict[str, Any] = Field(
        description="{cpu_cores, cuda: [{index, name, memory_bytes}], torch, max_cpu_ranks}"
    )
    seen_at: str
    started_at: str | None
    restarts: int = Field(description="Restarts of `shardlab serve`'s worker before this one.")


@router.get("", response_model=list[WorkerOut], responses=errors(401, 422))
def list_workers(
    session: SessionDep, principal: PrincipalDep, settings: SettingsDep
) -> list[dict[str, Any]]:
    """The workers seen within the heartbeat timeout, most recently seen first."""
    return [w.to_json() for w in workers.live(session, settings)]
