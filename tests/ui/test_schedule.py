"""A pipelined plan in the browser: the timeline is its schedule (slots by stage on a canvas,
zoom in the URL, a slot opens its unit's ops) and memory is shown per stage."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from playwright.sync_api import Page, expect

from tests.ui.conftest import TINY_LLAMA, Server, create_plan, screenshot


@pytest.fixture(scope="module")
def pipelined_plan(server: Server) -> dict[str, Any]:
    """A 4-layer llama on pp=2 x tp=2, interleaved with 2 chunks per stage, 8 micro-batches."""
    strategy = {
        "name": "ui-pp2-tp2",
        "mesh": "pp=2,tp=2",
        "templates": ["megatron_tp"],
        "options": {"pipeline": {"schedule": "interleaved", "microbatches": 8,
                                 "virtual_stages": 2}},
    }  # fmt: skip
    overrides = {**TINY_LLAMA, "layers": 4, "batch": 16}
    return create_plan(server, "ui-tiny-pp", strategy, "h100-sxm-1x4", overrides)


def _query(page: Page) -> dict[str, str]:
    fragment = urlsplit(page.url).fragment
    return {k: v[0] for k, v in parse_qs(fragment.partition("?")[2]).items()}


def test_schedule_slots_zoom_and_unit_ops(
    page: Page, server: Server, pipelined_plan: dict[str, Any]
) -> None:
    plan_id = pipelined_plan["id"]
    view = server.api("GET", f"/api/plans/{plan_id}/schedule")
    page.goto(f"/#/plans/{plan_id}/timeline")
    canvas = page.locator("#schedule-canvas")
    expect(canvas).to_be_visible()
    slots = sum(len(st["slots"]["phase"]) for st in view["stages"])
    assert slots == 2 * 8 * 2 * 2  # F and B x 8 micro-batches x 2 chunks x 2 stages
    expect(canvas).to_have_attribute("aria-label", f"schedule of 2 stages, {slots} slots, "
                                     f"0.0 µs to {_fmt(view['step_time_s'])}")  # fmt: skip
    expect(page.locator("#schedule-headline")).to_contain_text(
        "interleaved schedule: 2 stages × 8 micro-batches × 2 model chunks per stage "
        f"= {slots} slots"
    )

    # click the first slot of stage 0: its unit's ops are listed
    box = canvas.bounding_box()
    assert box is not None
    first = view["stages"][0]["slots"]
    width = box["width"] - 150 - 8
    mid = (first["start"][0] + first["end"][0]) / 2 / view["step_time_s"]
    page.mouse.click(box["x"] + 150 + mid * width, box["y"] + 24 + 11)
    expect(page.locator("#schedule-selected")).to_contain_text(
        f"stage 0: forward of model chunk {first['chunk'][0]}, micro-batch 0"
    )
    unit = server.api("GET", f"/api/plans/{plan_id}/schedule/units/{first['chunk'][0]}/F")
    rows = page.get_by_role("table", name="ops of the unit").locator("tbody tr")
    expect(rows).to_have_count(len(unit["ops"]["name"]))
    screenshot(page, "schedule")

    # drag across the first half: the window goes to the URL, a reload opens it zoomed
    y = box["y"] + 24 + 11
    page.mouse.move(box["x"] + 150 + 0.05 * width, y)
    page.mouse.down()
    page.mouse.move(box["x"] + 150 + 0.5 * width, y, steps=5)
    page.mouse.up()
    expect(page).to_have_url(re.compile(r"t0=.*t1="))  # the URL follows the zoom
    query = _query(page)
    t0, t1 = float(query["t0"]), float(query["t1"])
    assert 0 < t0 < t1 < view["step_time_s"]
    page.reload()
    expect(page.locator("#schedule-canvas")).to_have_attribute("data-t1", query["t1"])
    page.get_by_role("button", name="Whole step").click()
    expect(page).not_to_have_url(re.compile(r"t0="))


def test_memory_per_stage(page: Page, server: Server, pipelined_plan: dict[str, Any]) -> None:
    plan_id = pipelined_plan["id"]
    stages = pipelined_plan["summary"]["pipeline"]["stages"]
    page.goto(f"/#/plans/{plan_id}/memory")
    plot = page.locator("#stage-memory-plot")
    expect(plot.locator(".barlayer").first).to_be_visible()
    x = page.evaluate("() => document.getElementById('stage-memory-plot').data[0].x")
    assert x == [f"stage {s['stage']}" for s in stages]
    expect(page.get_by_text("Every stage fits")).to_be_visible()


def _fmt(seconds: float) -> str:
    from tests.ui.conftest import fmt_time

    return fmt_time(seconds)
