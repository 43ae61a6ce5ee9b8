"""Plans list and a plan's overview: headline figures, collectives that explain themselves,
verification against one device, the Chrome trace link."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from playwright.sync_api import Page, expect

from tests.ui.conftest import Server, screenshot


def fmt_time(seconds: float) -> str:
    """What ui.js fmtTime shows."""
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} µs"


def test_plans_list_shows_the_built_plan(page: Page, built_plan: dict[str, Any]) -> None:
    page.goto("/#/plans")
    row = page.locator(f"tr[data-plan-id='{built_plan['id']}']")
    expect(row).to_contain_text("ui-tiny")
    expect(row).to_contain_text("succeeded")
    expect(row).to_contain_text(fmt_time(built_plan["summary"]["cost"]["step_time_s"]))


def test_plans_list_pages_through_the_plans(
    page: Page, server: Server, built_plan: dict[str, Any]
) -> None:
    """The list shows which plans of how many, and pages to older ones (the page's start
    lives in the URL)."""
    again = {"model_id": built_plan["model_id"], "strategy_id": built_plan["strategy_id"]}
    server.api("POST", "/api/plans", again)  # a second plan, so there is an older page
    total = len(server.api("GET", "/api/plans?limit=1000"))
    assert total >= 2
    page.goto("/#/plans")
    shown = min(total, 50)
    expect(page.locator("#plans-range")).to_have_text(f"Plans 1–{shown} of {total}")
    pager = page.get_by_label("plan pages")
    expect(pager.get_by_role("button", name="Newer")).to_be_disabled()
    page.goto("/#/plans?offset=1")
    expect(page.locator("#plans-range")).to_have_text(f"Plans 2–{min(total, 51)} of {total}")
    expect(page.locator("table[aria-label='plans'] tbody tr")).to_have_count(min(total - 1, 50))
    pager.get_by_role("button", name="Newer").click()
    expect(page).to_have_url("http://" + page.url.split("/")[2] + "/#/plans")
    expect(page.locator("#plans-range")).to_have_text(f"Plans 1–{shown} of {total}")


def test_overview_explains_a_collective_and_verifies(
    page: Page, server: Server, built_plan: dict[str, Any]
) -> None:
    plan_id = built_plan["id"]
    summary = built_plan["summary"]
    page.goto(f"/#/plans/{plan_id}")
    figures = page.get_by_label("headline figures")
    expect(figures).to_contain_text(fmt_time(summary["cost"]["step_time_s"]))
    expect(figures).to_contain_text("fits")
    kinds = page.get_by_label("collectives by kind")
    for kind, entry in summary["collectives"].items():
        expect(kinds).to_contain_text(kind)
        expect(kinds.locator("tr", has_text=kind).locator("td").nth(1)).to_have_text(
            str(entry["count"])
        )

    collectives = server.api("GET", f"/api/plans/{plan_id}/collectives")
    first = collectives[0]
    page.get_by_label("inserted collectives").get_by_role("button").first.click()
    detail = page.locator("#collective-detail")
    expect(detail).to_contain_text(first["reason"])
    expect(detail).to_contain_text(first["name"])
    # a permalink reopens this explanation
    assert f"collective={quote(first['name'], safe='')}" in page.url
    page.reload()
    expect(page.locator("#collective-detail")).to_contain_text(first["reason"])

    href = page.get_by_role("link", name="Download Chrome trace").get_attribute("href")
    assert href == f"/api/plans/{plan_id}/trace"
    screenshot(page, "plan")

    page.get_by_role("button", name="Verify against one device").click()
    expect(page.get_by_text("numerics match")).to_be_visible(timeout=60_000)


def test_overview_filters_collectives_and_shows_long_names_whole(
    page: Page, server: Server, built_plan: dict[str, Any]
) -> None:
    plan_id = built_plan["id"]
    collectives = server.api("GET", f"/api/plans/{plan_id}/collectives")
    page.goto(f"/#/plans/{plan_id}")
    expect(page.locator("h1").first).to_have_text(
        f"Plan {plan_id} · overview · {built_plan['summary']['model']}"
    )
    items = page.get_by_label("inserted collectives").locator("li")
    expect(items).to_have_count(len(collectives))
    longest = max(collectives, key=lambda c: len(c["value"] or c["name"]))
    word = longest["kind"]
    wanted = [
        c
        for c in collectives
        if word.lower()
        in " ".join(
            [c["name"], c["value"] or "", c["kind"], c["reason"], ",".join(c["axes"])]
        ).lower()
    ]
    page.get_by_label("filter collectives").fill(word)
    expect(page.locator("ul.collectives li:visible")).to_have_count(len(wanted))
    page.get_by_label("filter collectives").fill(longest["name"])
    expect(page.locator("ul.collectives li:visible")).to_have_count(1)
    expect(page.locator("#collective-count")).to_have_text(f"1 of {len(collectives)}")
    page.get_by_label("filter collectives").fill("no collective is called this")
    expect(page.locator("ul.collectives li:visible")).to_have_count(0)
    page.get_by_label("filter collectives").fill(longest["name"])
    page.locator("ul.collectives li:visible").get_by_role("button").click()
    detail = page.locator("#collective-detail")
    expect(detail.locator("h3")).to_have_text(longest["name"])
    for el in (detail.locator("h3"), detail.locator("dd").nth(2)):  # the title, the value
        clip = el.evaluate("e => [e.scrollWidth, e.clientWidth]")
        assert clip[0] <= clip[1], clip
    expect(detail.locator("dd").nth(2)).to_have_text(longest["value"] or "–")
