"""Find a strategy in the browser: a search runs with live progress, its candidates show as a
scatter of step time against memory with the Pareto front, and a click builds a plan."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.ui.conftest import TINY_LLAMA, Server, screenshot
from tests.ui.refusals import refusing_page


@pytest.fixture
def page(browser: Browser, server: Server, storage_state: str) -> Iterator[Page]:
    """A logged-in page that lets the 422 answer the bad search provokes through."""
    yield from refusing_page(browser, server, storage_state)


def _model(server: Server) -> int:
    models = {m["name"]: m["id"] for m in server.api("GET", "/api/models")}
    if "ui-search-tiny" not in models:
        body = {"name": "ui-search-tiny", "preset": "llama3-8b", "overrides": TINY_LLAMA}
        models["ui-search-tiny"] = server.api("POST", "/api/models", body)["id"]
    return int(models["ui-search-tiny"])


def test_a_search_runs_and_a_click_builds_the_plan(page: Page, server: Server) -> None:
    model_id = _model(server)
    page.goto("/#/search")
    page.get_by_role("link", name="Find a strategy").wait_for()
    page.get_by_label("Model").select_option(str(model_id))
    page.get_by_label("Cluster").fill("h100-sxm-1x4")
    page.get_by_role("button", name="Search").click()
    plot = page.locator("#search-plot")
    expect(plot.locator(".scatterlayer")).to_be_attached(timeout=120_000)
    search_id = int(re.search(r"id=(\d+)", page.url).group(1))  # type: ignore[union-attr]
    result = server.api("GET", f"/api/searches/{search_id}")["result"]
    expect(page.locator("#search-summary")).to_contain_text(
        f"{result['planned']} candidates planned"
    )
    expect(page.locator("#search-summary")).to_contain_text(
        f"({len(result['candidates'])} distinct plans)"
    )
    twins = [(i, c["same_plan"]) for i, c in enumerate(result["candidates"][:15]) if c["same_plan"]]
    rows = page.get_by_role("table", name="ranked candidates").locator("tbody tr")
    for i, same in twins:  # each recipe with an identical plan is listed in its row
        for twin in same:
            expect(rows.nth(i)).to_contain_text(f"same plan: {twin['label']}")
    assert page.locator(".same-plan").count() == sum(len(s) for _, s in twins)
    names = page.evaluate("() => document.getElementById('search-plot').data.map(t => t.name)")
    assert "Pareto front" in names
    assert {c["mesh"] for c in result["candidates"] if c["fits"]} <= set(names)
    expect(page.locator("#search-why")).to_contain_text(
        "winner: " + result["candidates"][0]["label"]
    )
    rows = page.get_by_role("table", name="ranked candidates").locator("tbody tr")
    expect(rows.first).to_contain_text(result["candidates"][0]["label"])
    screenshot(page, "search")

    # a permalink opens the finished search
    page.reload()
    expect(page.locator("#search-summary")).to_be_visible()
    rows.first.get_by_role("button", name="Build this plan").click()
    expect(page).to_have_url(re.compile(r"#/plans/\d+$"), timeout=30_000)
    plan_id = int(page.url.rsplit("/", 1)[1])
    plan = server.api("GET", f"/api/plans/{plan_id}")
    strategy = server.api("GET", f"/api/strategies/{plan['strategy_id']}")
    assert strategy["mesh"] == result["candidates"][0]["mesh"]
    assert plan["cluster"] == "h100-sxm-1x4"


def test_a_bad_search_names_the_field(page: Page, server: Server) -> None:
    model_id = _model(server)
    page.goto("/#/search")
    page.get_by_label("Model").select_option(str(model_id))
    page.get_by_label("Cluster").fill("h100-sxm-1x4")
    page.get_by_label("GPUs").fill("9")
    page.get_by_role("button", name="Search").click()
    expect(page.get_by_text("gpus 9 is more than the 4 devices")).to_be_visible()
