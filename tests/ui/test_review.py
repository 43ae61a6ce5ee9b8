"""A plan's review in Chromium, by two people: the author asks for a review; the reviewer
finds it under "Waiting for my review" and comments on an op in the graph view; the author
sees the comment on the plan, follows its permalink back to the op and resolves it; the
reviewer approves; the plan becomes the baseline, and a new plan of the model shows the
comparison with it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.ui.conftest import Server, screenshot

OP = "layers.0.attn.sdpa"


def _admin_fetch(page: Page, method: str, path: str, body: Any = None) -> Any:
    """Call the API from `page` with its session cookie (the admin's, or a user's)."""
    return page.evaluate(
        """async ([method, path, body]) => {
          const r = await fetch(path, {method, headers: {"Content-Type": "application/json"},
                                       body: body === null ? undefined : JSON.stringify(body)});
          const data = await r.json();
          if (!r.ok) throw new Error(`${r.status} ${JSON.stringify(data)}`);
          return data;
        }""",
        [method, path, body],
    )


@pytest.fixture(scope="module")
def people(browser: Browser, server: Server, storage_state: str) -> Iterator[dict[str, Page]]:
    """Alice and Rob of team default, each logged in through their own one-time link (made
    by the admin) in their own browser context, for this module's tests; console errors
    fail them."""
    admin = browser.new_context(storage_state=storage_state, base_url=server.url)
    page = admin.new_page()
    page.goto("/#/models")
    tabs: dict[str, Page] = {}
    problems: list[str] = []
    contexts = []
    for name in ("alice", "rob"):
        made = _admin_fetch(page, "POST", "/api/admin/users", {"name": name, "team": "default"})
        context = browser.new_context(base_url=server.url, viewport={"width": 1400, "height": 900})
        contexts.append(context)
        tab = context.new_page()
        tab.on("console", lambda m, n=name: problems.append(f"{n}: {m.text}")
               if m.type == "error" else None)  # fmt: skip
        tab.on("pageerror", lambda exc, n=name: problems.append(f"{n}: {exc}"))
        tab.goto(made["login_link"])
        tab.locator("#whoami").filter(has_text=f"{name} · team default").wait_for()
        tabs[name] = tab
    admin.close()
    yield tabs
    for context in contexts:
        context.close()
    assert problems == [], problems


def test_review_comment_permalink_resolve_approve_baseline(
    people: dict[str, Page], server: Server, built_plan: dict[str, Any]
) -> None:
    alice, rob = people["alice"], people["rob"]
    # Alice plans the tiny llama (she is its author) and asks Rob for a review
    ask = {"model_id": built_plan["model_id"], "strategy_id": built_plan["strategy_id"],
           "cluster": "h100-sxm-1x4"}  # fmt: skip
    created = _admin_fetch(alice, "POST", "/api/plans", ask)
    assert server.wait_job(created["job_id"])["status"] == "succeeded"
    plan = created["id"]
    alice.goto(f"/#/plans/{plan}")
    review = alice.get_by_label("review", exact=True)
    expect(review.locator(".review-badge")).to_have_text("no review")
    review.get_by_label("reviewer to ask").select_option("rob")
    review.get_by_role("button", name="Request review").click()
    expect(review.locator(".review-badge")).to_have_text("review pending")

    # Rob finds it waiting for his review, opens the op in the graph and comments on it
    rob.goto("/#/plans?show=waiting")
    expect(rob.get_by_role("link", name=re.compile(r"Waiting for my review \(1\)"))).to_be_visible()
    rob.locator(f"tr[data-plan-id='{plan}'] a").first.click()
    expect(rob).to_have_url(re.compile(rf"#/plans/{plan}$"))
    rob.goto(f"/#/plans/{plan}/graph?scope=layers.0.attn")
    expect(rob.locator(".gr-box svg")).to_have_attribute("data-state", "ready")
    rob.locator(f'.gr-node[data-id="{OP}"]').click()
    expect(rob).to_have_url(re.compile(rf"op={re.escape(OP)}"))
    panel = rob.get_by_label("review", exact=True)
    box = panel.get_by_label("new comment")
    box.click()
    expect(panel.get_by_label("comment on")).to_contain_text(f"on op {OP} (selected)")
    box.fill("Why does attention not shard its heads here?")
    panel.get_by_role("button", name="Add comment").click()
    thread = panel.locator(".review-thread").first
    expect(thread.get_by_role("link", name=f"op {OP}")).to_be_visible()
    screenshot(rob, "review")

    # Alice sees the comment on the plan, follows its permalink to the op, and resolves it
    alice.reload()
    review = alice.get_by_label("review", exact=True)
    expect(review).to_contain_text("Why does attention not shard its heads here?")
    review.get_by_role("link", name=f"op {OP}").click()
    expect(alice).to_have_url(re.compile(rf"/graph\?.*op={re.escape(OP)}"))
    expect(alice.locator(".panel").get_by_role("heading", name=OP)).to_be_visible()
    expect(alice.locator(f'.gr-node[data-id="{OP}"]')).to_have_class(re.compile("gr-selected"))
    review = alice.get_by_label("review", exact=True)
    review.get_by_role("button", name="Resolve thread").click()
    expect(review.locator(".review-thread.resolved")).to_have_count(1)
    expect(review).to_contain_text("Threads (0 open)")
    # an author cannot approve their own plan: the buttons are not offered
    expect(review.get_by_role("button", name="Approve plan")).to_have_count(0)

    # Rob approves; the plan becomes the baseline of its model and cluster
    rob.goto(f"/#/plans/{plan}")
    panel = rob.get_by_label("review", exact=True)
    panel.get_by_role("button", name="Approve plan").click()
    expect(panel.locator(".review-badge")).to_have_text("approved")
    panel.get_by_role("button", name="Make baseline").click()
    expect(rob.locator("#toast")).to_contain_text(f"plan {plan} is now the baseline")
    rob.reload()
    expect(rob.locator("#baseline-of")).to_contain_text("ui-tiny on h100-sxm-1x4")
    history = [e["kind"] for e in server.api("GET", f"/api/plans/{plan}/review")["history"]]
    assert history == ["requested", "commented", "resolved", "approved", "baseline_set"]

    # a later plan of the same model and cluster shows its comparison with the baseline
    strategy = server.api("POST", "/api/strategies", {"name": "ui-review-dp4", "mesh": "dp=4",
                                                      "templates": ["dp"]})  # fmt: skip
    later = server.api("POST", "/api/plans", {**ask, "strategy_id": strategy["id"]})
    assert server.wait_job(later["job_id"])["status"] == "succeeded"
    alice.goto(f"/#/plans/{later['id']}")
    table = alice.get_by_label("against the baseline")
    expect(table).to_contain_text("step time")
    expect(alice.get_by_label("baseline", exact=True)).to_contain_text(f"plan #{plan}")
    screenshot(alice, "review-baseline")


def test_value_and_timeline_threads_open_their_views(
    people: dict[str, Page], server: Server, built_plan: dict[str, Any]
) -> None:
    """A thread on a value opens the sharding diagram on it; one on a timeline range opens
    the timeline zoomed to it; one started on the timeline takes the zoom as its anchor."""
    rob = people["rob"]
    plan = built_plan["id"]
    value = "layers.0.mlp.down_proj.weight"
    step = built_plan["summary"]["cost"]["step_time_s"]
    t0, t1 = step * 0.25, step * 0.5
    url = f"/api/plans/{plan}/comments"
    _admin_fetch(rob, "GET", "/api/me")  # rob's session works
    _admin_fetch(rob, "POST", url, {"body": "Shard this on tp?",
                                    "anchor": {"kind": "value", "name": value}})  # fmt: skip
    _admin_fetch(rob, "POST", url, {"body": "Comm is exposed here.",
                                    "anchor": {"kind": "timeline", "start_s": t0,
                                               "end_s": t1}})  # fmt: skip
    rob.goto(f"/#/plans/{plan}")
    review = rob.get_by_label("review", exact=True)
    review.get_by_role("link", name=f"value {value}").click()
    expect(rob).to_have_url(re.compile(rf"/sharding\?value={re.escape(value)}"))
    expect(rob.get_by_label("Value")).to_have_value(value)

    rob.get_by_label("review", exact=True).get_by_role("link", name=re.compile("^timeline")).click()
    expect(rob).to_have_url(re.compile(r"/timeline\?t0="))
    expect(rob.locator("#timeline-plot .barlayer").first).to_be_visible()
    shown = rob.evaluate("() => document.getElementById('timeline-plot').layout.xaxis.range")
    assert shown == [t0 * 1e3, t1 * 1e3]

    # a new comment on the zoomed timeline is anchored to that range
    panel = rob.get_by_label("review", exact=True)
    panel.get_by_label("new comment").click()
    expect(panel.get_by_label("comment on")).to_contain_text("on timeline")
    panel.get_by_label("new comment").fill("And here.")
    panel.get_by_role("button", name="Add comment").click()
    expect(panel.locator(".review-thread")).to_have_count(3)
    threads = server.api("GET", f"/api/plans/{plan}/review")["threads"]
    assert threads[-1]["anchor"] == {"kind": "timeline", "start_s": t0, "end_s": t1}
