"""Page titles and headings: one form for every view ("Plan 2 · sharding · Shardlab")."""

from __future__ import annotations

from typing import Any

from playwright.sync_api import Page, expect


def test_plan_views_share_one_title_form(page: Page, built_plan: dict[str, Any]) -> None:
    plan_id = built_plan["id"]
    for view in ("graph", "sharding", "memory", "passes"):
        page.goto(f"/#/plans/{plan_id}/{view}")
        expect(page.locator("h1").first).to_have_text(f"Plan {plan_id} · {view}")
        expect(page).to_have_title(f"Plan {plan_id} · {view} · Shardlab")
    page.goto(f"/#/plans/{plan_id}/timeline")
    expect(page).to_have_title(f"Plan {plan_id} · timeline · Shardlab")
    page.goto(f"/#/plans/{plan_id}")
    expect(page).to_have_title(f"Plan {plan_id} · overview · Shardlab")


def test_other_views_are_titled_by_their_heading(page: Page, built_plan: dict[str, Any]) -> None:
    for path, heading in (("models", "Models"), ("plans", "Plans"), ("plans/new", "New plan"),
                          ("compare", "Compare plans")):  # fmt: skip
        page.goto(f"/#/{path}")
        expect(page.locator("h1").first).to_have_text(heading)
        expect(page).to_have_title(f"{heading} · Shardlab")
