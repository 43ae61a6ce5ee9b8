"""The database side of each job kind: load its inputs, store its outcome.

A job's payload names its resource row (`{"plan_id", "cluster"}`, `{"verification_id"}`,
`{"comparison_id"}`, `{"search_id", "cluster"}`, `{"plan_id", "steps", "nproc", "device"}`);
plan and search jobs also hold the cluster spec resolved when they were created (or None).
Inputs handed to the engine are plain data:

    plan:    {"graph": graph JSON, "strategy": {mesh, templates, annotations, options},
              "cluster": cluster JSON | None, "label": str}
    verify:  the plan inputs + {"compute_dtype", "backend", "nproc", "device"} (where it
             runs: `backend/verifying.py`; simulated unless the payload says otherwise)
    measure: the plan inputs + {"steps", "nproc", "device", "backend": "torch"} (its ranks
             are processes: the worker runs it as it runs a torch-backend verification)
    compare: {"a": plan inputs, "b": plan inputs}
    search:  {"preset", "overrides", "cluster": cluster JSON, "gpus", "global_batch",
              "memory_headroom", "max_tp", "min_dp", "cross_node_tp"}
    import:  {"config", "batch", "seq", "base_name", "max_ops"} (`worker/importing.py`)
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete
from sqlalchemy.orm import Session

from backend import blobs
from backend.ledger import Store
from backend.orm import Artifact, Comparison, Job, Model, Plan, Search, Strategy, Verification
from shardlab.errors import ShardlabError
from worker.importing import import_inputs, import_outcome


class JobInputError(ShardlabError):
    """A job's resource row (or the model, strategy or plan it needs) is gone."""

    code = "not_found"


def _get(session: Session, table: type[Any], ident: Any, what: str) -> Any:
    row = session.get(table, ident) if isinstance(ident, int) else None
    if row is None:
        raise JobInputError(f"{what} {ident} no longer exists", resource=what, id=ident)
    return row


def plan_inputs(session: Session, plan: Plan) -> dict[str, Any]:
    """What the engine needs to rebuild `plan`."""
    model: Model = _get(session, Model, plan.model_id, "model")
    strategy: Strategy = _get(session, Strategy, plan.strategy_id, "strategy")
    job = session.get(Job, plan.job_id)
    cluster = job.payload.get("cluster") if job is not None else None
    return {
        "graph": blobs.unpack(model.graph_blob),
        "strategy": {
            "mesh": strategy.mesh,
            "templates": list(strategy.templates),
            "annotations": list(strategy.annotations),
            "options": dict(strategy.options),
        },
        "cluster": cluster,
        "label": f"plan {plan.id}: {model.name} / {strategy.name} v{strategy.version}"
        + (f" on {plan.cluster}" if plan.cluster else ""),
    }


def load_inputs(session: Session, job: Job) -> dict[str, Any]:
    """The engine inputs of `job`; JobInputError when a row it needs is gone."""
    payload = job.payload
    if job.kind == "plan":
        plan: Plan = _get(session, Plan, payload.get("plan_id"), "plan")
        return plan_inputs(session, plan)
    if job.kind == "verify":
        ver: Verification = _get(
            session, Verification, payload.get("verification_id"), "verification"
        )
        plan = _get(session, Plan, ver.plan_id, "plan")
        run = {k: payload.get(k) for k in ("backend", "nproc", "device")}
        return {**plan_inputs(session, plan), "compute_dtype": ver.compute_dtype,
                **run, "backend": run["backend"] or "simulated",
                "twin": payload.get("twin", True)}  # fmt: skip
    if job.kind == "measure":
        plan = _get(session, Plan, payload.get("plan_id"), "plan")
        run = {k: payload.get(k) for k in ("steps", "nproc", "device")}
        return {**plan_inputs(session, plan), **run, "backend": "torch"}
    if job.kind == "compare":
        comp: Comparison = _get(session, Comparison, payload.get("comparison_id"), "comparison")
        a = _get(session, Plan, comp.plan_a_id, "plan")
        b = _get(session, Plan, comp.plan_b_id, "plan")
        return {"a": plan_inputs(session, a), "b": plan_inputs(session, b)}
    if job.kind == "search":
        row: Search = _get(session, Search, payload.get("search_id"), "search")
        model = _get(session, Model, row.model_id, "model")
        request = {k: v for k, v in row.request.items() if k not in ("model_id", "cluster")}
        return {"preset": model.preset, "overrides": dict(model.overrides),
                "cluster": payload.get("cluster"), **request}  # fmt: skip
    if job.kind == "import":
        return import_inputs(job)
    raise JobInputError(f"unknown job kind {job.kind!r}", kind=job.kind)


