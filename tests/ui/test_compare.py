"""The compare view: two built plans side by side, per-scope deltas, placements that differ."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.ui.conftest import TINY_LLAMA, Server, create_plan, fmt_time, screenshot
from tests.ui.refusals import error_of, refusing_page


def fmt_percent(fraction: float) -> str:
    """ui.js fmtPercent."""
    return f"{fraction * 100:.1f}%"


@pytest.fixture
def page(browser: Browser, server: Server, storage_state: str) -> Iterator[Page]:
    """A logged-in page that lets the 422 answers these tests provoke through."""
    yield from refusing_page(browser, server, storage_state)


@pytest.fixture(scope="module")
def plans(server: Server) -> tuple[dict[str, Any], dict[str, Any]]:
    """Plan A: the tiny llama under dp=4; plan B: under dp=2 x tp=2; both on one H100 node."""
    a = create_plan(server, "compare-tiny",
                    {"name": "compare-dp4", "mesh": "dp=4", "templates": ["dp"]},
                    "h100-sxm-1x4", TINY_LLAMA)  # fmt: skip
    b = create_plan(server, "compare-tiny",
                    {"name": "compare-dp2-tp2", "mesh": "dp=2,tp=2",
                     "templates": ["dp", "megatron_tp"]},
                    "h100-sxm-1x4", TINY_LLAMA)  # fmt: skip
    return a, b


def test_compare_two_plans(page: Page, server: Server, plans: tuple[dict[str, Any], ...]) -> None:
    a, b = plans
    page.goto("/#/compare")
    page.get_by_label("Plan A (baseline)").select_option(str(a["id"]))
    page.get_by_label("Plan B (compared with A)").select_option(str(b["id"]))
    page.get_by_role("button", name="Compare").click()
    expect(page).to_have_url(re.compile(rf"#/compare\?a={a['id']}&b={b['id']}$"))

    # headline: the step times and MFU of the plans' own summaries
    headline = page.get_by_role("table", name="headline")
    ca, cb = a["summary"]["cost"], b["summary"]["cost"]
    step = headline.locator('tr[data-name="step time (s)"]')
    expect(step.locator('[data-col="a"]')).to_have_text(fmt_time(ca["step_time_s"]), timeout=60_000)
    expect(step.locator('[data-col="b"]')).to_have_text(fmt_time(cb["step_time_s"]))
    faster = cb["step_time_s"] < ca["step_time_s"]
    expect(step).to_contain_text("better" if faster else "worse")
    mfu = headline.locator('tr[data-name="MFU"]')
    expect(mfu.locator('[data-col="a"]')).to_have_text(fmt_percent(ca["mfu"]))
    expect(mfu.locator('[data-col="b"]')).to_have_text(fmt_percent(cb["mfu"]))
    expect(page.get_by_role("table", name="memory")).to_contain_text("peak")
    expect(page.get_by_role("table", name="collectives")).to_contain_text("all_reduce")

    # per-scope deltas: a Plotly chart with a compute and a comm trace over the layer scopes
    chart = page.locator("#scope-chart")
    expect(chart.locator(".barlayer .trace")).to_have_count(2)
    traces = chart.evaluate("el => el.data.map((t) => [t.type, t.orientation, t.y])")
    assert [t[:2] for t in traces] == [["bar", "h"], ["bar", "h"]]
    assert "layers.0" in traces[0][2] and "layers.1" in traces[0][2]
    expect(page.get_by_text("Faster in B:")).to_be_visible()

    # placements that differ, each linked to plan B's graph and sharding views
    rows = page.get_by_role("table", name="placements that differ").locator("tbody tr")
    expect(rows.first).to_be_visible()
    value = rows.first.get_attribute("data-value")
    assert value
    for view in ("graph", "sharding"):
        href = rows.first.get_by_role("link", name=re.compile(view)).get_attribute("href") or ""
        prefix = f"#/plans/{b['id']}/{view}?value="
        assert href.startswith(prefix) and unquote(href[len(prefix) :]) == value, href
    screenshot(page, "compare")


def test_a_permalink_shows_the_comparison_again_without_a_new_job(
    page: Page, server: Server, plans: tuple[dict[str, Any], ...]
) -> None:
    a, b = plans
    page.goto(f"/#/compare?a={a['id']}&b={b['id']}")
    before = len(server.api("GET", "/api/comparisons"))
    expect(page.get_by_label("Plan A (baseline)")).to_have_value(str(a["id"]))
    step = page.get_by_role("table", name="headline").locator('tr[data-name="step time (s)"]')
    expect(step.locator('[data-col="a"]')).to_have_text(fmt_time(a["summary"]["cost"]["step_time_s"]),
                                                         timeout=60_000)  # fmt: skip
    assert len(server.api("GET", "/api/comparisons")) == before


def test_a_plan_against_itself_is_refused_next_to_plan_b(
    page: Page, server: Server, plans: tuple[dict[str, Any], ...]
) -> None:
    a, _ = plans
    page.goto("/#/compare")
    page.get_by_label("Plan A (baseline)").select_option(str(a["id"]))
    page.get_by_label("Plan B (compared with A)").select_option(str(a["id"]))
    page.get_by_role("button", name="Compare").click()
    plan_b = page.get_by_label("Plan B (compared with A)")
    expect(plan_b).to_have_attribute("aria-invalid", "true")
    expect(error_of(page, plan_b)).to_contain_text("compare two different plans")
    expect(page.get_by_role("table", name="headline")).to_have_count(0)


def test_contents_and_readable_strategy_names(
    page: Page, plans: tuple[dict[str, Any], ...]
) -> None:
    a, b = plans
    page.goto(f"/#/compare?a={a['id']}&b={b['id']}")
    toc = page.get_by_role("navigation", name="comparison contents")
    expect(toc).to_be_visible(timeout=60_000)
    names = toc.get_by_role("link").all_text_contents()
    assert names[0] == "Headline" and "Placements that differ" in names, names
    # each link scrolls to its section; the URL (the router's hash) stays
    url = page.url
    toc.get_by_role("link", name="Placements that differ").click()
    section = page.get_by_role("region", name=re.compile("^Placements that differ"))
    expect(section).to_be_in_viewport()
    assert page.url == url
    expect(toc).to_be_in_viewport()  # it stays at the top
    toc.get_by_role("link", name="Headline").click()
    expect(page.get_by_role("region", name="Headline")).to_be_in_viewport()
    for link in toc.get_by_role("link").all():
        target = link.get_attribute("href") or ""
        assert page.locator(target).count() == 1, target

    # strategies auto-named with a time stamp by older forms read as mesh and templates
    shown = page.evaluate(
        """async () => {
        const { strategyText } = await import("/views/compare.js");
        return [
            strategyText({name: "dp=8,tp=8 dp+megatron_tp @ 2026-11-20 10:31:07.412",
                          mesh: "dp=8,tp=8", templates: ["dp", "megatron_tp"], version: 1}),
            strategyText({name: "mine", mesh: "dp=2", templates: ["dp"], version: 3}),
        ];
    }"""
    )
    assert shown == ["dp=8,tp=8 dp+megatron_tp", "mine v3"]
    options = page.get_by_label("Plan A (baseline)").locator("option").all_text_contents()
    assert not any(re.search(r" @ \d{4}-", o) for o in options), options
