"""Timeline view: bars per rank x stream on a numeric time axis, stage and rank selectors,
zoom recorded in the URL and a permalink that opens zoomed."""

from __future__ import annotations

import re
from itertools import pairwise
from typing import Any
from urllib.parse import parse_qs, urlsplit

from playwright.sync_api import Page, expect

from tests.ui.conftest import TINY_LLAMA, Server, create_plan, fmt_time, screenshot


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


def _drag_zoom(page: Page, frac0: float, frac1: float) -> None:
    """A real mouse drag across the plot area, from frac0 to frac1 of its width."""
    layer = page.locator("#timeline-plot .nsewdrag").first
    box = layer.bounding_box()
    assert box is not None
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * frac0, y)
    page.mouse.down()
    for k in range(1, 11):
        frac = frac0 + (frac1 - frac0) * k / 10
        page.mouse.move(box["x"] + box["width"] * frac, y)
    page.mouse.up()


def test_a_drag_zoom_records_the_window_and_reloading_restores_it(
    page: Page, server: Server, built_plan: dict[str, Any]
) -> None:
    plan_id = built_plan["id"]
    page.goto(f"/#/plans/{plan_id}/timeline")
    expect(page.locator("#timeline-plot .barlayer").first).to_be_visible()
    _drag_zoom(page, 0.3, 0.6)
    expect(page).to_have_url(re.compile(r"[?&]t0=.*[?&]t1=|[?&]t1=.*[?&]t0="))
    query = _query(page)
    t0, t1 = float(query["t0"]), float(query["t1"])
    assert t1 > t0 >= 0
    url = page.url
    page.goto("about:blank")
    page.goto(url)
    expect(page.locator("#timeline-plot .barlayer").first).to_be_visible()
    lo, hi = _figure(page)["range"]
    assert abs(lo - t0 * 1e3) < 1e-9 * max(1.0, abs(lo)) + 1e-12
    assert abs(hi - t1 * 1e3) < 1e-9 * max(1.0, abs(hi)) + 1e-12


def test_time_per_op_kind_table(page: Page, server: Server, built_plan: dict[str, Any]) -> None:
    plan_id = built_plan["id"]
    api = server.api("GET", f"/api/plans/{plan_id}/timeline")
    step = api["step_time_s"]
    page.goto(f"/#/plans/{plan_id}/timeline")
    section = page.get_by_label("time per op kind")
    expect(section.locator("table.kind-stats")).to_have_count(len(api["ranks"]))
    for rank in api["ranks"]:
        table = section.locator(f"table.kind-stats[data-rank='{rank['rank']}']")
        rows = table.locator("tbody tr")
        expect(rows).to_have_count(len(rank["kinds"]))
        totals = [
            float(v)
            for v in rows.locator("td[data-seconds]").evaluate_all(
                "cells => cells.map(c => c.dataset.seconds)"
            )
        ]
        assert totals[0] == max(totals) and totals == sorted(totals, reverse=True)
        shares = [
            float(v)
            for v in rows.locator("td[data-share]").evaluate_all(
                "cells => cells.map(c => c.dataset.share)"
            )
        ]
        busy = sum(e["busy"] for e in api["events"] if e["rank"] == rank["rank"]) / step
        assert abs(sum(shares) - busy) < 1e-6 * max(1.0, busy)
        top = max(rank["kinds"], key=lambda k: k["busy_s"])
        expect(rows.first).to_have_attribute("data-kind", top["kind"])
        expect(rows.first.locator("td").nth(2)).to_have_text(f"{top['count']:,}")


def test_lanes_say_which_ranks_each_role_stands_for(
    page: Page, server: Server, built_plan: dict[str, Any]
) -> None:
    plan_id = built_plan["id"]
    api = server.api("GET", f"/api/plans/{plan_id}/timeline")
    page.goto(f"/#/plans/{plan_id}/timeline")
    expect(page.locator("#timeline-plot .barlayer").first).to_be_visible()
    ticks = page.evaluate("() => document.getElementById('timeline-plot').layout.yaxis.ticktext")
    labels = page.locator("#timeline-plot .ytick text").all_text_contents()
    for rank in api["ranks"]:
        ranks = rank["stands_for"]
        text = (
            f"rank {ranks[0]}"
            if len(ranks) == 1
            else "ranks "
            + (
                f"{ranks[0]}–{ranks[-1]}"
                if ranks == list(range(ranks[0], ranks[-1] + 1))
                else ", ".join(map(str, ranks))
            )
        )
        wanted = f"rank {rank['rank']} (for {text}) · compute"
        assert wanted in ticks, (wanted, ticks)
        assert any(label.startswith(f"rank {rank['rank']} (for rank") for label in labels)


def test_a_plan_with_several_roles_labels_each_lane(page: Page, server: Server) -> None:
    """Three devices a node: some tp and dp pairs cross nodes, so ranks differ in role."""
    strategy = {"name": "ui-roles", "mesh": "dp=2,tp=2", "templates": ["dp", "megatron_tp"]}
    plan = create_plan(server, "ui-tiny", strategy, "h100-sxm-2x3", TINY_LLAMA)
    api = server.api("GET", f"/api/plans/{plan['id']}/timeline")
    assert len(api["ranks"]) > 1, api["ranks"]
    page.goto(f"/#/plans/{plan['id']}/timeline")
    expect(page.locator("#timeline-plot .barlayer").first).to_be_visible()
    ticks = page.evaluate("() => document.getElementById('timeline-plot').layout.yaxis.ticktext")
    for rank in api["ranks"]:
        assert f"rank {rank['rank']} (for rank {rank['rank']}) · compute" in ticks, ticks
    expect(page.locator("table.kind-stats")).to_have_count(len(api["ranks"]))
    rows = {y for t in _figure(page)["traces"] for y in t["y"]}
    assert {f"rank {r['rank']} · compute" for r in api["ranks"]} <= rows
    screenshot(page, "timeline-roles")


def test_critical_path_and_collective_to_wait_arrows(
    page: Page, server: Server, built_plan: dict[str, Any]
) -> None:
    plan_id = built_plan["id"]
    api = server.api("GET", f"/api/plans/{plan_id}/timeline")
    assert not api["aggregated"]
    page.goto(f"/#/plans/{plan_id}/timeline")
    expect(page.locator("#timeline-plot .barlayer").first).to_be_visible()
    page.get_by_label("Critical path").check()
    page.wait_for_function(
        "() => document.getElementById('timeline-plot').data.some(t => t.name === 'critical path')"
    )
    path = next(t for t in _figure(page)["traces"] if t["name"] == "critical path")
    assert path["n"] > 1
    spans = sorted(zip(path["base"], path["x"], strict=True))
    for (b0, w0), (b1, _) in pairwise(spans):
        assert b1 >= b0 + w0 - 1e-9  # each op starts after the one gating it ends
    last = max(b + w for b, w in spans)
    assert abs(last - api["step_time_s"] * 1e3) < 1e-9 * last + 1e-12
    page.get_by_label("Collective → wait arrows").check()
    page.wait_for_function(
        "() => (document.getElementById('timeline-plot').layout.annotations || []).length > 0"
    )
    arrows = page.evaluate("() => document.getElementById('timeline-plot').layout.annotations")
    assert all(a["ax"] <= a["x"] + 1e-9 for a in arrows)
    assert all(a["ay"] != a["y"] for a in arrows)  # from a comm lane to another lane
    screenshot(page, "timeline-overlays")
    page.get_by_label("Critical path").uncheck()
    page.wait_for_function(
        "() => !document.getElementById('timeline-plot').data.some(t => t.name === 'critical path')"
    )
