"""Passes view: the stages with their step times, before/after selection in the URL, and
per-layer delta bars."""

from __future__ import annotations

import re
from typing import Any

from playwright.sync_api import Page, expect

from tests.ui.conftest import Server, screenshot


def test_passes_lists_the_stages_and_compares_two(
    page: Page, server: Server, built_plan: dict[str, Any]
) -> None:
    plan_id = built_plan["id"]
    stages = server.api("GET", f"/api/plans/{plan_id}/stages")
    page.goto(f"/#/plans/{plan_id}/passes")
    table = page.get_by_role("table", name="pass stages")
    rows = table.locator("tbody tr")
    expect(rows).to_have_count(len(stages))
    for n, stage in enumerate(stages):
        expect(rows.nth(n)).to_contain_text(stage["name"])
        expect(rows.nth(n)).to_contain_text(stage["message"])
    expect(page.get_by_label("Before", exact=True)).to_have_value("lowered")
    expect(page.get_by_label("After", exact=True)).to_have_value(stages[-1]["name"])
    plot = page.locator("#scope-deltas")
    expect(plot.locator(".barlayer").first).to_be_visible()
    compared = server.api("GET", f"/api/plans/{plan_id}/stages/compare")
    fig = page.evaluate(
        """() => {
        const el = document.getElementById('scope-deltas');
        const t = el.data[0];
        return {orientation: t.orientation, x: t.x, y: t.y, colors: t.marker.color};
    }"""
    )
    assert fig["orientation"] == "h"
    assert fig["y"] == [s["scope"] or "(no scope)" for s in compared["scopes"]]
    assert fig["x"] == [s["delta"] * 1e3 for s in compared["scopes"]]
    for x, color in zip(fig["x"], fig["colors"], strict=True):
        assert color == ("#2e7d32" if x < 0 else "#b3261e" if x > 0 else "#999")
    figures = page.get_by_role("table", name="figures before and after")
    expect(figures).to_contain_text("Before: lowered")
    collectives = page.get_by_role("table", name="collectives before and after")
    expect(collectives).to_contain_text("all_reduce")
    page.get_by_role("heading", name="Before and after").scroll_into_view_if_needed()
    screenshot(page, "passes")

    page.get_by_label("Before", exact=True).select_option(stages[1]["name"])
    expect(page).to_have_url(re.compile(rf"[?&]a={stages[1]['name']}\b"))
    expect(figures).to_contain_text(f"Before: {stages[1]['name']}")

    page.goto(f"/#/plans/{plan_id}/passes?a={stages[2]['name']}&b={stages[1]['name']}")
    expect(page.get_by_label("Before", exact=True)).to_have_value(stages[2]["name"])
    expect(page.get_by_label("After", exact=True)).to_have_value(stages[1]["name"])
    expect(page.get_by_role("table", name="figures before and after")).to_contain_text(
        f"After: {stages[1]['name']}"
    )


def test_a_zero_delta_is_neutral(page: Page, built_plan: dict[str, Any]) -> None:
    """Deltas are coloured by sign: zero (or one too small to show) is neither better nor
    worse."""
    page.goto(f"/#/plans/{built_plan['id']}/passes")
    expect(page.locator("#compare-figures")).to_be_visible()
    classes = page.evaluate(
        """async () => {
        const { delta } = await import("/views/passes.js");
        const { fmtTime } = await import("/ui.js");
        return [0, 1e-13, -1e-13, 2e-6, -2e-6].map((v) => [delta(v, fmtTime).className,
                                                          delta(v, fmtTime).textContent]);
    }"""
    )
    assert classes[0] == ["delta-neutral muted", "±0"]
    assert classes[1][0] == classes[2][0] == "delta-neutral muted"
    assert classes[3] == ["delta-worse", "+2.0 µs"]
    assert classes[4] == ["delta-better", "−2.0 µs"]
    # in the page, no zero-width delta is coloured as a regression
    for cell in page.locator("#compare-figures td span").all():
        text = cell.text_content() or ""
        if re.fullmatch(r"[+−]0(\.0+)? ?\S*", text):
            raise AssertionError(f"a zero delta shown as {text!r}")
