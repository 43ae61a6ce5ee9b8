"""The plan overview's "Export for PyTorch" downloads: the DTensor module, the torchtitan
arguments and TOML, and the placements JSON (through the session cookie), and a refused
export's message."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.ui.conftest import TINY_LLAMA, Server, create_plan, screenshot
from tests.ui.refusals import refusing_page


@pytest.fixture
def refusing(browser: Browser, server: Server, storage_state: str) -> Iterator[Page]:
    """A logged-in page that lets the 422 of a refused export through."""
    yield from refusing_page(browser, server, storage_state)


def _download(page: Page, label: str) -> tuple[str, str]:
    with page.expect_download() as info:
        page.get_by_role("link", name=label).click()
    download = info.value
    return download.suggested_filename, Path(download.path()).read_text()


def test_overview_downloads_the_three_exports(page: Page, built_plan: dict[str, Any]) -> None:
    plan_id = built_plan["id"]
    page.goto(f"/#/plans/{plan_id}")
    section = page.get_by_role("region", name="export for PyTorch")
    expect(section.get_by_role("heading", name="Export for PyTorch")).to_be_visible()
    href = section.get_by_role("link", name="torchtitan arguments").get_attribute("href")
    assert href == f"/api/plans/{plan_id}/export?format=torchtitan"

    name, module = _download(page, "DTensor parallelize module")
    assert name == f"plan{plan_id}_parallelize.py"
    assert "def parallelize(" in module and '"lm_head": ColwiseParallel(' in module
    compile(module, name, "exec")
    name, args = _download(page, "torchtitan arguments")
    assert name == f"plan{plan_id}_torchtitan.args"
    assert "--parallelism.tensor_parallel_degree 2" in args.splitlines(), args
    name, toml = _download(page, "torchtitan TOML")
    assert name == f"plan{plan_id}_torchtitan.toml"
    assert "tensor_parallel_degree = 2" in toml.splitlines()
    assert "data_parallel_replicate_degree = 2" in toml.splitlines()
    name, text = _download(page, "Parameter placements JSON")
    params = {p["name"]: p for p in json.loads(text)["parameters"]}
    assert params["layers.0.mlp.down_proj.weight"]["placements"] == {"dp": "R", "tp": "S(1)"}
    screenshot(page, "plan_export")


def test_a_refused_export_shows_its_message(refusing: Page, server: Server) -> None:
    page = refusing
    strategy = {"name": "ui-partial", "mesh": "tp=2", "templates": ["megatron_tp"],
                "annotations": ["layers.0.mlp.up_proj.weight=tp:P(sum)"]}  # fmt: skip
    plan = create_plan(server, "ui-tiny", strategy, None, TINY_LLAMA)
    page.goto(f"/#/plans/{plan['id']}")
    page.get_by_role("link", name="Parameter placements JSON").click()
    alert = page.get_by_role("region", name="export for PyTorch").get_by_role("alert")
    expect(alert).to_contain_text("export_error")
    expect(alert).to_contain_text("'layers.0.mlp.up_proj.weight' is placed P(sum)")
