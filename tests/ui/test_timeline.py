"""Timeline view: bars per rank x stream on a numeric time axis, stage and rank selectors,
zoom recorded in the URL and a permalink that opens zoomed."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qs, urlsplit

from playwright.sync_api import Page, expect

from tests.ui.conftest import Server, fmt_time, screenshot


def _query(page: Page) -> dict[str, str]:
    fragment = urlsplit(page.url).fragment
    return {k: v[0] for k, v in parse_qs(fragment.partition("?")[2]).items()}


def _figure(page: Page) -> dict[str, Any]:
    data: dict[str, Any] = page.evaluate(
        """() => {
        const el = document.getElementById('timeline-plot');
        return {traces: el.data.map(t => ({name: t.name, n: t.x.length, base: t.base,
                                          x: t.x, y: t.y})),
                range: el.layout.xaxis.range, title: el.layout.xaxis.title.text,
                label: el.getAttribute('aria-label')};
    }"""
    )
    return data


def test_timeline_shows_bars_and_the_step_time(
    page: Page, server: Server, built_plan: dict[str, Any]
) -> None:
    plan_id = built_plan["id"]
    api = server.api("GET", f"/api/plans/{plan_id}/timeline")
    page.goto(f"/#/plans/{plan_id}/timeline")
    plot = page.locator("#timeline-plot")
    expect(plot.locator(".barlayer").first).to_be_visible()
    step = page.locator("#step-time")
    assert float(step.get_attribute("data-seconds") or "nan") == api["step_time_s"]
    expect(step).to_contain_text(fmt_time(api["step_time_s"]))
    expect(page.get_by_role("navigation", name=f"plan {plan_id} views")).to_be_visible()
    expect(page.locator(".tabs a[aria-current=page]")).to_have_text("timeline")
    fig = _figure(page)
    names = {t["name"] for t in fig["traces"]}
    assert {"forward", "backward", "optimizer", "comm", "exposed comm"} <= names
    assert sum(t["n"] for t in fig["traces"] if t["name"] != "exposed comm") == len(api["events"])
    assert fig["title"] == "time in step (ms)"
    ends = [b + w for t in fig["traces"] for b, w in zip(t["base"], t["x"], strict=True)]
    assert max(ends) == api["step_time_s"] * 1e3
    hover = page.evaluate(
        "() => document.getElementById('timeline-plot').data.flatMap(t => t.hovertext)"
    )
    by_name = {e["name"]: e for e in api["events"]}
    with_deps = next(e for e in api["events"] if e["deps"] and e["bytes"])
    text = next(t for t in hover if t.startswith(f"<b>{with_deps['name']}</b>"))
    for part in (with_deps["kind"], with_deps["scope"], "per rank", "after:", with_deps["deps"][0]):
        assert part in text, (part, text)
    assert len(by_name) == len(api["events"])
    rows = {y for t in fig["traces"] for y in t["y"]}
    assert "rank 0 · compute" in rows and any("comm:" in r for r in rows)
    link = page.get_by_role("link", name="Download Chrome trace")
    assert link.get_attribute("href") == f"/api/plans/{plan_id}/trace"
    expect(page.get_by_text("open in Perfetto")).to_be_visible()
    expect(page.get_by_label("Stage (timeline after each pass)")).to_have_value(api["stage"])
    screenshot(page, "timeline")


def test_changing_stage_updates_the_url_and_the_figure(
    page: Page, server: Server, built_plan: dict[str, Any]
) -> None:
    plan_id = built_plan["id"]
    lowered = server.api("GET", f"/api/plans/{plan_id}/timeline?stage=lowered")
    page.goto(f"/#/plans/{plan_id}/timeline")
    expect(page.locator("#timeline-plot .barlayer").first).to_be_visible()
    last = _figure(page)
    page.get_by_label("Stage (timeline after each pass)").select_option("lowered")
    expect(page.locator("#timeline-plot")).to_have_attribute(
        "aria-label", f"timeline of stage lowered: {len(lowered['events'])} bars"
    )
    assert _query(page)["stage"] == "lowered"
    step = page.locator("#step-time")
    assert float(step.get_attribute("data-seconds") or "nan") == lowered["step_time_s"]
    assert _figure(page)["traces"] != last["traces"]
    page.get_by_label("Rank").select_option("0")
    expect(page).to_have_url(re.compile(r"[?&]rank=0\b"))


def test_zoom_records_the_window_and_a_permalink_opens_zoomed(
    page: Page, server: Server, built_plan: dict[str, Any]
) -> None:
    plan_id = built_plan["id"]
    api = server.api("GET", f"/api/plans/{plan_id}/timeline")
    step = api["step_time_s"]
    page.goto(f"/#/plans/{plan_id}/timeline")
    expect(page.locator("#timeline-plot .barlayer").first).to_be_visible()
    lo, hi = step * 0.2e3, step * 0.4e3
    page.evaluate(
        "([lo, hi]) => Plotly.relayout('timeline-plot', {'xaxis.range': [lo, hi]})", [lo, hi]
    )
    expect(page).to_have_url(re.compile(r"[?&]t1="))
    query = _query(page)
    assert float(query["t0"]) == lo / 1e3 and float(query["t1"]) == hi / 1e3

    t0, t1 = step * 0.5, step * 0.6
    window = server.api("GET", f"/api/plans/{plan_id}/timeline?t0={t0}&t1={t1}")
    page.goto(f"/#/plans/{plan_id}/timeline?t0={t0}&t1={t1}")
    expect(page.locator("#timeline-plot")).to_have_attribute(
        "aria-label", f"timeline of stage {api['stage']}: {len(window['events'])} bars"
    )
    fig = _figure(page)
    assert fig["range"] == [t0 * 1e3, t1 * 1e3]
    assert len(window["events"]) < len(api["events"])
    page.get_by_role("button", name="Whole step").click()
    expect(page.locator("#timeline-plot")).to_have_attribute(
        "aria-label", f"timeline of stage {api['stage']}: {len(api['events'])} bars"
    )
    assert "t0" not in _query(page)
    lo, hi = _figure(page)["range"]
    assert lo <= 0 and hi >= step * 1e3
