"""Every control of every view has a label and is reachable with the keyboard."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import Page, expect

#: (view, the element that says it has rendered)
VIEWS = [
    ("#/models", "table"),
    ("#/plans", "table"),
    ("#/plans/new", "form"),
    ("#/compare", "h1"),
    ("#/plans/{id}", "#collective-detail"),
    ("#/plans/{id}/graph", ".gr-node"),
    ("#/plans/{id}/sharding", "svg"),
    ("#/plans/{id}/timeline", ".js-plotly-plot"),
    ("#/plans/{id}/memory", ".js-plotly-plot"),
    ("#/plans/{id}/passes", ".js-plotly-plot"),
]

#: the controls of the page without an accessible name or out of the tab order
UNREACHABLE = """() => [...document.querySelectorAll(
    'main input, main select, main textarea, main button, main a[href], main [role=button]')]
  .filter((el) => el.offsetParent !== null && !el.closest('.js-plotly-plot'))
  .filter((el) => {
    const named = (el.labels && el.labels.length) || el.getAttribute('aria-label')
      || el.getAttribute('aria-labelledby') || el.getAttribute('title')
      || (el.tagName !== 'INPUT' && el.tagName !== 'SELECT' && el.textContent.trim());
    return !named || el.tabIndex < 0;
  })
  .map((el) => el.outerHTML.slice(0, 120))"""


@pytest.mark.parametrize(("view", "ready"), VIEWS, ids=[v for v, _ in VIEWS])
def test_every_control_is_labelled_and_focusable(
    page: Page, built_plan: dict[str, Any], view: str, ready: str
) -> None:
    page.goto("/" + view.format(id=built_plan["id"]))
    expect(page.locator(f"main {ready}").first).to_be_attached(timeout=30_000)
    assert page.evaluate(UNREACHABLE) == []
