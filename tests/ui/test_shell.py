"""The UI shell: sign-in, navigation between views, permalinks."""

from __future__ import annotations

from playwright.sync_api import Browser, Page, expect

from tests.ui.conftest import Server


def test_without_a_session_the_page_asks_to_sign_in(browser: Browser, server: Server) -> None:
    context = browser.new_context()
    page = context.new_page()
    page.goto(server.url + "/")
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    expect(page.locator("#whoami")).to_have_text("not signed in")
    context.close()


def test_signed_in_user_and_team_are_shown(page: Page) -> None:
    page.goto("/#/plans")
    expect(page.locator("#whoami")).to_have_text("admin · team default")


def test_unknown_page_says_so(page: Page) -> None:
    page.goto("/#/nowhere")
    expect(page.get_by_role("alert")).to_contain_text("no such page: /nowhere")
