"""Schemas of jobs and of what jobs build: plans, verifications, comparisons.

Requests forbid unknown fields. Large artifact views (program, placements, collectives,
trace) are documented on their endpoints and returned as JSON objects.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from backend.schemas.common import RowId, StrictRequest

JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelled", "timed_out"]


class JobOut(BaseModel):
    """A job of the ledger: its state, progress and outcome (times in ISO 8601, UTC)."""

    id: int
    kind: Literal["plan", "verify", "compare", "search", "measure", "import"]
    status: JobStatus
    progress: float = Field(description="0..1")
    message: str = Field(description="What the job does now, or how it ended.")
    payload: dict[str, Any] = Field(description="What to build: the resource's id.")
    result: dict[str, Any] | None = Field(description="Small result once succeeded.")
    error: dict[str, Any] | None = Field(description="{code, message, detail} once failed.")
    attempts: int = Field(description="Claims by workers so far.")
    max_attempts: int
    deadline_s: float = Field(description="Wall-clock limit of one attempt.")
    cancel_requested: bool
    worker_id: str | None
    requires: dict[str, Any] | None = Field(
        None, description="{device, nproc} a worker must have to claim it; None: any worker."
    )
    created_at: str | None
    started_at: str | None
    heartbeat_at: str | None
    finished_at: str | None


class _Request(StrictRequest):
    """Base of this module's request bodies (`StrictRequest`)."""


class PlanCreate(_Request):
    """Plan a stored model under a stored strategy version, optionally costed on a cluster."""

    model_id: RowId
    strategy_id: RowId
    cluster: str | None = Field(
        None,
        min_length=1,
        max_length=100,
        description="Cluster preset (e.g. 'h100-sxm-8x8') or a team cluster's name.",
    )


class Created(BaseModel):
    """A resource whose job was queued (202)."""

    id: int = Field(description="The resource's id.")
    job_id: int
    status: JobStatus


class PlanOut(BaseModel):
    """A plan, its job's state and, once built, its summary."""

    id: int
    model_id: RowId
    model: str | None = Field(description="The model's name.")
    strategy_id: RowId
    strategy: str | None = Field(description='The strategy version, "name v<version>".')
    cluster: str | None
    job_id: int
    status: JobStatus
    progress: float
    message: str
    error: dict[str, Any] | None
    summary: dict[str, Any] | None = Field(description="Plan.summary() once built.")
    author: str | None = Field(description="Who asked for the plan (None: a team token).")
    review_state: Literal["none", "pending", "changes_requested", "approved"]
    baseline: dict[str, Any] | None = Field(
        None,
        description="One plan's view: its baseline (model and cluster) and, once both are "
        "built, their figures with the change in percent (`backend.baselines.comparison`).",
    )
    baseline_of: list[str] = Field(
        default_factory=list, description="One plan's view: the baselines this plan is."
    )
    created_at: str | None


class VerifyOn(_Request):
    """Where a verification's distributed side runs: the simulated mesh (every rank in one
    process), or real ranks (`torch`: one process per rank, torch.distributed), which only a
    worker with the devices claims (`backend/devices.py`)."""

    backend: Literal["simulated", "torch"] = Field(
        default="simulated", description="simulated (any worker) or torch (real ranks)."
    )
    nproc: int | None = Field(
        default=None, ge=1, le=4096, description="torch: ranks, the plan's mesh size (the default)."
    )
    device: Literal["cpu", "cuda"] | None = Field(
        default=None, description="torch: where the ranks run (default cpu, gloo)."
    )


class VerificationCreate(VerifyOn):
    """Verify a plan: one training step distributed against one device."""

    plan_id: RowId
    compute_dtype: Literal["float64", "float32", "bfloat16"] = Field(
        "float64",
        description="float64 | float32 | bfloat16: the model's own mixed precision (bf16 "
        "values, fp32 master weights and moments) on real ranks (backend torch), each op "
        "checked against itself computed exactly.",
    )
    twin: bool = Field(
        True,
        description="A model too large to verify here (its run would hold more than the "
        "worker's limit) is verified as a scaled-down twin: the same mesh, templates and "
        "placements with fewer layers and smaller sizes; the report's summary.twin says what "
        "changed. false: such a model is refused (422 naming plan_id).",
    )


