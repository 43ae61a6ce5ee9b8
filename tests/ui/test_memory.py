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


#: a llama that does not fit an H100 under plain dp: ~99 GiB of 74.51 GiB per rank
TOO_BIG = {"layers": 4, "batch": 64}

#: the axis ticks, the capacity line and label, as drawn (page coordinates)
AXIS = """() => {
    const el = document.getElementById('memory-breakdown');
    const box = (n) => { const r = n.getBoundingClientRect(); return (r.top + r.bottom) / 2; };
    return {
        title: el.layout.yaxis.title.text,
        tickvals: el.layout.yaxis.tickvals, ticktext: el.layout.yaxis.ticktext,
        drawn: [...el.querySelectorAll('.ytick text')].map(t => [t.textContent, box(t)]),
        line: box(el.querySelector('.shapelayer path')),
        label: [...el.querySelectorAll('.annotation-text')].map(t => t.textContent),
    };
}"""

UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def test_memory_axis_is_in_binary_units(
    page: Page, server: Server, built_plan: dict[str, Any]
) -> None:
    plan_id = built_plan["id"]
    capacity = server.api("GET", f"/api/plans/{plan_id}/memory")["capacity_bytes"]
    page.goto(f"/#/plans/{plan_id}/memory")
    expect(page.locator("#memory-breakdown .barlayer").first).to_be_visible()
    page.get_by_label("scale up to the device's capacity").check()
    expect(page.locator("#memory-breakdown .shapelayer path")).to_have_count(1)
    axis = page.evaluate(AXIS)
    assert "GiB" in axis["title"], axis["title"]
    # every tick is a round number of GiB, labelled so
    for value, text in zip(axis["tickvals"], axis["ticktext"], strict=True):
        number, unit = text.split(" ")
        assert unit == "GiB" and abs(float(number) * UNITS[unit] - value) < 1, (text, value)
    # the capacity label names the capacity in GiB, and its line sits where the ticks put it
    gib = capacity / 2**30
    assert f"capacity {gib:.2f} GiB" in axis["label"], axis["label"]
    (v0, y0), (v1, y1) = [(float(t.split()[0]), y) for t, y in axis["drawn"][:2]]
    expected = y0 + (gib - v0) * (y1 - y0) / (v1 - v0)
    assert abs(axis["line"] - expected) <= 1.5, (axis["line"], expected)
    expect(page.locator("#view")).not_to_contain_text("null")
    # the bytes columns do not wrap
    cell = page.get_by_role("table", name="largest buffers at the peak, rank 0").locator("td.num")
    assert cell.first.evaluate("td => getComputedStyle(td).whiteSpace") == "nowrap"


def test_a_plan_that_does_not_fit_links_to_what_would(page: Page, server: Server) -> None:
    from tests.ui.conftest import create_plan

    strategy = {"name": "ui-too-big", "mesh": "dp=8", "templates": ["dp"]}
    plan = create_plan(server, "ui-too-big", strategy, "h100-sxm-1x8", TOO_BIG)
    page.goto(f"/#/plans/{plan['id']}/memory")
    expect(page.locator("p.fits").first).to_contain_text("does not fit")
    fixes = page.get_by_role("region", name="What would make it fit")
    expect(fixes).to_contain_text("Rank 0 needs")
    screenshot(page, "memory_what_if")
    links = fixes.get_by_role("link")
    expect(links.first).to_be_visible()
    texts = links.all_text_contents()
    assert any("selective recomputation" in t for t in texts), texts
    assert any("ZeRO-1" in t for t in texts) and any("FSDP" in t for t in texts), texts
    assert any("more tensor parallelism (dp=4,tp=2)" in t for t in texts), texts

    fixes.get_by_role("link", name=re.compile("^full recomputation")).click()
    expect(page.get_by_role("heading", name="New plan")).to_be_visible()
    expect(page.get_by_label("Model")).to_have_value(str(plan["model_id"]))
    expect(page.get_by_label("Cluster")).to_have_value("h100-sxm-1x8")
    expect(page.get_by_label("Axis 1 name")).to_have_value("dp")
    expect(page.get_by_label("Axis 1 size")).to_have_value("8")
    expect(page.get_by_label("dp", exact=True)).to_be_checked()
    expect(page.get_by_label("Activation recomputation")).to_have_value("full")

    page.go_back()
    page.get_by_role("region", name="What would make it fit").get_by_role(
        "link", name=re.compile("^more tensor parallelism")
    ).click()
    expect(page.get_by_label("Axis 2 name")).to_have_value("tp")
    expect(page.get_by_label("Axis 2 size")).to_have_value("2")
    expect(page.get_by_label("Axis 1 size")).to_have_value("4")
    expect(page.get_by_label("megatron_tp", exact=True)).to_be_checked()
    expect(page.get_by_label("Activation recomputation")).to_have_value("none")

    page.go_back()
    page.get_by_role("region", name="What would make it fit").get_by_role(
        "link", name=re.compile("^ZeRO-1")
    ).click()
    expect(page.get_by_label("zero1", exact=True)).to_be_checked()
    expect(page.get_by_label("dp", exact=True)).to_be_checked()
    expect(page.get_by_label("Axis 1 size")).to_have_value("8")
