"""Memory view: the breakdown at the peak as stacked bars with the device's capacity, the
live bytes over the step, and the largest buffers."""

from __future__ import annotations

import re
from typing import Any

from playwright.sync_api import Page, expect

from tests.ui.conftest import Server, screenshot

LABELS = ["parameters", "gradients", "optimizer state", "activations", "buffers"]


def test_memory_shows_the_breakdown_and_the_capacity(
    page: Page, server: Server, built_plan: dict[str, Any]
) -> None:
    plan_id = built_plan["id"]
    api = server.api("GET", f"/api/plans/{plan_id}/memory")
    (rank,) = api["ranks"]
    page.goto(f"/#/plans/{plan_id}/memory")
    bars = page.locator("#memory-breakdown")
    expect(bars.locator(".barlayer").first).to_be_visible()
    fig = page.evaluate(
        """() => {
        const el = document.getElementById('memory-breakdown');
        return {traces: el.data.map(t => ({name: t.name, type: t.type, y: t.y})),
                barmode: el.layout.barmode, shapes: el.layout.shapes};
    }"""
    )
    assert fig["barmode"] == "stack"
    assert [t["name"] for t in fig["traces"]] == LABELS
    assert [t["y"][0] for t in fig["traces"]] == [rank["breakdown"][k] for k in LABELS]
    assert sum(t["y"][0] for t in fig["traces"]) == rank["peak_bytes"]
    (line,) = fig["shapes"]
    assert line["y0"] == line["y1"] == api["capacity_bytes"]
    fits = page.locator("p.fits")
    assert int(fits.get_attribute("data-peak") or "0") == rank["peak_bytes"]
    expect(fits).to_contain_text("fits")
    expect(fits).not_to_contain_text("does not fit")
    expect(page.get_by_text(re.compile(r"capacity .* \(above this scale\)"))).to_be_visible()
    table = page.get_by_role("table", name="largest buffers at the peak, rank 0")
    expect(table.locator("tbody tr")).to_have_count(len(rank["largest_buffers"]))
    expect(table).to_contain_text(rank["largest_buffers"][0]["value"])
    expect(page.locator(".memory-series .scatterlayer").first).to_be_visible()
    screenshot(page, "memory")

    page.get_by_label("scale up to the device's capacity").check()
    top = page.evaluate("() => document.getElementById('memory-breakdown').layout.yaxis.range[1]")
    assert top > api["capacity_bytes"]
    page.get_by_label("Stage (memory after each pass)").select_option("lowered")
    expect(page).to_have_url(re.compile(r"[?&]stage=lowered\b"))
    lowered = server.api("GET", f"/api/plans/{plan_id}/memory?stage=lowered")
    expect(page.locator("p.fits")).to_have_attribute(
        "data-peak", str(lowered["ranks"][0]["peak_bytes"])
    )


def test_memory_of_a_plan_without_cluster_says_why(page: Page, server: Server) -> None:
    from tests.ui.conftest import TINY_LLAMA, create_plan

    strategy = {"name": "ui-uncosted", "mesh": "dp=2", "templates": ["dp"]}
    plan = create_plan(server, "ui-tiny", strategy, None, TINY_LLAMA)
    page.goto(f"/#/plans/{plan['id']}/memory")
    expect(page.get_by_role("alert")).to_contain_text("planned without a cluster")
    expect(page.get_by_role("navigation", name=f"plan {plan['id']} views")).to_be_visible()