class VerificationOut(BaseModel):
    """A verification, its job's state and, once done, its report."""

    id: int
    plan_id: RowId
    compute_dtype: str
    backend: str = Field("simulated", description="simulated | torch")
    nproc: int | None = Field(None, description="torch: ranks.")
    device: str | None = Field(None, description="torch: cpu | cuda.")
    job_id: int
    status: JobStatus
    progress: float
    message: str
    error: dict[str, Any] | None
    report: dict[str, Any] | None = Field(description="ok, first_divergence, checks ...")
    created_at: str | None


class MeasurementCreate(_Request):
    """Measure a built, costed plan's step on real torch ranks (one process per rank) and
    compare it with the cost model's prediction; only a worker with the devices claims it."""

    steps: int = Field(default=5, ge=1, le=20, description="Steps timed (after one warm-up).")
    nproc: int | None = Field(
        default=None, ge=1, le=4096, description="Ranks: the plan's mesh size (the default)."
    )
    device: Literal["cpu", "cuda"] = Field(
        default="cpu", description="Where the ranks run (cpu: gloo ranks; cuda: CUDA devices)."
    )


class MeasurementCreated(BaseModel):
    """A queued measurement: its job (follow it at /api/jobs/{job_id}); once it succeeded the
    plan's `measured` view holds the result."""

    plan_id: int
    job_id: int
    status: JobStatus
    requires: dict[str, Any] = Field(description="{device, nproc} a worker must have.")


class ComparisonCreate(_Request):
    """Compare plan B against plan A (deltas are B - A)."""

    plan_a_id: RowId
    plan_b_id: RowId


class ComparisonOut(BaseModel):
    """A comparison, its job's state and, once done, the result."""

    id: int
    plan_a_id: RowId
    plan_b_id: RowId
    job_id: int
    status: JobStatus
    progress: float
    message: str
    error: dict[str, Any] | None
    result: dict[str, Any] | None = Field(description="Comparison.to_json() once done.")
    created_at: str | None


class SearchCreate(_Request):
    """Search the strategies of a stored model (made from a preset) on a cluster."""

    model_id: RowId
    cluster: str = Field(
        min_length=1,
        max_length=100,
        description="Cluster preset (e.g. 'h100-sxm-8x8') or a team cluster's name.",
    )
    gpus: int | None = Field(None, ge=1, le=1_000_000, description="Default: every device.")
    global_batch: int | None = Field(
        None, ge=1, le=10_000_000, description="Sequences per step (default: the model's)."
    )
    memory_headroom: float = Field(0.1, ge=0.0, lt=1.0, description="Share kept free.")
    max_tp: int | None = Field(None, ge=1, le=1_000_000)
    min_dp: int = Field(1, ge=1, le=1_000_000)
    cross_node_tp: bool = False


class SearchPlanCreate(_Request):
    """Build one of a search's ranked candidates as a plan."""

    candidate: int = Field(ge=0, le=100_000, description="The candidate's rank, from 0.")


class SearchOut(BaseModel):
    """A search, its job's state and, once done, its result: `candidates` ranked (fitting
    first, then by step time), `pareto` (indices of the front of step time against peak
    memory), `pruned` meshes with their reasons, `why` the winner won."""

    id: int
    model_id: RowId
    cluster: str
    request: dict[str, Any]
    job_id: int
    status: JobStatus
    progress: float
    message: str
    error: dict[str, Any] | None
    result: dict[str, Any] | None
    created_at: str | None


