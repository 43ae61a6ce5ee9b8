"""The service's commands: `shardlab db`, `shardlab token`, and a real `shardlab serve`."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from http.cookiejar import CookieJar
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from backend import migrate
from backend.auth import SESSION_COOKIE
from backend.cli import app as cli
from backend.redact import REDACTED, RedactSecrets, redact, uvicorn_log_config
from backend.settings import Settings

runner = CliRunner()


def _env(settings: Settings) -> dict[str, str | None]:
    return {
        "SHARDLAB_DATA_DIR": str(settings.data_dir),
        "SHARDLAB_DATABASE_URL": settings.database_url,
    }


def test_db_downgrade_current_upgrade(settings: Settings) -> None:
    env = _env(settings)
    head = migrate.current(settings.database_url)
    assert head is not None
    result = runner.invoke(cli, ["db", "current"], env=env)
    assert result.exit_code == 0 and result.stdout.strip() == head

    result = runner.invoke(cli, ["db", "downgrade", "base"], env=env)
    assert result.exit_code == 0, result.output
    assert runner.invoke(cli, ["db", "current"], env=env).stdout.strip() == "base"

    result = runner.invoke(cli, ["db", "upgrade"], env=env)
    assert result.exit_code == 0, result.output
    assert runner.invoke(cli, ["db", "current"], env=env).stdout.strip() == head


def test_db_upgrade_to_an_unknown_revision_is_one_line(settings: Settings) -> None:
    result = runner.invoke(cli, ["db", "upgrade", "nope"], env=_env(settings))
    assert result.exit_code == 1 and result.stderr.startswith("error: ")


def test_token_create_list_revoke(settings: Settings, app: FastAPI) -> None:
    env = _env(settings)
    result = runner.invoke(cli, ["token", "create", "--team", "ops", "--name", "ci"], env=env)
    assert result.exit_code == 0, result.output
    secret = result.stdout.strip()
    assert secret.startswith("shl_") and "\n" not in secret
    with TestClient(app) as api:
        api.headers["Authorization"] = f"Bearer {secret}"
        assert api.get("/api/me").json() == {
            "user": None,
            "team": "ops",
            "is_admin": False,
            "is_service_admin": False,
            "via": "token",
        }
        listed = runner.invoke(cli, ["token", "list", "--team", "ops", "--json"], env=env)
        tokens = json.loads(listed.stdout)
        assert [t["name"] for t in tokens] == ["ci"] and secret not in listed.stdout
        result = runner.invoke(cli, ["token", "revoke", str(tokens[0]["id"])], env=env)
        assert result.exit_code == 0, result.output
        assert api.get("/api/me").status_code == 401
    missing = runner.invoke(cli, ["token", "revoke", "999999"], env=env)
    assert missing.exit_code == 1 and "no token" in missing.stderr


def test_a_token_can_act_as_a_member(settings: Settings, app: FastAPI, user_client: Any) -> None:
    """`--user` makes a token that acts as that member (reviews need a person)."""
    env = _env(settings)
    user_client("ops", "rob")  # rob joins team ops
    result = runner.invoke(cli, ["token", "create", "--team", "ops", "--name", "r",
                                 "--user", "rob"], env=env)  # fmt: skip
    assert result.exit_code == 0, result.output
    with TestClient(app) as api:
        api.headers["Authorization"] = f"Bearer {result.stdout.strip()}"
        assert api.get("/api/me").json()["user"] == "rob"
    stranger = runner.invoke(cli, ["token", "create", "--team", "ops", "--name", "z",
                                   "--user", "zed"], env=env)  # fmt: skip
    assert stranger.exit_code == 1 and "no member 'zed'" in stranger.stderr


def test_token_create_with_an_expiry(settings: Settings, app: FastAPI) -> None:
    env = _env(settings)
    args = ["token", "create", "--team", "ops", "--name", "ci", "--expires-in-days", "7"]
    result = runner.invoke(cli, args, env=env)
    assert result.exit_code == 0, result.output
    listed = runner.invoke(cli, ["token", "list", "--team", "ops", "--json"], env=env)
    (token,) = json.loads(listed.stdout)
    expires = datetime.fromisoformat(token["expires_at"])
    assert abs(expires - (datetime.now(UTC) + timedelta(days=7))) < timedelta(minutes=1)
    table = runner.invoke(cli, ["token", "list", "--team", "ops"], env=env).stdout
    assert "active, expires" in table
    bad = runner.invoke(cli, [*args[:-1], "0"], env=env)
    assert bad.exit_code != 0


def test_token_create_on_an_unmigrated_database_says_so(tmp_path: Path) -> None:
    env: dict[str, str | None] = {
        "SHARDLAB_DATA_DIR": str(tmp_path),
        "SHARDLAB_DATABASE_URL": f"sqlite:///{tmp_path / 'empty.db'}",
    }
    result = runner.invoke(cli, ["token", "create", "--team", "t", "--name", "n"], env=env)
    assert result.exit_code == 1 and "shardlab db upgrade" in result.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for(
    predicate: Callable[[], bool], what: str, proc: subprocess.Popen[str], lines: list[str]
) -> None:
    deadline = time.monotonic() + 60
    while not predicate():
        assert proc.poll() is None, "serve exited:\n" + "".join(lines)
        assert time.monotonic() < deadline, f"{what} within 60 s:\n" + "".join(lines)
        time.sleep(0.1)


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def _serve(
    tmp_path: Path, port: int, *flags: str, collect_stdout: bool = False
) -> tuple[subprocess.Popen[str], list[str]]:
    """`shardlab serve` on a fresh SQLite data dir; its stderr lines are collected (and its
    stdout's, where uvicorn's access log goes, with `collect_stdout`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDLAB_")}
    env["SHARDLAB_DATA_DIR"] = str(tmp_path / "data")
    env["PYTHONUNBUFFERED"] = "1"  # the access log (stdout) line by line
    proc = subprocess.Popen(
        [sys.executable, "-m", "backend", "serve", "--port", str(port), *flags],
        stdout=subprocess.PIPE if collect_stdout else subprocess.DEVNULL,
        stderr=subprocess.STDOUT if collect_stdout else subprocess.PIPE,
        text=True,
        env=env,
    )
    lines: list[str] = []
    output = proc.stdout if collect_stdout else proc.stderr
    assert output is not None
    threading.Thread(target=lambda: lines.extend(iter(output.readline, "")), daemon=True).start()
    return proc, lines


def test_serve_prints_a_login_link_that_logs_in(tmp_path: Path) -> None:
    port = _free_port()
    proc, lines = _serve(tmp_path, port, "--no-worker", "--demo", collect_stdout=True)
    link = re.compile(rf"http://127\.0\.0\.1:{port}/api/auth/login\?link=(\S+)")
    try:
        _wait_for(lambda: any(link.search(line) for line in lines), "login link", proc, lines)
        _wait_for(lambda: _healthy(port), "/healthz", proc, lines)
        url = next(m.group(0) for line in lines if (m := link.search(line)))
        assert any("demo data added" in line for line in lines)
        assert not any("worker started" in line for line in lines)

        jar = CookieJar()
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        with browser.open(url, timeout=10) as page:  # 303 to the UI, cookie kept
            assert page.status == 200 and page.url == f"http://127.0.0.1:{port}/"
        assert [c.name for c in jar] == [SESSION_COOKIE]
        with browser.open(f"http://127.0.0.1:{port}/api/me", timeout=10) as me:
            assert json.load(me) == {
                "user": "admin",
                "team": "default",
                "is_admin": True,
                "is_service_admin": True,
                "via": "session",
            }
        assert (tmp_path / "data" / "shardlab.db").exists()
        # the link's secret was printed once for the operator, and never logged
        secret = next(m.group(1) for line in lines if (m := link.search(line)))
        access = f"GET /api/auth/login?link={REDACTED} HTTP/1.1"
        _wait_for(lambda: any(access in line for line in lines), "access log", proc, lines)
        assert sum(secret in line for line in lines) == 1, "".join(lines)
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_redact_secrets_filter_keeps_uvicorn_s_arguments() -> None:
    record = logging.LogRecord(
        "uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5", "GET", "/api/auth/login?link=s3cr3t&next=/x", "1.1", 303), None,
    )  # fmt: skip
    assert RedactSecrets().filter(record)
    assert record.args == ("127.0.0.1:5", "GET", f"/api/auth/login?link={REDACTED}&next=/x",
                           "1.1", 303)  # fmt: skip
    assert redact("/a?x=1&TOKEN=abc#f") == f"/a?x=1&TOKEN={REDACTED}#f"
    assert redact("/api/plans?limit=5") == "/api/plans?limit=5"
    config = uvicorn_log_config()
    assert all("redact_secrets" in h["filters"] for h in config["handlers"].values())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_serve_stops_its_worker_when_terminated(tmp_path: Path) -> None:
    port = _free_port()
    proc, lines = _serve(tmp_path, port)
    started = re.compile(r"worker started \(pid (\d+)\)")
    try:
        _wait_for(lambda: _healthy(port), "/healthz", proc, lines)
        pid = next(int(m.group(1)) for line in lines if (m := started.search(line)))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    deadline = time.monotonic() + 15
    while _alive(pid):
        assert time.monotonic() < deadline, "the worker outlived serve:\n" + "".join(lines)
        time.sleep(0.1)


