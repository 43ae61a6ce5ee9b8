"""Browser test fixtures: a real `shardlab serve` (with its worker) and Debian's Chromium.

- `server` (session): `shardlab serve` on a free port over a fresh SQLite data dir; the first
  admin's login link is read from its stderr; an API token of the admin's team for seeding.
- `browser` (session): Chromium at /usr/bin/chromium driven by Playwright.
- `page`: a logged-in tab; every console error or uncaught page error fails the test.
- `built_plan` (session): a small llama plan created over REST and built by the worker.

Screenshots go to `build/screenshots/` (ignored by git), so a test run leaves the tree clean;
`make screenshots` sets SHARDLAB_SCREENSHOTS=docs/screenshots to refresh the README's.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page

from bench.ui_server import CHROMIUM, UiServer, chromium, login, ui_server

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / os.environ.get("SHARDLAB_SCREENSHOTS", "build/screenshots")
TINY_LLAMA = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 256}
TINY_LLAMA |= {"seq": 16, "batch": 8}


#: the running service of the tests (bench/ui_server.py starts it for benchmarks too)
Server = UiServer


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    """`shardlab serve` with its worker on a free port over a fresh SQLite data dir."""
    with ui_server() as running:
        yield running


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs Debian's chromium package")
    with chromium() as running:
        yield running


@pytest.fixture(scope="session")
def storage_state(
    browser: Browser, server: Server, tmp_path_factory: pytest.TempPathFactory
) -> str:
    """Log in once through the one-time link; the session cookie is reused by every page."""
    return str(login(browser, server, tmp_path_factory.mktemp("state") / "state.json"))


def logged_in_page(
    browser: Browser, server: Server, storage_state: str, tolerated: re.Pattern[str] | None = None
) -> Iterator[Page]:
    """A logged-in tab at 1400x900; console errors (except `tolerated` ones) and uncaught page
    errors fail the test when the tab is closed."""
    context = browser.new_context(
        storage_state=storage_state, viewport={"width": 1400, "height": 900}, base_url=server.url
    )
    tab = context.new_page()
    problems: list[str] = []

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error" and not (tolerated and tolerated.match(message.text)):
            problems.append(f"console error: {message.text}")

    tab.on("console", on_console)
    tab.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    yield tab
    context.close()
    assert problems == [], problems


@pytest.fixture
def page(browser: Browser, server: Server, storage_state: str) -> Iterator[Page]:
    """A logged-in page; any console error or page error fails the test."""
    yield from logged_in_page(browser, server, storage_state)


def create_plan(
    server: Server,
    model: str,
    strategy: dict[str, Any],
    cluster: str | None,
    overrides: dict[str, Any] | None = None,
    preset: str = "llama3-8b",
) -> dict[str, Any]:
    """Create (or reuse) the model, create the strategy and a plan over REST; wait for it."""
    models = {m["name"]: m["id"] for m in server.api("GET", "/api/models")}
    if model not in models:
        body = {"name": model, "preset": preset, "overrides": overrides or {}}
        models[model] = server.api("POST", "/api/models", body)["id"]
    made = server.api("POST", "/api/strategies", strategy)
    body = {"model_id": models[model], "strategy_id": made["id"], "cluster": cluster}
    created = server.api("POST", "/api/plans", body)
    job = server.wait_job(created["job_id"])
    assert job["status"] == "succeeded", job
    plan: dict[str, Any] = server.api("GET", f"/api/plans/{created['id']}")
    return plan


@pytest.fixture(scope="session")
def built_plan(server: Server) -> dict[str, Any]:
    """A tiny llama (2 layers) under dp=2 x tp=2 on an H100 node, built by the worker."""
    strategy = {"name": "ui-dp2-tp2", "mesh": "dp=2,tp=2", "templates": ["dp", "megatron_tp"]}
    return create_plan(server, "ui-tiny", strategy, "h100-sxm-1x4", TINY_LLAMA)


def screenshot(page: Page, name: str) -> Path:
    """Save the page to SCREENSHOTS/<name>.png."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=False)
    return path


def fmt_time(seconds: float) -> str:
    """ui.js `fmtTime`: how the UI writes a duration."""
    a = abs(seconds)
    if a >= 1:
        return f"{seconds:.3f} s"
    if a >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} µs"
