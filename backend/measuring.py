"""Queueing a measurement: a built, costed plan's step timed on real torch ranks.

`POST /api/plans/{id}/measurements` (`routers/measurements.py`) checks here, before anything
is stored, that the plan can be measured and where, then queues a `measure` job:

- the plan is costed: measuring holds the step against the cost model's prediction, so a
  plan planned without a cluster is refused (422 naming `plan_id`); it must be built too
  (409 `not_ready`, asked after these checks);
- the model is small enough to run: every rank holds its parameters, gradients and two
  optimizer moments, so a model whose run would hold more than the verification limit
  (`shardlab.check.verification_bytes`) is refused (422 naming `plan_id`). Measuring never
  runs a scaled-down twin: timing a twin says nothing about the plan;
- `nproc` is the plan's mesh size (the default) and `device` cpu or cuda, checked by the
  verifications' rule (`backend/verifying.run_on`, 422 naming the field); the job row holds
  the requirement, so only a worker with the devices claims it (`backend/devices.py`).

The worker stores the result as the plan's `measured` artifact (and the measured Chrome trace
as `measured_trace`): `worker/jobs.py`, `worker/engine.run_measure`.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session, defer

from backend import ledger
from backend.devices import RunOn
from backend.errors import ApiError
from backend.orm import Job, Model, Plan, Strategy
from backend.planning import engine_strategy
from backend.schemas.jobs import MeasurementCreate, VerifyOn
from backend.settings import Settings
from backend.verifying import run_on
from shardlab.check import MAX_VERIFICATION_BYTES, gib, verification_bytes

CODE = "invalid_measurement"
#: the dtype the ranks compute in (`worker.measure.MEASURE_DTYPE`), and its bytes
COMPUTE_DTYPE, DTYPE_BYTES = "float32", 4


def _refuse(message: str, **detail: Any) -> ApiError:
    return ApiError(422, CODE, f"plan_id: {message}", field="plan_id", **detail)


def check_measurable(session: Session, plan: Plan, asked: MeasurementCreate) -> RunOn:
    """Where the measurement of `plan` runs; a 422 `invalid_measurement`
    naming `plan_id`, `nproc` or `device` when it cannot run."""
    if plan.cluster is None:
        raise _refuse(f"plan {plan.id} was planned without a cluster, so it has no predicted "
                      "step to measure against; plan it on a cluster first",
                      plan_id=plan.id)  # fmt: skip
    model = session.get(Model, plan.model_id, options=[defer(Model.graph_blob)])
    strategy = session.get(Strategy, plan.strategy_id)
    assert model is not None and strategy is not None  # a plan keeps its model and strategy
    engine = engine_strategy(strategy.mesh, strategy.templates, strategy.annotations,
                             strategy.options)  # fmt: skip
    params = int(model.summary.get("params", 0))
    need = verification_bytes(params, engine.mesh.size, DTYPE_BYTES)
    if need > MAX_VERIFICATION_BYTES:
        raise _refuse(
            f"measuring {params:,} parameters on {engine.mesh.size} ranks would hold about "
            f"{gib(need)} in {COMPUTE_DTYPE} (limit {gib(MAX_VERIFICATION_BYTES)}); measure "
            "a smaller shape of the model under the same strategy (a scaled-down twin is "
            "not measured: its times say nothing about this plan)",
            plan_id=plan.id,
            bytes=need,
            limit=MAX_VERIFICATION_BYTES,
        )
    asked_on = VerifyOn(backend="torch", nproc=asked.nproc, device=asked.device)
    return run_on(engine, asked_on, code=CODE)


def queue_measurement(
    session: Session,
    settings: Settings,
    team: int,
    plan: Plan,
    asked: MeasurementCreate,
    run: RunOn,
) -> Job:
    """Add the measurement's job (flushed, not committed), running as `run` says
    (`check_measurable`); its payload says what to measure and where, its row what it
    requires of a worker."""
    payload = {"plan_id": plan.id, "steps": asked.steps, "nproc": run.nproc,
               "device": run.device}  # fmt: skip
    return ledger.enqueue(session, settings, team, "measure", payload, requires=run.requirement)
