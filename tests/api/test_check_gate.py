"""The CI gate end to end: `shardlab check --server` against a real `shardlab serve` with its
worker, on SQLite and PostgreSQL. A strategy version 26% slower than the baseline plan fails
`--max-regression-pct 5` (exit 1) and the Markdown names the regression; the baseline's own
strategy passes (exit 0) with a JUnit report; a refusal of the service exits 2; a fresh
team's token checks a preset under an inline strategy (`--preset --set --mesh --template`),
and a plan over the memory fails on `must_fit` (exit 1)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import xml.etree.ElementTree as ET
from pathlib import Path

from fastapi.testclient import TestClient
from typer.testing import CliRunner

from backend.settings import Settings
from shardlab.cli import app
from tests.api.conftest import token_for
from tests.api.test_checks import _ids
from tests.api.test_cli_service import _free_port, _healthy, _wait_for
from tests.api.test_plans import TINY, run_jobs

runner = CliRunner()


def _serve_on(settings: Settings, port: int) -> tuple[subprocess.Popen[str], list[str]]:
    """`shardlab serve` (with its worker) on the test's database."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDLAB_")}
    env["SHARDLAB_DATA_DIR"] = str(settings.data_dir)
    env["SHARDLAB_DATABASE_URL"] = settings.database_url
    proc = subprocess.Popen(
        [sys.executable, "-m", "backend", "serve", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    lines: list[str] = []
    assert proc.stderr is not None
    stderr = proc.stderr
    threading.Thread(target=lambda: lines.extend(iter(stderr.readline, "")), daemon=True).start()
    return proc, lines


def test_check_through_a_real_service(
    client: TestClient, settings: Settings, tmp_path: Path
) -> None:
    ids = _ids(client)  # a tiny llama; strategy v1 dp=4, v2 dp=2 x tp=4
    baseline = client.post("/api/plans", json={"model_id": ids["model"], "strategy_id": ids["v1"],
                                               "cluster": "h100-sxm-1x8"}).json()["id"]  # fmt: skip
    run_jobs(settings)
    token = token_for(settings, "alpha", "ci")
    port = _free_port()
    proc, lines = _serve_on(settings, port)
    try:
        _wait_for(lambda: _healthy(port), "/healthz", proc, lines)
        gate = ["check", "--server", f"http://127.0.0.1:{port}", "--token", token,
                "--model-id", str(ids["model"]), "--cluster", "h100-sxm-1x8",
                "--baseline-plan-id", str(baseline), "--max-regression-pct", "5",
                "--timeout", "120"]  # fmt: skip
        report = tmp_path / "junit.xml"
        ok = runner.invoke(app, [*gate, "--strategy-id", str(ids["v1"]), "--junit", str(report)])
        assert ok.exit_code == 0, ok.output + "".join(lines)
        assert "✅ **Shardlab check passed**" in ok.output
        assert ET.fromstring(report.read_text()).get("failures") == "0"
        slower = runner.invoke(app, [*gate, "--strategy-id", str(ids["v2"])])
        assert slower.exit_code == 1, slower.output + "".join(lines)
        assert "❌ **Shardlab check failed**" in slower.output
        assert "(max_regression_pct)" in slower.output and "**FAIL**" in slower.output
        refused = runner.invoke(app, [*gate, "--strategy-id", "999"])
        assert refused.exit_code == 2
        assert "POST /api/checks: 404" in refused.output and "999" in refused.output
        wrong = runner.invoke(app, [*gate[:3], "--token", "nope", *gate[5:], "--strategy-id", "1"])
        assert wrong.exit_code == 2 and "401" in wrong.output
        # a fresh team, with only a token: the model by preset, the strategy inline
        fresh = token_for(settings, "gamma", "ci")
        sets = [arg for key, value in TINY.items() for arg in ("--set", f"{key}={value}")]
        inline = runner.invoke(app, [*gate[:3], "--token", fresh, "--preset", "llama3-8b", *sets,
                                     "--mesh", "dp=4", "--template", "dp", "--cluster",
                                     "h100-sxm-1x8", "--max-fallback-ops", "0",
                                     "--timeout", "120"])  # fmt: skip
        assert inline.exit_code == 0, inline.output + "".join(lines)
        assert "✅ **Shardlab check passed**" in inline.output
        # full-size Llama-3-8B under plain data parallelism needs 161 GB a rank, of 80
        oom = runner.invoke(app, [*gate[:3], "--token", fresh, "--preset", "llama3-8b",
                                  "--mesh", "dp=8", "--template", "dp", "--cluster",
                                  "h100-sxm-1x8", "--timeout", "300"])  # fmt: skip
        assert oom.exit_code == 1, oom.output + "".join(lines)
        assert "(must_fit)" in oom.output and "| must_fit |" in oom.output
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_server_flags_name_what_is_missing() -> None:
    """`--server` needs one model (`--model-id` or `--preset`) and one strategy
    (`--strategy-id` or `--mesh`); misuse exits 2 before any request."""
    base = ["check", "--server", "http://127.0.0.1:9", "--token", "t", "--cluster", "h100-sxm-1x8"]
    for extra, named in (
        ([], "--model-id N, or --preset NAME"),
        (["--preset", "llama3-8b"], "--strategy-id M, or --mesh"),
        (["--preset", "llama3-8b", "--model-id", "1", "--mesh", "dp=2"], "--model-id N, or"),
        (["--model-id", "1", "--set", "layers=2", "--strategy-id", "1"], "--set applies"),
        (["--model-id", "1", "--strategy-id", "1", "--template", "dp"], "apply to --mesh"),
        (["--model-id", "1", "--mesh", "dp=four"], "dp=four"),
        (["--preset", "llama3-8b", "--set", "layers", "--mesh", "dp=2"], "key=value"),
    ):
        result = runner.invoke(app, [*base, *extra])
        assert result.exit_code == 2 and named in result.output, (extra, result.output)
