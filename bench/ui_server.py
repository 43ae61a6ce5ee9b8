"""A real `shardlab serve` (with its job worker) for browser benchmarks, and a logged-in
Chromium: what tests/ui/conftest.py sets up for the UI tests, without pytest.

    with ui_server() as server, chromium() as browser:
        state = login(browser, server)          # storage state of the admin's session
        plan = server.create_plan(...)          # over REST with a team API token
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from playwright.sync_api import Browser, sync_playwright

CHROMIUM = "/usr/bin/chromium"
START_TIMEOUT_S = 60.0


@dataclass
class UiServer:
    """A running service: its base URL, the admin's one-time login link, a team API token."""

    url: str
    login_link: str
    token: str
    proc: subprocess.Popen[str]
    log: list[str] = field(default_factory=list)

    def api(self, method: str, path: str, body: Any = None, timeout_s: float = 60) -> Any:
        """Call the REST API with the team token; the decoded JSON answer (raises on 4xx)."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            text = answer.read().decode()
        return json.loads(text) if text else None

    def wait_job(self, job_id: int, timeout_s: float = 600) -> dict[str, Any]:
        """Poll a job until it ends; its final state."""
        deadline = time.monotonic() + timeout_s
        while True:
            job: dict[str, Any] = self.api("GET", f"/api/jobs/{job_id}")
            if job["status"] not in ("queued", "running"):
                return job
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {job['status']} after {timeout_s} s")
            time.sleep(0.3)

    def create_plan(
        self,
        model: str,
        preset: str,
        overrides: dict[str, Any],
        strategy: dict[str, Any],
        cluster: str | None,
    ) -> tuple[dict[str, Any], float]:
        """Create the model, the strategy and the plan; wait for the worker to build it.
        The plan and the seconds from its creation to its job's end."""
        made = self.api(
            "POST", "/api/models", {"name": model, "preset": preset, "overrides": overrides}
        )
        chosen = self.api("POST", "/api/strategies", strategy)
        body = {"model_id": made["id"], "strategy_id": chosen["id"], "cluster": cluster}
        started = time.perf_counter()
        created = self.api("POST", "/api/plans", body)
        job = self.wait_job(created["job_id"])
        elapsed = time.perf_counter() - started
        if job["status"] != "succeeded":
            raise RuntimeError(f"plan job failed: {job}")
        plan: dict[str, Any] = self.api("GET", f"/api/plans/{created['id']}")
        return plan, elapsed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def _create_token(env: dict[str, str], tries: int = 5) -> str:
    """An API token for team default, made with `shardlab token create`. A busy SQLite
    database (the server's worker writing) can refuse the first tries; the last failure is
    raised with what the command said."""
    create = [sys.executable, "-m", "backend", "token", "create", "--team", "default"]
    for attempt in range(tries):
        made = subprocess.run([*create, "--name", f"bench{attempt}"], env=env,
                              capture_output=True, text=True)  # fmt: skip
        if made.returncode == 0:
            return made.stdout.strip().split()[-1]
        time.sleep(0.5 * (attempt + 1))
    raise RuntimeError(f"token create failed {tries} times: {made.stderr.strip()}")


@contextmanager
def ui_server() -> Iterator[UiServer]:
    """`shardlab serve` on a free port over a fresh SQLite data dir (removed afterwards)."""
    with tempfile.TemporaryDirectory(prefix="shardlab-bench-") as data:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDLAB_")}
        env["SHARDLAB_DATA_DIR"] = data
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        proc = subprocess.Popen(
            [sys.executable, "-m", "backend", "serve", "--port", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        log: list[str] = []
        assert proc.stderr is not None
        stderr = proc.stderr
        threading.Thread(target=lambda: log.extend(iter(stderr.readline, "")), daemon=True).start()
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            link = re.compile(rf"{re.escape(url)}/api/auth/login\?link=\S+")
            while not (_healthy(url) and any(link.search(line) for line in log)):
                if proc.poll() is not None:
                    raise RuntimeError("serve exited:\n" + "".join(log))
                if time.monotonic() > deadline:
                    raise RuntimeError("serve did not start:\n" + "".join(log))
                time.sleep(0.2)
            login_link = next(m.group(0) for line in log if (m := link.search(line)))
            token = _create_token(env)
            yield UiServer(url, login_link, token, proc, log)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


@contextmanager
def chromium() -> Iterator[Browser]:
    """Debian's Chromium driven by Playwright (RuntimeError when it is not installed)."""
    if not Path(CHROMIUM).exists():
        raise RuntimeError(f"{CHROMIUM} is missing (Debian's chromium package)")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


def login(browser: Browser, server: UiServer, path: Path) -> Path:
    """Open the one-time login link; the session's storage state, saved at `path`."""
    context = browser.new_context()
    page = context.new_page()
    page.goto(server.login_link)
    page.wait_for_url(f"{server.url}/")
    page.locator("#whoami").filter(has_text="team default").wait_for()
    context.storage_state(path=str(path))
    context.close()
    return path
