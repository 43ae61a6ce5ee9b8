"""Helpers of the form tests (models, new plan, compare), which make the API refuse input.

Chromium logs every 4xx answer as a console error ("Failed to load resource: ... 422"), and
conftest's `page` fails a test on any console error. A form test provokes 409 and 422 on
purpose (the UI shows them next to the field), so its `page` lets exactly those through;
every other console error and every uncaught page error still fails the test.
"""

from __future__ import annotations

import json
import re
import urllib.error
from collections.abc import Iterator
from typing import Any

from playwright.sync_api import Browser, Locator, Page, expect

from tests.ui.conftest import Server, logged_in_page

REFUSAL = re.compile(r"^Failed to load resource: the server responded with a status of (409|422)\b")


def refusing_page(browser: Browser, server: Server, storage_state: str) -> Iterator[Page]:
    """conftest's `page`, tolerating the console errors of 409/422 answers."""
    yield from logged_in_page(browser, server, storage_state, REFUSAL)


def api_error(server: Server, method: str, path: str, body: Any) -> dict[str, Any]:
    """The `{code, message, detail}` answer of a request that must fail."""
    try:
        server.api(method, path, body)
    except urllib.error.HTTPError as exc:
        answer: dict[str, Any] = json.loads(exc.read().decode())
        return answer
    raise AssertionError(f"{method} {path} {body} succeeded")


def error_of(page: Page, control: Locator) -> Locator:
    """The error line that describes a control (aria-describedby): the message next to it.
    Waits until the control is described by one (error lines have ids `<field>-error-<n>`)."""
    expect(control).to_have_attribute("aria-describedby", re.compile(r"-error-\d+\b"))
    ids = (control.get_attribute("aria-describedby") or "").split()
    lines = [i for i in ids if page.locator(f"#{i}.field-error").count()]
    assert lines, f"no error line among aria-describedby={ids}"
    return page.locator(f"#{lines[0]}")
