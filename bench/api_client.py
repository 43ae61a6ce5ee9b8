"""A minimal HTTP/1.1 client on asyncio streams for the load benchmarks, and server helpers.

httpx's `AsyncClient` spends more CPU per request than the server does on a cheap endpoint
on a 2-core machine, so load measured through it measures the client. `Connection` does one
keep-alive connection: a request line, headers, an optional body; the answer's status,
body (Content-Length) and headers.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import time
from pathlib import Path

import httpx

START_TIMEOUT_S = 60.0


class Connection:
    """One keep-alive HTTP/1.1 connection to `host:port`, with `headers` on every request."""

    def __init__(self, host: str, port: int, headers: dict[str, str]) -> None:
        self.host, self.port = host, port
        self.headers = headers
        self.streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def get(self, path: str) -> tuple[int, bytes]:
        status, body, _ = await self.request("GET", path)
        return status, body

    async def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        extra: dict[str, str] | None = None,
    ) -> tuple[int, bytes, dict[str, str]]:
        """Send one request; its status, body and (lower-cased) headers."""
        if self.streams is None:
            self.streams = await asyncio.open_connection(self.host, self.port)
        reader, writer = self.streams
        fields = {**self.headers, **(extra or {})}
        if body is not None:
            fields |= {"Content-Type": "application/json", "Content-Length": str(len(body))}
        head = "".join(f"{k}: {v}\r\n" for k, v in fields.items())
        writer.write(f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n{head}\r\n"
                     .encode() + (body or b""))  # fmt: skip
        raw = await reader.readuntil(b"\r\n\r\n")
        status_line, *lines = raw.decode("latin-1").split("\r\n")
        answer: dict[str, str] = {}
        for line in lines:
            name, _, value = line.partition(":")
            answer[name.strip().lower()] = value.strip()
        if "content-length" not in answer:
            raise ValueError(f"answer without Content-Length: {status_line}")
        data = await reader.readexactly(int(answer["content-length"]))
        if answer.get("connection", "").lower() == "close":
            await self.close()
        return int(status_line.split()[1]), data, answer

    async def close(self) -> None:
        if self.streams is not None:
            writer = self.streams[1]
            self.streams = None
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def wait_healthy(server: subprocess.Popen[bytes], base: str, log: Path) -> None:
    """Wait until `base/healthz` answers 200; RuntimeError with the log if it never does."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"server exited with {server.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(f"{base}/healthz", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"server not healthy after {START_TIMEOUT_S:.0f} s:\n{log.read_text()}")