def _workers(port: int, token: str) -> list[dict[str, Any]]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/workers",
                                     headers={"Authorization": f"Bearer {token}"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=10) as answer:
        listed: list[dict[str, Any]] = json.load(answer)
        return listed


def test_serve_restarts_a_worker_that_died(tmp_path: Path) -> None:
    port = _free_port()
    proc, lines = _serve(tmp_path, port)
    started = re.compile(r"worker started \(pid (\d+)(?:, restart (\d+))?\)")
    try:
        _wait_for(lambda: _healthy(port), "/healthz", proc, lines)
        env = {"SHARDLAB_DATA_DIR": str(tmp_path / "data")}
        made = runner.invoke(cli, ["token", "create", "--team", "ops", "--name", "w"], env=env)
        token = made.stdout.strip()
        first = next(int(m.group(1)) for line in lines if (m := started.search(line)))
        _wait_for(lambda: any(w["id"].endswith(f"-{first}") for w in _workers(port, token)),
                  "the first worker registered", proc, lines)  # fmt: skip
        os.kill(first, signal.SIGKILL)  # as the kernel's OOM killer would
        _wait_for(lambda: any(w["restarts"] == 1 for w in _workers(port, token)),
                  "a restarted worker registered", proc, lines)  # fmt: skip
        second = next(int(m.group(1)) for line in lines
                      if (m := started.search(line)) and m.group(2) == "1")  # fmt: skip
        assert second != first and _alive(second)
        (restarted,) = [w for w in _workers(port, token) if w["restarts"] == 1]
        assert restarted["id"].endswith(f"-{second}") and restarted["started_at"]
        assert any(f"(pid {first}) exited with code -9" in line for line in lines), lines
    finally:
        proc.terminate()
        proc.wait(timeout=30)
