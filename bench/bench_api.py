"""Latency of the REST API under 50 concurrent clients: one plan's summary and the plan list.

A real server process (`shardlab serve --no-worker`, one uvicorn process) on a free loopback
port, with a fresh SQLite database in a temporary directory. The plans are created over
HTTP (a tiny llama model, a dp x tp strategy) and built by an in-process `Worker` before
anything is measured, so every `GET /api/plans/{id}` answers with a summary. Then 50 clients,
each on one keep-alive connection, issue sequential requests against each endpoint in turn;
each request's wall-clock latency is taken at the client.

The load is sent by a minimal HTTP/1.1 client on asyncio streams (`bench/api_client.py`), not httpx:
on a 2-core machine httpx's `AsyncClient` spent more CPU per request than the server did on
`GET /api/plans/{id}`, so its figures measured the client as much as the server. httpx
still does the setup requests.

Call `run()` from a guarded main (`python -m bench.run`, `python -c ...`): the worker builds
each plan in a spawned child process, which re-imports `__main__`.
"""

from __future__ import annotations

import asyncio
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from backend import migrate
from backend.auth import create_token, ensure_team
from backend.db import make_engine, session_factory, transaction
from backend.settings import Settings
from bench.api_client import Connection, free_port, wait_healthy
from bench.common import Section
from worker.main import Worker

PLANS = 20
CLIENTS = 50
# measured requests per endpoint; the list costs ~3x the summary on the server, so fewer keep
# the whole benchmark near a minute on 2 cores
SUMMARY_REQUESTS = 2000
LIST_REQUESTS = 1000
WARMUP = 2 * CLIENTS  # per endpoint, not measured
CLUSTER = "h100-sxm-8x8"
TINY = {
    "layers": 2,
    "hidden": 64,
    "heads": 4,
    "kv_heads": 2,
    "ffn": 128,
    "vocab": 256,
    "seq": 16,
    "batch": 4,
}
HOST = "127.0.0.1"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Load:
    """The outcome of one endpoint's measured requests."""

    latencies: list[float]  # seconds, successful requests only
    errors: list[str]
    elapsed: float  # seconds, first request sent to last answer received
    server_cpu: float | None  # CPU seconds of the server process meanwhile
    client_cpu: float  # CPU seconds of this (the client's) process meanwhile


