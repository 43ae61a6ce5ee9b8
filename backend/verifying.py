"""Queueing a verification: where it runs, checked against the plan's mesh, and its job.

`POST /api/verifications` and checks with `budgets.verify` (`routers/checks.py`) share it.
A verification runs on the simulated mesh (any worker) or on real ranks (`backend: torch`,
one process per rank), which needs `nproc` equal to the plan's mesh size (the default) and a
worker with the devices (`device`: cpu, the default, or cuda; `backend/devices.py`): the job row
holds that requirement, so only such a worker claims it. Compute dtype "bfloat16" (the
model's own mixed precision, bf16 with fp32 masters) runs only on real ranks. A mistake is a
422 `invalid_verification` naming the field, before anything is stored.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from backend import ledger
from backend.devices import RunOn
from backend.errors import ApiError
from backend.orm import Verification
from backend.schemas.jobs import VerifyOn
from backend.settings import Settings
from shardlab.strategy import Strategy


def _refuse(
    field: str, message: str, code: str = "invalid_verification", **detail: Any
) -> ApiError:
    return ApiError(422, code, f"{field}: {message}", field=field, **detail)


def run_on(
    strategy: Strategy, asked: VerifyOn, prefix: str = "", code: str = "invalid_verification"
) -> RunOn:
    """Where the verification of a plan under `strategy` runs, as `asked`; a 422 `code`
    naming the field (`prefix` + `nproc`, `device`, `backend`) when it cannot run so
    (measurements share the rule: `backend/measuring.py`)."""
    size = strategy.mesh.size
    if asked.backend == "simulated":
        if asked.nproc is not None:
            raise _refuse(prefix + "nproc", "only backend 'torch' runs one process per rank; "
                          "the simulated backend runs every rank in one process",
                          code, nproc=asked.nproc)  # fmt: skip
        if asked.device is not None:
            raise _refuse(prefix + "device", f"device {asked.device!r} needs backend 'torch' "
                          "(the simulated backend runs numpy on the CPU)",
                          code, device=asked.device)  # fmt: skip
        return RunOn()
    nproc = size if asked.nproc is None else asked.nproc
    if nproc != size:
        raise _refuse(prefix + "nproc", f"{nproc} processes asked for, but the plan's mesh "
                      f"{strategy.mesh} has {size} ranks and runs one process per rank",
                      code, nproc=nproc, mesh_size=size)  # fmt: skip
    return RunOn("torch", nproc, asked.device or "cpu")


def check_dtype(compute_dtype: str, run: RunOn, prefix: str = "") -> None:
    """A 422 naming `compute_dtype` when it cannot run where `run` says: "bfloat16" (the
    model's own mixed precision) needs real ranks (`backend: torch`)."""
    if compute_dtype == "bfloat16" and run.backend != "torch":
        raise _refuse(prefix + "compute_dtype", "bfloat16 runs the model's own mixed precision "
                      "on real ranks: it needs backend 'torch' (the simulated backend computes "
                      "in numpy float64/float32)", compute_dtype=compute_dtype)  # fmt: skip


def queue_verification(
    session: Session,
    settings: Settings,
    team: int,
    plan_id: int,
    compute_dtype: str,
    run: RunOn,
    *,
    twin: bool = True,
) -> Verification:
    """Add the verification and its job (flushed, not committed); the job's payload says
    where it runs (and `twin: false` when a model too large must not be scaled down), its
    row what it requires of a worker."""
    job = ledger.enqueue(session, settings, team, "verify", {}, requires=run.requirement)
    ver = Verification(team_id=team, plan_id=plan_id, job_id=job.id, compute_dtype=compute_dtype)
    session.add(ver)
    session.flush()
    payload = {"verification_id": ver.id}
    if run.backend != "simulated":
        payload.update(run.to_json())
    if not twin:
        payload["twin"] = False
    job.payload = payload
    return ver