class CheckBudgets(_Request):
    """What the plan must meet (`shardlab.check`); a budget left out is not judged."""

    must_fit: bool = Field(default=True, description="Peak memory per rank within the cluster's.")
    max_step_time_s: float | None = Field(
        default=None, ge=0, description="Most predicted step seconds."
    )
    max_regression_pct: float | None = Field(
        default=None, ge=0, description="Most percent slower than the baseline plan (needs one)."
    )
    max_fallback_ops: int | None = Field(
        default=None, ge=0, description="Most fallback-placed ops."
    )
    min_mfu: float | None = Field(default=None, ge=0, le=1, description="Least MFU, a fraction.")
    verify: bool = Field(
        default=False,
        description="Verify one training step on the simulated mesh against one device "
        "(refused for models too large to verify: `shardlab.check.verification_bytes`).",
    )


class CheckModel(_Request):
    """A check's model by preset: the team's model of the same preset and overrides is
    reused, else one is stored (named e.g. 'llama3-8b (layers=4)')."""

    preset: str = Field(
        min_length=1, max_length=100, description="Preset name, e.g. 'llama3-8b' (GET /api/presets)"
    )
    overrides: dict[str, Any] = Field(
        default_factory=dict, description="Preset settings to change, e.g. {'layers': 2}."
    )


class CheckStrategy(_Request):
    """A check's strategy inline: the latest version of `name` is reused when identical, a
    differing one adds the next version, a new name gets version 1."""

    name: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="The strategy's name (default: from mesh and templates, "
        "e.g. 'dp=8,tp=8 dp+megatron_tp').",
    )
    mesh: str = Field(min_length=1, max_length=200, description="Mesh, e.g. 'dp=2,tp=4'.")
    templates: list[str] = Field(
        default_factory=list, description="Templates on mesh axes, e.g. ['megatron_tp:tp']."
    )
    annotations: list[str] = Field(
        default_factory=list, description="Annotations, e.g. ['tokens=dp:S(0)']."
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="Options, as POST /api/strategies takes them."
    )


class CheckCreate(_Request):
    """Check a model under a strategy version on a cluster against budgets. The model is one
    of `model_id` (stored), `model` (a preset with overrides) or `graph` (a graph document);
    the strategy one of `strategy_id` (stored) or `strategy` (inline). What a check names
    inline is stored with it (or reused), so a fresh team checks with only a token."""

    model_id: RowId | None = Field(None, description="A stored model of the team.")
    model: CheckModel | None = Field(None, description="A preset with overrides.")
    graph: dict[str, Any] | None = Field(
        None, description="A graph document in the 'shardlab.graph/1' format."
    )
    strategy_id: RowId | None = Field(None, description="A stored strategy version.")
    strategy: CheckStrategy | None = Field(None, description="A strategy given inline.")
    cluster: str = Field(min_length=1, max_length=100, description="Cluster preset or name.")
    baseline_plan_id: RowId | None = Field(
        None, description="A built plan of the team: the step max_regression_pct compares with."
    )
    baseline: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="A baseline of the team by name (instead of baseline_plan_id). With "
        "neither, max_regression_pct compares with the baseline of the model on the cluster.",
    )
    budgets: CheckBudgets = Field(default_factory=lambda: CheckBudgets())
    verify_on: VerifyOn | None = Field(
        None,
        description="With budgets.verify: where the verification runs (default: simulated).",
    )


class CheckCreated(Created):
    """A queued check, with the model and strategy version it plans (stored or reused)."""

    model_id: int
    strategy_id: int


class CheckOut(BaseModel):
    """A check, its plan job's state and, once the plan is built, the verdict: every budget
    with its limit, the plan's figure and pass or fail; the Markdown for a pull request."""

    id: int
    plan_id: int
    model_id: int = Field(description="The model planned (given, or stored or reused).")
    strategy_id: int = Field(description="The strategy version planned (likewise).")
    baseline_plan_id: int | None
    budgets: dict[str, Any]
    job_id: int
    verification_id: int | None = Field(description="With budgets.verify: its verification.")
    status: JobStatus = Field(description="Of the plan's job and, with verify, the verification's.")
    progress: float
    message: str
    error: dict[str, Any] | None = Field(description="{code, message, detail} of a failed plan.")
    passed: bool | None = Field(description="None until the plan is built.")
    verdict: dict[str, Any] | None
    markdown: str | None
    plan_url: str = Field(description="The plan in the UI (a path on this server).")
    created_at: str | None