def _process_cpu(pid: int) -> float | None:
    """User + system CPU seconds of process `pid` (Linux /proc; None elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _token(settings: Settings) -> str:
    engine = make_engine(settings.database_url)
    try:
        with transaction(session_factory(engine)) as session:
            return create_token(session, ensure_team(session, "bench").id, "bench")
    finally:
        engine.dispose()


def _start_server(env: dict[str, str], port: int, log: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "backend", "serve", "--no-worker"]
    command += ["--host", HOST, "--port", str(port)]
    with log.open("wb") as out:
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)


def _stop_server(server: subprocess.Popen[bytes]) -> None:
    if server.poll() is not None:
        return
    server.terminate()
    try:
        server.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def _created(response: httpx.Response) -> dict[str, Any]:
    if response.status_code not in (201, 202):
        raise RuntimeError(f"{response.request.url}: {response.status_code} {response.text}")
    body: dict[str, Any] = response.json()
    return body


def _create_plans(client: httpx.Client, count: int) -> list[int]:
    """A tiny llama model, one dp x tp strategy, and `count` plans of it (queued)."""
    model = _created(
        client.post("/api/models", json={"name": "tiny", "preset": "llama3-8b", "overrides": TINY})
    )
    strategy = _created(
        client.post(
            "/api/strategies",
            json={"name": "s", "mesh": "dp=2,tp=2", "templates": ["dp", "megatron_tp"]},
        )
    )
    body = {"model_id": model["id"], "strategy_id": strategy["id"], "cluster": CLUSTER}
    return [int(_created(client.post("/api/plans", json=body))["id"]) for _ in range(count)]


def _build_all(settings: Settings) -> int:
    """Run every queued job (each in a child process of the worker)."""
    worker = Worker(settings, "bench-worker")
    try:
        return worker.run_until_empty()
    finally:
        worker.close()


async def _clients(
    port: int, headers: dict[str, str], path: Callable[[int], str], total: int
) -> tuple[list[float], list[str], float]:
    """`total` requests from CLIENTS clients, each sequential on its own keep-alive connection."""
    latencies: list[float] = []
    errors: list[str] = []

    async def client(index: int) -> None:
        connection = Connection(HOST, port, headers)
        try:
            for n in range(index, total, CLIENTS):
                start = time.perf_counter()
                try:
                    status, body = await asyncio.wait_for(
                        connection.get(path(n)), REQUEST_TIMEOUT_S
                    )
                except (OSError, ValueError, asyncio.IncompleteReadError, TimeoutError) as exc:
                    errors.append(f"{type(exc).__name__}: {exc}")
                    await connection.close()  # a fresh connection for the next request
                    continue
                if status == 200:
                    latencies.append(time.perf_counter() - start)
                else:
                    errors.append(f"{status}: {body[:200]!r}")
        finally:
            await connection.close()

    start = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(CLIENTS)))
    return latencies, errors, time.perf_counter() - start


def _load(
    server: subprocess.Popen[bytes],
    port: int,
    headers: dict[str, str],
    path: Callable[[int], str],
    requests: int,
) -> Load:
    asyncio.run(_clients(port, headers, path, WARMUP))
    server_before, client_before = _process_cpu(server.pid), _own_cpu()
    latencies, errors, elapsed = asyncio.run(_clients(port, headers, path, requests))
    server_after, client_cpu = _process_cpu(server.pid), _own_cpu() - client_before
    server_cpu = None
    if server_before is not None and server_after is not None:
        server_cpu = server_after - server_before
    return Load(latencies, errors, elapsed, server_cpu, client_cpu)


def _row(label: str, load: Load) -> list[str]:
    done = len(load.latencies) + len(load.errors)
    p50 = p99 = "-"
    if len(load.latencies) >= 2:
        cuts = statistics.quantiles(load.latencies, n=100, method="inclusive")
        p50, p99 = f"{cuts[49] * 1e3:.1f}", f"{cuts[98] * 1e3:.1f}"
    throughput = len(load.latencies) / load.elapsed
    return [label, str(done), str(CLIENTS), p50, p99, f"{throughput:,.0f}", str(len(load.errors))]


def _cpu_note(label: str, load: Load) -> str:
    done = len(load.latencies) + len(load.errors)
    server = "?" if load.server_cpu is None else f"{load.server_cpu / done * 1e3:.2f}"
    return f"{label}: server {server} ms, client {load.client_cpu / done * 1e3:.2f} ms"


def _uvicorn_stack() -> str:
    """The event loop and HTTP parser uvicorn picks here ("auto": the C ones if installed)."""
    from importlib.util import find_spec

    loop = "uvloop" if find_spec("uvloop") else "asyncio loop"
    return f"{loop}, {'httptools' if find_spec('httptools') else 'h11'}"


def _load_average() -> str:
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except (OSError, AttributeError):
        return "?"


def run() -> Section:
    section = Section(
        f"REST API latency ({CLIENTS} concurrent clients, loopback, SQLite)",
        ["endpoint", "requests", "concurrency", "p50 ms", "p99 ms", "throughput req/s",
         "errors"],
    )  # fmt: skip
    loads: dict[str, Load] = {}
    with tempfile.TemporaryDirectory(prefix="shardlab-bench-api-") as tmp:
        data_dir = Path(tmp) / "data"
        url = f"sqlite:///{data_dir / 'shardlab.db'}"
        env = {
            "SHARDLAB_DATA_DIR": str(data_dir),
            "SHARDLAB_DATABASE_URL": url,
            "SHARDLAB_TEAM_REQUESTS_PER_MINUTE": str(10**9),
        }  # measured: not limited
        settings = Settings.from_env(env)
        migrate.upgrade(url)
        headers = {"Authorization": f"Bearer {_token(settings)}"}
        port = free_port()
        base = f"http://{HOST}:{port}"
        log = Path(tmp) / "server.log"
        server = _start_server({**os.environ, **env}, port, log)
        try:
            wait_healthy(server, base, log)
            with httpx.Client(base_url=base, headers=headers, timeout=60.0) as client:
                plan_ids = _create_plans(client, PLANS)
                started = time.perf_counter()
                built = _build_all(settings)
                build_s = time.perf_counter() - started
                listing = client.get("/api/plans")
                one = client.get(f"/api/plans/{plan_ids[0]}")
            statuses = [p["status"] for p in listing.json()]
            if built != PLANS or statuses != ["succeeded"] * PLANS:
                raise RuntimeError(f"plans not all built ({built} jobs run): {statuses}")
            load_average = _load_average()
            endpoints: list[tuple[str, Callable[[int], str], int]] = [
                (
                    "GET /api/plans/{id}",
                    lambda n: f"/api/plans/{plan_ids[n % PLANS]}",
                    SUMMARY_REQUESTS,
                ),
                ("GET /api/plans", lambda n: "/api/plans", LIST_REQUESTS),
            ]
            for label, path, requests in endpoints:
                loads[label] = _load(server, port, headers, path, requests)
                section.rows.append(_row(label, loads[label]))
        finally:
            _stop_server(server)
    section.notes.append(
        f"Server: `shardlab serve --no-worker`, one uvicorn process ({_uvicorn_stack()}, "
        f"access log on; `GET /api/plans/{{id}}` answered by the fast lane of "
        f"`backend/fast_reads.py` in the event loop, the list by FastAPI in its thread pool), "
        f"on {HOST}. "
        f"Database: SQLite (WAL) in a temporary directory, holding {PLANS} built plans of one "
        f"team (tiny llama3-8b: {TINY['layers']} layers, hidden {TINY['hidden']}; dp=2,tp=2; "
        f"costed on {CLUSTER}); building them with the worker took {build_s:.1f} s. "
        f"`GET /api/plans/{{id}}` cycles through the {PLANS} plans ({len(one.content):,}-byte "
        f"JSON answer); `GET /api/plans` returns all {PLANS} ({len(listing.content):,} bytes)."
    )
    section.notes.append("")
    section.notes.append(
        f"Client: {CLIENTS} asyncio tasks in the benchmark's process, each on its own "
        f"keep-alive connection sending GETs back to back (closed loop), through a minimal "
        f"HTTP/1.1 client on asyncio streams; {WARMUP} unmeasured requests per endpoint first. "
        f"Latency: request written to whole body read, at the client. Throughput: successful "
        f"requests / wall-clock time of the run. Errors: non-200 answers, broken connections, "
        f"timeouts ({REQUEST_TIMEOUT_S:.0f} s). Client and server share the machine's "
        f"{os.cpu_count()} cores (1-minute load average {load_average} before the runs). "
        f"CPU per request: "
        + "; ".join(_cpu_note(label, load) for label, load in loads.items())
        + "."
    )
    errors = [e for load in loads.values() for e in load.errors]
    if errors:
        section.notes.append("")
        section.notes.append(f"First errors: {'; '.join(errors[:3])}")
    return section
