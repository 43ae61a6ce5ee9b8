"""The service's tables (SQLAlchemy 2, typed). Every user-owned row carries `team_id`.

Alembic migrations under `alembic/versions/` create exactly these tables; a test compares
them (`alembic check`-style autogenerate diff must be empty).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    """Declarative base with timezone-aware timestamps."""

    type_annotation_map: ClassVar[dict[Any, Any]] = {
        datetime: DateTime(timezone=True),
        dict[str, Any]: JSON,
    }


class Team(Base):
    __tablename__ = "teams"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class User(Base):
    __tablename__ = "users"
    id: Mapped[int] = mapped_column(primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    #: a team admin: adds people to the team, deletes and revokes anything of it
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    #: a service admin: adds people to any team, sets teams' limits (README "Security")
    is_service_admin: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ApiToken(Base):
    """A bearer token for scripts and CI: only its SHA-256 is stored; shown once on creation."""

    __tablename__ = "api_tokens"
    id: Mapped[int] = mapped_column(primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"), index=True)
    user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    name: Mapped[str] = mapped_column(String(100))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(default=None)
    #: None: never expires
    expires_at: Mapped[datetime | None] = mapped_column(default=None)


class BrowserSession(Base):
    """A logged-in browser: the cookie holds a random id, the table its SHA-256."""

    __tablename__ = "browser_sessions"
    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    session_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime]


class LoginLink(Base):
    """A one-time login link (the first admin's, printed by `shardlab serve`)."""

    __tablename__ = "login_links"
    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    link_hash: Mapped[str] = mapped_column(String(64), unique=True)
    expires_at: Mapped[datetime]
    used_at: Mapped[datetime | None] = mapped_column(default=None)


class Model(Base):
    """A stored serial graph (compressed graph JSON) and its summary."""

    __tablename__ = "models"
    __table_args__ = (UniqueConstraint("team_id", "name"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    source: Mapped[str] = mapped_column(String(20))  # preset | json | upload
    preset: Mapped[str | None] = mapped_column(String(100), default=None)
    overrides: Mapped[dict[str, Any]] = mapped_column(default=dict)
    graph_blob: Mapped[bytes] = mapped_column(LargeBinary)
    summary: Mapped[dict[str, Any]] = mapped_column(default=dict)
    #: who made it (None: a team token, or made before authors were kept)
    author_id: Mapped[int | None] = mapped_column(
        ForeignKey("users.id", ondelete="SET NULL"), default=None
    )
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Strategy(Base):
    """One version of a named strategy; editing creates version + 1 with the same name."""

    __tablename__ = "strategies"
    __table_args__ = (UniqueConstraint("team_id", "name", "version"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    version: Mapped[int] = mapped_column(Integer, default=1)
    mesh: Mapped[str] = mapped_column(String(200))
    templates: Mapped[list[str]] = mapped_column(JSON, default=list)
    annotations: Mapped[list[str]] = mapped_column(JSON, default=list)
    options: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Cluster(Base):
    """A user-defined cluster (same fields as the preset JSON files)."""

    __tablename__ = "clusters"
    __table_args__ = (UniqueConstraint("team_id", "name"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(100))
    spec: Mapped[dict[str, Any]] = mapped_column()
    #: who made it (None: a team token, or made before authors were kept)
    author_id: Mapped[int | None] = mapped_column(
        ForeignKey("users.id", ondelete="SET NULL"), default=None
    )
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Job(Base):
    """The ledger: one unit of work for a worker, and everything about its life."""

    __tablename__ = "jobs"
    __table_args__ = (Index("ix_jobs_claim", "status", "created_at"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(20))  # plan | verify | compare
    #: queued | running | succeeded | failed | cancelled | timed_out
    status: Mapped[str] = mapped_column(String(20), default="queued")
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    message: Mapped[str] = mapped_column(Text, default="")
    payload: Mapped[dict[str, Any]] = mapped_column(default=dict)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer, default=3)
    deadline_s: Mapped[float] = mapped_column(Float, default=3600.0)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    worker_id: Mapped[str | None] = mapped_column(String(100), default=None)
    heartbeat_at: Mapped[datetime | None] = mapped_column(default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
    #: what the job needs of its worker (`backend/devices.py`): `nproc` ranks on "cpu" or
    #: "cuda" (torch-backend verifications); None: any worker
    requires_device: Mapped[str | None] = mapped_column(String(10), default=None)
    requires_nproc: Mapped[int | None] = mapped_column(Integer, default=None)


class WorkerRow(Base):
    """A worker as it last registered (`backend/workers.py`): its devices (`Devices.to_json`)
    and when it was last seen; live while seen within the heartbeat timeout."""

    __tablename__ = "workers"
    id: Mapped[str] = mapped_column(String(100), primary_key=True)
    devices: Mapped[dict[str, Any]] = mapped_column(JSON)
    engine: Mapped[str] = mapped_column(String(20), default="local")
    #: how often `shardlab serve` restarted its worker before this one (0: the first)
    restarts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    seen_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)


class Plan(Base):
    """A plan of a model under one strategy version on a cluster; built by a job."""

    __tablename__ = "plans"
    id: Mapped[int] = mapped_column(primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"), index=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"))
    strategy_id: Mapped[int] = mapped_column(ForeignKey("strategies.id", ondelete="CASCADE"))
    cluster: Mapped[str | None] = mapped_column(String(100), default=None)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"))
    summary: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    #: who asked for it (None: a team token with no user, or made before authors were kept)
    author_id: Mapped[int | None] = mapped_column(
        ForeignKey("users.id", ondelete="SET NULL"), default=None
    )
    #: none | pending | changes_requested | approved (`backend.reviews.review_state`)
    review_state: Mapped[str] = mapped_column(
        String(20), default="none", server_default="none", index=True
    )
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Artifact(Base):
    """A large result stored compressed (zlib JSON): a plan's program, its trace, ..."""

    __tablename__ = "artifacts"
    __table_args__ = (UniqueConstraint("owner", "owner_id", "kind"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"), index=True)
    owner: Mapped[str] = mapped_column(String(20))  # plan | verification | comparison
    owner_id: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(40))  # plan | trace | explain | report ...
    data: Mapped[bytes] = mapped_column(LargeBinary)
    raw_bytes: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Verification(Base):
    """A run of `shardlab.verify` on a plan; built by a job."""

    __tablename__ = "verifications"
    id: Mapped[int] = mapped_column(primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"), index=True)
    plan_id: Mapped[int] = mapped_column(ForeignKey("plans.id", ondelete="CASCADE"))
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"))
    compute_dtype: Mapped[str] = mapped_column(String(20), default="float64")
    report: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Comparison(Base):
    """Two plans side by side (`shardlab.compare`); built by a job."""

    __tablename__ = "comparisons"
    id: Mapped[int] = mapped_column(primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"), index=True)
    plan_a_id: Mapped[int] = mapped_column(ForeignKey("plans.id", ondelete="CASCADE"))
    plan_b_id: Mapped[int] = mapped_column(ForeignKey("plans.id", ondelete="CASCADE"))
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"))
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Search(Base):
    """A strategy search (`shardlab.search`) for a preset model on a cluster; run by a job.
    `request` holds what was asked (model, cluster, GPUs, batch, limits), `result` the
    ranked candidates once done."""

    __tablename__ = "searches"
    id: Mapped[int] = mapped_column(primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"), index=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"))
    cluster: Mapped[str] = mapped_column(String(100))
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"))
    request: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Check(Base):
    """A CI check (`shardlab.check`): a plan built by its job and judged, once built, against
    `budgets`; `baseline_plan_id` is the plan `max_regression_pct` compares with."""

    __tablename__ = "checks"
    id: Mapped[int] = mapped_column(primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"), index=True)
    plan_id: Mapped[int] = mapped_column(ForeignKey("plans.id", ondelete="CASCADE"))
    baseline_plan_id: Mapped[int | None] = mapped_column(
        ForeignKey("plans.id", ondelete="SET NULL"), default=None
    )
    budgets: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    #: with `budgets["verify"]`: the verification of the plan the verdict reads
    verification_id: Mapped[int | None] = mapped_column(
        ForeignKey("verifications.id", ondelete="SET NULL"), default=None
    )
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ReviewRequest(Base):
    """A plan's author (or a member) asked `reviewer_id` to review the plan; `state` is the
    reviewer's latest decision: pending | approved | changes_requested."""

    __tablename__ = "review_requests"
    __table_args__ = (UniqueConstraint("plan_id", "reviewer_id"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"), index=True)
    plan_id: Mapped[int] = mapped_column(ForeignKey("plans.id", ondelete="CASCADE"), index=True)
    reviewer_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    requested_by: Mapped[int | None] = mapped_column(
        ForeignKey("users.id", ondelete="SET NULL"), default=None
    )
    state: Mapped[str] = mapped_column(String(20), default="pending")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    decided_at: Mapped[datetime | None] = mapped_column(default=None)


class ReviewComment(Base):
    """A comment on a plan. A thread's first comment carries the anchor (`anchor`: kind and
    name or time range, see `backend.anchors`); replies point at it with `thread_id`."""

    __tablename__ = "review_comments"
    id: Mapped[int] = mapped_column(primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"), index=True)
    plan_id: Mapped[int] = mapped_column(ForeignKey("plans.id", ondelete="CASCADE"), index=True)
    thread_id: Mapped[int | None] = mapped_column(
        ForeignKey("review_comments.id", ondelete="CASCADE"), default=None
    )
    author_id: Mapped[int | None] = mapped_column(
        ForeignKey("users.id", ondelete="SET NULL"), default=None
    )
    anchor: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    body: Mapped[str] = mapped_column(Text)
    resolved_at: Mapped[datetime | None] = mapped_column(default=None)
    resolved_by: Mapped[int | None] = mapped_column(
        ForeignKey("users.id", ondelete="SET NULL"), default=None
    )
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ReviewEvent(Base):
    """The review history of a plan, one row per event: requested, commented, replied,
    resolved, reopened, approved, changes_requested, comment_deleted, baseline_set."""

    __tablename__ = "review_events"
    id: Mapped[int] = mapped_column(primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"), index=True)
    plan_id: Mapped[int] = mapped_column(ForeignKey("plans.id", ondelete="CASCADE"), index=True)
    actor_id: Mapped[int | None] = mapped_column(
        ForeignKey("users.id", ondelete="SET NULL"), default=None
    )
    kind: Mapped[str] = mapped_column(String(30))
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Baseline(Base):
    """A named reference plan of the team: an approved plan of `model_id` on `cluster`. New
    strategy versions and checks are compared with it. The default name is the model's and
    cluster's (`backend.baselines.default_name`)."""

    __tablename__ = "baselines"
    __table_args__ = (UniqueConstraint("team_id", "name"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    plan_id: Mapped[int] = mapped_column(ForeignKey("plans.id", ondelete="CASCADE"))
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"))
    cluster: Mapped[str] = mapped_column(String(100))
    set_by: Mapped[int | None] = mapped_column(
        ForeignKey("users.id", ondelete="SET NULL"), default=None
    )
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class TeamLimits(Base):
    """An admin's limits for one team; a None field falls back to the service's default
    (`Settings`). Read by the API (queue, rate) and the workers (running jobs, deadline,
    memory)."""

    __tablename__ = "team_limits"
    team_id: Mapped[int] = mapped_column(
        ForeignKey("teams.id", ondelete="CASCADE"), primary_key=True
    )
    max_running_jobs: Mapped[int | None] = mapped_column(Integer, default=None)
    max_queued_jobs: Mapped[int | None] = mapped_column(Integer, default=None)
    requests_per_minute: Mapped[int | None] = mapped_column(Integer, default=None)
    job_deadline_s: Mapped[float | None] = mapped_column(Float, default=None)
    job_memory_bytes: Mapped[int | None] = mapped_column(BigInteger, default=None)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class IdempotencyKey(Base):
    """A create request made with an `Idempotency-Key` header: a retry with the same key and
    body gets the stored answer; the same key with another body is a 409."""

    __tablename__ = "idempotency_keys"
    __table_args__ = (UniqueConstraint("team_id", "key"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"), index=True)
    key: Mapped[str] = mapped_column(String(200))
    #: "POST /api/plans"
    route: Mapped[str] = mapped_column(String(200))
    #: SHA-256 of the request body
    request_hash: Mapped[str] = mapped_column(String(64))
    status_code: Mapped[int] = mapped_column(Integer)
    response: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
