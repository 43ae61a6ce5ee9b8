"""Fair claiming on both databases: workers serve the team served least recently first (then
its oldest job), not the oldest job overall, and skip a team running its
`max_running_jobs`; a stale job is still taken over."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from backend import ledger
from backend.auth import ensure_team
from backend.db import make_engine, session_factory, transaction
from backend.orm import Job, Team, TeamLimits, utcnow
from backend.settings import Settings
from tests.api.test_plans import _created, run_jobs, setup_plan

Factory = sessionmaker[Session]


@pytest.fixture
def factory(settings: Settings) -> Iterator[Factory]:
    engine = make_engine(settings.database_url)
    yield session_factory(engine)
    engine.dispose()


def _queue(factory: Factory, settings: Settings, team: str, n: int) -> list[int]:
    """`n` jobs of `team`, queued one after another; their ids."""
    with transaction(factory) as session:
        team_id = ensure_team(session, team).id
        return [ledger.enqueue(session, settings, team_id, "plan", {}).id for _ in range(n)]


def _teams_in_start_order(factory: Factory) -> list[str]:
    with factory() as session:
        rows = session.execute(
            select(Team.name, Job.started_at)
            .join(Job, Job.team_id == Team.id)
            .where(Job.started_at.is_not(None))
            .order_by(Job.started_at, Job.id)
        ).all()
    return [name for name, _ in rows]


def test_a_team_queued_behind_a_long_queue_runs_after_at_most_one_of_its_jobs(
    client: TestClient, other_client: TestClient, settings: Settings, factory: Factory
) -> None:
    """Team alpha queues three plans of a 4-layer llama3-8b on dp=8 x tp=8 (long-ish), then
    beta one tiny plan; one worker runs alpha's first, then beta's, then alpha's others."""
    model = _created(client.post("/api/models", json={
        "name": "l4", "preset": "llama3-8b", "overrides": {"layers": 4, "batch": 64}}))  # fmt: skip
    strategy = _created(client.post("/api/strategies", json={
        "name": "big", "mesh": "dp=8,tp=8", "templates": ["dp", "megatron_tp"]}))  # fmt: skip
    body = {"model_id": model["id"], "strategy_id": strategy["id"], "cluster": "h100-sxm-8x8"}
    alpha = [_created(client.post("/api/plans", json=body))["job_id"] for _ in range(3)]
    beta = setup_plan(other_client, "h100-sxm-1x4")
    beta_job = other_client.get(f"/api/plans/{beta}").json()["job_id"]
    assert max(alpha) < beta_job, "beta's job is the newest"

    assert run_jobs(settings) == 4
    assert _teams_in_start_order(factory) == ["alpha", "beta", "alpha", "alpha"]
    for job_id, who in [(j, client) for j in alpha] + [(beta_job, other_client)]:
        assert who.get(f"/api/jobs/{job_id}").json()["status"] == "succeeded"


def test_claims_go_round_the_teams_least_recently_served_first(
    settings: Settings, factory: Factory
) -> None:
    a = _queue(factory, settings, "a", 3)
    b = _queue(factory, settings, "b", 2)
    c = _queue(factory, settings, "c", 1)
    order = []
    while (job := ledger.claim(factory, settings, "w")) is not None:
        order.append(job.id)
        assert ledger.finish(factory, job.id, "w", {})
    # a, b and c have never been served: oldest job first; then whoever waited longest
    assert order == [a[0], b[0], c[0], a[1], b[1], a[2]]


def test_a_team_at_its_running_limit_is_skipped(settings: Settings, factory: Factory) -> None:
    a = _queue(factory, settings, "a", 4)
    b = _queue(factory, settings, "b", 1)
    with transaction(factory) as session:
        team_a = session.scalar(select(Team.id).where(Team.name == "a"))
        session.add(TeamLimits(team_id=team_a, max_running_jobs=1))

    claims: list[Any] = [ledger.claim(factory, settings, f"w{i}") for i in range(3)]
    assert [job.id if job else None for job in claims] == [a[0], b[0], None], (
        "a runs its limit of one job: its next ones wait although workers are free"
    )
    assert ledger.finish(factory, a[0], "w0", {})
    following = ledger.claim(factory, settings, "w0")
    assert following is not None and following.id == a[1]

    # the default limit is 2 (`team_max_running_jobs`): b may run two at once
    more = _queue(factory, settings, "b", 2)
    assert [getattr(ledger.claim(factory, settings, "w"), "id", None) for _ in range(2)] == [
        more[0],
        None,
    ]


def test_a_stale_job_is_taken_over_even_at_the_running_limit(
    settings: Settings, factory: Factory
) -> None:
    """The running limit counts live jobs only: a job whose worker died (stale heartbeat)
    is taken over, with its attempts counted, as before."""
    (job_id,) = _queue(factory, settings, "a", 1)
    with transaction(factory) as session:
        team_a = session.scalar(select(Team.id).where(Team.name == "a"))
        session.add(TeamLimits(team_id=team_a, max_running_jobs=1))
    first = ledger.claim(factory, settings, "dead")
    assert first is not None and first.id == job_id
    assert ledger.claim(factory, settings, "other") is None
    with transaction(factory) as session:
        old = utcnow() - timedelta(seconds=settings.heartbeat_timeout_s * 2)
        session.execute(update(Job).where(Job.id == job_id).values(heartbeat_at=old))
    taken = ledger.claim(factory, settings, "other")
    assert taken is not None and taken.id == job_id and taken.attempts == 2
    assert taken.worker_id == "other"
