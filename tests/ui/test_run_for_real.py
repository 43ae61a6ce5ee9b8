"""A plan's "Run for real": shown when a live worker can serve the plan's ranks on the torch
backend (GET /api/workers), it queues a torch-backend verification and shows its outcome."""

from __future__ import annotations

import json
from typing import Any

from playwright.sync_api import Page, Route, expect

from tests.ui.conftest import Server


def test_run_for_real_verifies_on_torch_ranks(
    page: Page, server: Server, built_plan: dict[str, Any]
) -> None:
    live = server.api("GET", "/api/workers")
    assert live and live[0]["devices"]["torch"], live  # `shardlab serve`'s worker
    page.goto(f"/#/plans/{built_plan['id']}")
    page.get_by_role("button", name="Run for real").click()
    expect(page.get_by_text("numerics match on 4 torch ranks (cpu)")).to_be_visible(timeout=90_000)
    [latest, *_] = server.api("GET", "/api/verifications")
    assert (latest["backend"], latest["nproc"], latest["device"]) == ("torch", 4, "cpu")


def test_no_run_for_real_without_a_capable_worker(page: Page, built_plan: dict[str, Any]) -> None:
    def no_workers(route: Route) -> None:
        route.fulfill(status=200, content_type="application/json", body=json.dumps([]))

    page.route("**/api/workers", no_workers)
    page.goto(f"/#/plans/{built_plan['id']}")
    expect(page.get_by_role("button", name="Verify against one device")).to_be_visible()
    expect(page.get_by_role("button", name="Run for real")).to_have_count(0)
