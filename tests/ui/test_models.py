"""The models view: the team's models, a model from a preset with overrides, an upload."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Locator, Page, expect

from tests.ui.conftest import TINY_LLAMA, Server, screenshot
from tests.ui.refusals import api_error, error_of, refusing_page


@pytest.fixture
def page(browser: Browser, server: Server, storage_state: str) -> Iterator[Page]:
    """A logged-in page that lets the 409/422 answers these tests provoke through."""
    yield from refusing_page(browser, server, storage_state)


def model_row(page: Page, model_id: int) -> Locator:
    return page.get_by_role("table", name="models").locator(f'tr[data-model-id="{model_id}"]')


def model_named(server: Server, name: str) -> dict[str, Any]:
    found = [m for m in server.api("GET", "/api/models") if m["name"] == name]
    assert len(found) == 1, name
    return found[0]


def test_create_from_preset_with_an_override(page: Page, server: Server) -> None:
    page.goto("/#/models")
    form = page.get_by_role("form", name="Create from preset")
    form.get_by_label("Preset").select_option("llama3-8b")
    defaults = page.get_by_role("table", name="default config of llama3-8b")
    expect(defaults).to_contain_text("kv_heads")
    expect(form).to_contain_text("llama3-8b as is: 8,030,261,248 parameters")
    form.get_by_label("Name").fill("models-llama-2l")
    form.get_by_label("Overrides").fill("layers=2")
    form.get_by_role("button", name="Create model").click()

    expect(page.get_by_role("status").first).to_contain_text("Created model models-llama-2l")
    made = model_named(server, "models-llama-2l")
    detail = server.api("GET", f"/api/models/{made['id']}")
    assert detail["overrides"] == {"layers": 2} and detail["summary"]["layers"] == 2
    row = model_row(page, made["id"])
    expect(row.locator('td[data-col="params"]')).to_have_text(f"{detail['summary']['params']:,}")
    expect(row).to_contain_text("layers=2")
    expect(row).to_have_attribute("aria-current", "true")
    screenshot(page, "models")
    # the summary opens in the row under the model's, the columns keeping their widths
    table = page.get_by_role("table", name="models")
    widths = table.locator("thead th").evaluate_all(
        "ths => ths.map(th => th.getBoundingClientRect().width)"
    )
    row.get_by_role("button", name="models-llama-2l").click()
    expect(row.get_by_role("button", name="models-llama-2l")).to_have_attribute(
        "aria-expanded", "true"
    )
    below = table.locator(f'tr[data-detail-of="{made["id"]}"]')
    expect(below.locator("dl")).to_contain_text(f"{detail['summary']['flops_forward']:,}")
    after = table.locator("thead th").evaluate_all(
        "ths => ths.map(th => th.getBoundingClientRect().width)"
    )
    assert all(abs(x - y) <= 1 for x, y in zip(widths, after, strict=True)), (widths, after)
    # no cell of the row wraps: each is one line high
    lines = row.locator("td").evaluate_all(
        """tds => tds.map(td => {
            const walker = document.createTreeWalker(td, NodeFilter.SHOW_TEXT);
            const tops = new Set();
            for (let node = walker.nextNode(); node; node = walker.nextNode()) {
                const range = document.createRange();
                range.selectNodeContents(node);
                for (const r of range.getClientRects()) {
                    if (r.width > 0) tops.add(Math.round(r.top));
                }
            }
            return [td.textContent, tops.size, getComputedStyle(td).whiteSpace];
        })"""
    )
    assert all(n <= 1 for _, n, _ in lines), lines
    row.get_by_role("button", name="models-llama-2l").click()
    expect(below).to_be_hidden()


def test_bad_overrides_are_shown_next_to_the_overrides_field(page: Page, server: Server) -> None:
    before = len(server.api("GET", "/api/models"))
    page.goto("/#/models")
    form = page.get_by_role("form", name="Create from preset")
    form.get_by_label("Preset").select_option("llama3-8b")
    form.get_by_label("Name").fill("models-bad")
    overrides = form.get_by_label("Overrides")

    # heads=7 does not divide hidden=4096: the engine's message, on the overrides field
    overrides.fill("layers=2\nheads=7")
    form.get_by_role("button", name="Create model").click()
    expected = api_error(server, "POST", "/api/models",
                         {"name": "models-bad", "preset": "llama3-8b",
                          "overrides": {"layers": 2, "heads": 7}})  # fmt: skip
    expect(overrides).to_have_attribute("aria-invalid", "true")
    expect(error_of(page, overrides)).to_contain_text(expected["message"])
    expect(overrides).to_be_focused()
    expect(form.get_by_label("Name")).not_to_have_attribute("aria-invalid", "true")

    # an unknown key: the message names it, and the line that set it
    overrides.fill("layers=2\nflavour=spicy")
    form.get_by_role("button", name="Create model").click()
    expected = api_error(server, "POST", "/api/models",
                         {"name": "models-bad", "preset": "llama3-8b",
                          "overrides": {"flavour": "spicy"}})  # fmt: skip
    line = error_of(page, overrides)
    expect(line).to_contain_text(expected["message"])
    expect(line).to_contain_text("line 2 (flavour=spicy)")
    assert len(server.api("GET", "/api/models")) == before

    # a name already taken: next to the name, and the overrides are no longer marked
    taken = "models-taken"
    if not any(m["name"] == taken for m in server.api("GET", "/api/models")):
        server.api("POST", "/api/models", {"name": taken, "preset": "mlp_demo"})
    form.get_by_label("Name").fill(taken)
    overrides.fill("layers=2")
    form.get_by_role("button", name="Create model").click()
    name = form.get_by_label("Name")
    expect(name).to_have_attribute("aria-invalid", "true")
    expect(error_of(page, name)).to_contain_text(f"a model named {taken!r} already exists")
    expect(overrides).not_to_have_attribute("aria-invalid", "true")


def test_upload_a_graph_file(page: Page, server: Server, tmp_path: Path) -> None:
    source = server.api("POST", "/api/models",
                        {"name": "models-upload-source", "preset": "llama3-8b",
                         "overrides": TINY_LLAMA})  # fmt: skip
    graph = server.api("GET", f"/api/models/{source['id']}/graph")
    path = tmp_path / "models-tiny-graph.json"
    path.write_text(json.dumps(graph))
    bad = tmp_path / "broken.json"
    bad.write_text('{"format": "shardlab.graph/1",\n  "ops": [1, 2,]}')

    page.goto("/#/models")
    form = page.get_by_role("form", name="Upload graph file")
    file_input = form.get_by_label("Graph file")

    # a malformed file: the message (line and column) next to the file input, nothing stored
    before = len(server.api("GET", "/api/models"))
    file_input.set_input_files(str(bad))
    form.get_by_role("button", name="Upload").click()
    expect(file_input).to_have_attribute("aria-invalid", "true")
    expect(error_of(page, file_input)).to_contain_text("invalid JSON at line 2")
    assert len(server.api("GET", "/api/models")) == before

    file_input.set_input_files(str(path))
    form.get_by_label("Name").fill("")
    file_input.dispatch_event("change")
    expect(form.get_by_label("Name")).to_have_value("models-tiny-graph")
    form.get_by_role("button", name="Upload").click()
    expect(file_input).not_to_have_attribute("aria-invalid", "true")

    expect(page.get_by_role("status").first).to_contain_text("Created model models-tiny-graph")
    made = model_named(server, "models-tiny-graph")
    assert made["source"] == "upload" and made["params"] == source["params"]
    row = model_row(page, made["id"])
    expect(row.locator('td[data-col="params"]')).to_have_text(f"{source['params']:,}")
    expect(row).to_contain_text("upload")