def put_artifact(
    session: Session, job: Job, owner: str, owner_id: int, kind: str, data: Any
) -> None:
    """Store `data` compressed as the `kind` artifact of (`owner`, `owner_id`), replacing any."""
    session.execute(
        delete(Artifact).where(
            Artifact.owner == owner, Artifact.owner_id == owner_id, Artifact.kind == kind
        )
    )
    packed, raw = blobs.pack(data)
    session.add(
        Artifact(
            team_id=job.team_id,
            owner=owner,
            owner_id=owner_id,
            kind=kind,
            data=packed,
            raw_bytes=raw,
        )
    )


def outcome(job: Job, data: dict[str, Any]) -> tuple[Store, dict[str, Any]]:
    """How to store the engine's result of `job`, and the job's own (small) result."""
    payload = job.payload
    if job.kind == "import":
        return import_outcome(job, data)
    if job.kind == "plan":
        plan_id = int(payload["plan_id"])
        summary = data["summary"]

        def store_plan(session: Session, job: Job) -> None:
            plan: Plan = _get(session, Plan, plan_id, "plan")
            plan.summary = summary
            for kind, artifact in sorted(data["artifacts"].items()):
                put_artifact(session, job, "plan", plan_id, kind, artifact)

        cost = summary.get("cost") or {}
        return store_plan, {
            "plan_id": plan_id,
            "artifacts": sorted(data["artifacts"]),
            "step_time_s": cost.get("step_time_s"),
        }
    if job.kind == "verify":
        ver_id = int(payload["verification_id"])

        def store_report(session: Session, job: Job) -> None:
            ver: Verification = _get(session, Verification, ver_id, "verification")
            ver.report = data["report"]

        return store_report, {"verification_id": ver_id, "ok": data["report"]["ok"]}
    if job.kind == "measure":
        return _measured(job, data)
    if job.kind == "search":
        search_id = int(payload["search_id"])

        def store_search(session: Session, job: Job) -> None:
            row: Search = _get(session, Search, search_id, "search")
            row.result = data["search"]

        found = data["search"]
        best = found["candidates"][0] if found["candidates"] else None
        return store_search, {
            "search_id": search_id,
            "candidates": len(found["candidates"]),
            "winner": best["label"] if best and best["fits"] else None,
        }
    comp_id = int(payload["comparison_id"])

    def store_comparison(session: Session, job: Job) -> None:
        comp: Comparison = _get(session, Comparison, comp_id, "comparison")
        comp.result = data["comparison"]

    return store_comparison, {"comparison_id": comp_id}


def _measured(job: Job, data: dict[str, Any]) -> tuple[Store, dict[str, Any]]:
    """A measurement's outcome: the plan's `measured` and `measured_trace` artifacts (the
    latest measurement replaces the one before), and the step's figures as the job's result."""
    plan_id = int(job.payload["plan_id"])
    measured = data["measured"]

    def store_measured(session: Session, job: Job) -> None:
        _get(session, Plan, plan_id, "plan")  # deleted meanwhile: the job fails instead
        put_artifact(session, job, "plan", plan_id, "measured", measured)
        put_artifact(session, job, "plan", plan_id, "measured_trace", data["trace"])

    step: dict[str, Any] = next((r for r in measured["rows"] if r["group"] == "step"), {})
    return store_measured, {
        "plan_id": plan_id,
        "artifacts": ["measured", "measured_trace"],
        "predicted_step_s": step.get("predicted_s"),
        "measured_step_s": step.get("measured_s"),
        "error_pct": step.get("error_pct"),
    }
