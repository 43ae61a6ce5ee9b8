"""The service skeleton: health, presets, error bodies, the UI, a real `shardlab serve`."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from fastapi.testclient import TestClient

from backend.app import create_app

client = TestClient(create_app())


def test_healthz() -> None:
    assert client.get("/healthz").json() == {"status": "ok"}


def test_presets_listing_and_detail() -> None:
    names = [p["name"] for p in client.get("/api/presets").json()]
    assert "llama3-8b" in names and "mlp_demo" in names
    detail = client.get("/api/presets/gpt2").json()
    assert detail["params"] == 124_439_808 and detail["layers"] == 12


def test_unknown_preset_is_a_404_with_code_message_detail() -> None:
    response = client.get("/api/presets/llama9")
    assert response.status_code == 404
    assert response.json() == {
        "code": "invalid_preset",
        "message": response.json()["message"],
        "detail": {"preset": "llama9"},
    }
    assert "unknown model preset 'llama9'" in response.json()["message"]


def test_ui_page_and_openapi() -> None:
    page = client.get("/")
    assert page.status_code == 200 and "<h1>Shardlab</h1>" in page.text
    assert "/api/presets" in client.get("/api/openapi.json").json()["paths"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_shardlab_serve_answers_healthz() -> None:
    port = _free_port()
    exe = Path(sys.executable).parent / "shardlab"
    proc = subprocess.Popen(
        [str(exe), "serve", "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                    assert r.status == 200
                    break
            except OSError:
                assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                assert time.monotonic() < deadline, "serve did not answer within 30 s"
                time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
