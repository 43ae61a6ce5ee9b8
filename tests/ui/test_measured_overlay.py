"""The timeline overlays measured on predicted: a plan measured on real torch ranks (the job
really run by `shardlab serve`'s worker) shows its measured op spans as thin bars under the
predicted lanes and the comparison table; "Measure on real ranks" measures it again."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.ui.conftest import TINY_LLAMA, Server, create_plan, fmt_time, screenshot


@pytest.fixture(scope="module")
def measured_plan(server: Server) -> dict[str, Any]:
    """A tiny llama under dp=2, built, then measured on two torch ranks by the worker."""
    strategy = {"name": "ui-measure-dp2", "mesh": "dp=2", "templates": ["dp"]}
    plan = create_plan(server, "ui-measure-tiny", strategy, "h100-sxm-1x4", TINY_LLAMA)
    created = server.api("POST", f"/api/plans/{plan['id']}/measurements", {"steps": 2})
    job = server.wait_job(created["job_id"], timeout_s=120)
    assert job["status"] == "succeeded", job
    return plan


def _plot(page: Page) -> list[dict[str, Any]]:
    traces: list[dict[str, Any]] = page.evaluate(
        """() => document.getElementById('timeline-plot').data.map(t => ({
            name: t.name, n: t.x.length, y: t.y, group: t.legendgroup || null,
            offset: t.offset ?? null}))"""
    )
    return traces


def test_the_measured_spans_lie_under_the_predicted_ones(
    page: Page, server: Server, measured_plan: dict[str, Any]
) -> None:
    plan_id = measured_plan["id"]
    measured = server.api("GET", f"/api/plans/{plan_id}/measured")
    timeline = server.api("GET", f"/api/plans/{plan_id}/timeline")
    page.goto(f"/#/plans/{plan_id}/timeline")
    expect(page.locator("#timeline-plot .barlayer").first).to_be_visible()
    table = page.get_by_role("table", name="predicted against measured", exact=True)
    expect(table).to_be_visible()
    step = next(r for r in measured["rows"] if r["group"] == "step")
    step_row = table.locator("tr[data-group=step]")
    expect(step_row).to_contain_text(fmt_time(step["measured_s"]))
    expect(step_row).to_contain_text(fmt_time(step["predicted_s"]))
    expect(step_row).to_contain_text(f"{step['error_pct']:+.1f}%")
    for name in ("compute", "communication"):
        expect(table.locator("tr[data-group=total]", has_text=name)).to_have_count(1)
    kinds = [r for r in measured["rows"] if r["group"] == "kind"]
    expect(table.locator("tr[data-group=kind]")).to_have_count(len(kinds))
    expect(page.locator("#measured-summary")).to_contain_text("on 2 torch ranks (cpu")

    traces = _plot(page)
    [over] = [t for t in traces if t["group"] == "measured"]
    shown = {r["rank"] for r in timeline["ranks"]}
    spans = sum(len(r["op"]) for r in measured["ranks"] if r["rank"] in shown)
    assert over["n"] == spans > 0 and over["offset"] is not None
    lanes = {f"rank {r} · {s}" for r in shown for s in timeline["streams"]}
    assert set(over["y"]) <= lanes
    predicted = [t for t in traces if t["group"] == "predicted"]
    assert {"forward", "backward", "comm"} <= {t["name"] for t in predicted}
    legend = page.locator("#timeline-plot .legend")
    expect(legend).to_contain_text("predicted")
    expect(legend).to_contain_text("measured")
    link = page.locator("#measured-trace-link")
    assert link.get_attribute("href") == f"/api/plans/{plan_id}/measured/trace"
    screenshot(page, "timeline-measured")


def test_measure_on_real_ranks_measures_again(
    page: Page, server: Server, measured_plan: dict[str, Any]
) -> None:
    plan_id = measured_plan["id"]
    before = server.api("GET", f"/api/plans/{plan_id}/measurements")
    page.goto(f"/#/plans/{plan_id}/timeline")
    button = page.get_by_role("button", name="Measure on real ranks")
    button.click()
    expect(button).to_be_disabled()
    expect(button).to_be_enabled(timeout=90_000)
    expect(page.locator("#measured-status .error")).to_have_count(0)
    after = server.api("GET", f"/api/plans/{plan_id}/measurements")
    assert len(after) == len(before) + 1 and after[0]["status"] == "succeeded"
    assert after[0]["payload"] == {"plan_id": plan_id, "steps": 5, "nproc": 2, "device": "cpu"}
    expect(page.locator("#measured-summary")).to_contain_text("Measured 5 steps")
