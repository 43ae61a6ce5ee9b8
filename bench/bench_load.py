"""Mixed reads and writes against a real service, on SQLite and on PostgreSQL; and faults.

**Load.** `shardlab serve` (one uvicorn process and its job worker) on a fresh database with
built plans of one team. Then 50 and 100 clients for `DURATION_S` each, every client on its
own keep-alive connection issuing one request after another: half `GET /api/plans/{id}`, a
quarter `GET /api/plans` (a page of 50), a quarter `POST /api/plans` (a tiny plan that the
worker then builds). What the service may refuse on purpose is a 429 with `Retry-After`
(a team's queue full, its request rate); anything else that is not 2xx is an error, and so
is a request with no answer within `REQUEST_TIMEOUT_S`.

**Faults.** The same load at 20 clients while the worker is killed with SIGKILL in the middle
of a job, and then the server in the middle of writes; both are started again. Creates
carry an `Idempotency-Key`, and a client whose request failed (connection lost) retries it
with the same key, as a careful CI script would. Afterwards every plan a client was told
about (202) must exist and be built (else it is lost), and no key may have made two plans
(else a duplicate). Recovery is the time from a restart to the first answered request
(server) or to the next job finished (worker).

The client is `bench_api`'s minimal HTTP/1.1 client on asyncio streams (httpx costs more CPU
per request than the server on a 2-core machine). Call `run()` from a guarded main.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text

from backend import migrate
from backend.settings import Settings
from bench.api_client import Connection, free_port, wait_healthy
from bench.bench_api import TINY, _token
from bench.common import Section

DURATION_S = 30.0
CLIENT_COUNTS = (50, 100)
FAULT_CLIENTS = 20
PLANS = 20
REQUEST_TIMEOUT_S = 30.0
HOST = "127.0.0.1"
CLUSTER = "h100-sxm-8x8"
POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"


@dataclass
class Tally:
    """What one load run saw, per kind of request."""

    latencies: dict[str, list[float]] = field(default_factory=dict)
    statuses: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    created: dict[str, int] = field(default_factory=dict)  # idempotency key -> plan id

    def add(self, kind: str, status: int, seconds: float) -> None:
        self.statuses[f"{kind} {status}"] += 1
        if 200 <= status < 300:
            self.latencies.setdefault(kind, []).append(seconds)

    def p(self, kind: str, q: int) -> float | None:
        values = self.latencies.get(kind, [])
        if len(values) < 2:
            return None
        return statistics.quantiles(values, n=100, method="inclusive")[q - 1]

    def count(self, predicate: Any) -> int:
        return sum(n for key, n in self.statuses.items() if predicate(int(key.split()[-1])))


# -- a service to load ---------------------------------------------------------------------


@dataclass
class Service:
    """`shardlab serve --no-worker` and one `shardlab worker`, as separate processes so each
    can be killed alone."""

    env: dict[str, str]
    port: int
    log: Path
    server: subprocess.Popen[bytes] | None = None
    worker: subprocess.Popen[bytes] | None = None

    @property
    def base(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start_server(self) -> None:
        command = [sys.executable, "-m", "backend", "serve", "--no-worker", "--host", HOST,
                   "--port", str(self.port)]  # fmt: skip
        with self.log.open("ab") as out:
            self.server = subprocess.Popen(command, env=self.env, stdout=out, stderr=out)
        wait_healthy(self.server, self.base, self.log)

    def start_worker(self) -> None:
        with self.log.open("ab") as out:
            self.worker = subprocess.Popen([sys.executable, "-m", "backend", "worker"],
                                           env=self.env, stdout=out, stderr=out)  # fmt: skip

    def kill(self, which: str) -> None:
        proc = self.server if which == "server" else self.worker
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()

    def stop(self) -> None:
        for proc in (self.server, self.worker):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()


@contextlib.contextmanager
def service(database: str, tmp: Path) -> Any:
    """A fresh database (`sqlite` or `postgresql`), migrated, served on a free port."""
    data = tmp / "data"
    if database == "sqlite":
        url = f"sqlite:///{data / 'shardlab.db'}"
    else:
        schema = f"bench_load_{os.getpid()}"
        _reset_schema(schema)
        url = f"{POSTGRES}?options=-csearch_path%3D{schema}"
    # the team's request rate is not limited here: the runs measure what the service holds
    env = {**os.environ, "SHARDLAB_DATA_DIR": str(data), "SHARDLAB_DATABASE_URL": url,
           "SHARDLAB_HEARTBEAT_TIMEOUT_S": "5",
           "SHARDLAB_TEAM_REQUESTS_PER_MINUTE": str(10**9)}  # fmt: skip
    settings = Settings.from_env(env)
    migrate.upgrade(url)
    running = Service(env, free_port(), tmp / f"{database}.log")
    try:
        running.start_server()
        running.start_worker()
        yield running, settings
    finally:
        running.stop()
        if database != "sqlite":
            _drop_schema(f"bench_load_{os.getpid()}")


def _reset_schema(schema: str) -> None:
    from backend.db import make_engine

    engine = make_engine(POSTGRES)
    with engine.begin() as conn:
        conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    engine.dispose()


def _drop_schema(schema: str) -> None:
    from backend.db import make_engine

    engine = make_engine(POSTGRES)
    with engine.begin() as conn:
        conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
    engine.dispose()


def _seed(base: str, headers: dict[str, str]) -> tuple[dict[str, Any], list[int]]:
    """A tiny model and strategy, and PLANS plans of them, built by the worker."""
    with httpx.Client(base_url=base, headers=headers, timeout=60) as client:
        model = client.post("/api/models", json={"name": "tiny", "preset": "llama3-8b",
                                                 "overrides": TINY}).json()  # fmt: skip
        strategy = client.post("/api/strategies", json={"name": "s", "mesh": "dp=2,tp=2",
                               "templates": ["dp", "megatron_tp"]}).json()  # fmt: skip
        body = {"model_id": model["id"], "strategy_id": strategy["id"], "cluster": CLUSTER}
        ids = [client.post("/api/plans", json=body).json()["id"] for _ in range(PLANS)]
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            states = {p["status"] for p in client.get("/api/plans?limit=1000").json()}
            if states == {"succeeded"}:
                return body, ids
            time.sleep(0.5)
    raise RuntimeError(f"seed plans not built: {states}")


# -- clients -------------------------------------------------------------------------------


async def _load(
    port: int, headers: dict[str, str], body: dict[str, Any], plans: list[int], clients: int,
    duration_s: float, tally: Tally, retry: bool = False,
) -> None:  # fmt: skip
    """`clients` clients for `duration_s`: half GET a plan, a quarter list, a quarter POST."""
    stop = time.monotonic() + duration_s
    payload = json.dumps(body).encode()

    async def client(index: int) -> None:
        rng = random.Random(index)
        connection = Connection(HOST, port, headers)
        pending: str | None = None  # an idempotency key to retry
        try:
            while time.monotonic() < stop:
                roll = rng.random()
                if pending is not None or roll >= 0.75:
                    kind, method, path = "POST plan", "POST", "/api/plans"
                    key = pending or uuid.uuid4().hex
                    extra, data = {"Idempotency-Key": key}, payload
                elif roll < 0.5:
                    kind, method = "GET plan", "GET"
                    path, extra, data = f"/api/plans/{rng.choice(plans)}", {}, None
                else:
                    kind, method, path, extra, data = (
                        "GET plans",
                        "GET",
                        "/api/plans?limit=50",
                        {},
                        None,
                    )
                start = time.perf_counter()
                try:
                    asked = connection.request(method, path, data, extra)
                    status, answer, head = await asyncio.wait_for(asked, REQUEST_TIMEOUT_S)
                except (OSError, ValueError, asyncio.IncompleteReadError, TimeoutError) as exc:
                    tally.errors.append(f"{kind}: {type(exc).__name__}")
                    await connection.close()
                    pending = extra.get("Idempotency-Key") if retry and method == "POST" else None
                    if retry:
                        await asyncio.sleep(0.2)
                    continue
                pending = None
                tally.add(kind, status, time.perf_counter() - start)
                if method == "POST" and status == 202:
                    tally.created[extra["Idempotency-Key"]] = int(json.loads(answer)["id"])
                elif status == 429 or status == 503:
                    wait = float(head.get("retry-after", "1"))
                    await asyncio.sleep(min(wait, 2.0))
                elif not 200 <= status < 300:
                    tally.errors.append(f"{kind}: {status} {answer[:160]!r}")
        finally:
            await connection.close()

    await asyncio.gather(*(client(i) for i in range(clients)))


def _server_log_errors(log: Path) -> int:
    """Tracebacks and 500s the server wrote."""
    text_ = log.read_text(errors="replace")
    return text_.count("Traceback") + text_.count('" 500')


# -- the runs ------------------------------------------------------------------------------


def load_run(database: str, clients: int, duration_s: float = DURATION_S) -> tuple[Tally, int]:
    """One mixed-load run; the tally and the server log's tracebacks and 500s."""
    with (
        tempfile.TemporaryDirectory(prefix="shardlab-bench-load-") as tmp,
        service(database, Path(tmp)) as (running, settings),
    ):
        headers = {"Authorization": f"Bearer {_token(settings)}"}
        body, plans = _seed(running.base, headers)
        tally = Tally()
        asyncio.run(_load(running.port, headers, body, plans, clients, duration_s, tally))
        return tally, _server_log_errors(running.log)


@dataclass
class FaultReport:
    tally: Tally
    lost: list[int]
    duplicated: int
    server_recovery_s: float
    worker_recovery_s: float


def fault_run(database: str) -> FaultReport:
    """Load at FAULT_CLIENTS while the worker and then the server are killed and restarted."""
    with (
        tempfile.TemporaryDirectory(prefix="shardlab-bench-fault-") as tmp,
        service(database, Path(tmp)) as (running, settings),
    ):
        headers = {"Authorization": f"Bearer {_token(settings)}"}
        body, plans = _seed(running.base, headers)
        tally = Tally()

        async def scenario() -> tuple[float, float]:
            load = asyncio.create_task(_load(running.port, headers, body, plans, FAULT_CLIENTS,
                                             40.0, tally, retry=True))  # fmt: skip
            await asyncio.sleep(8)
            running.kill("worker")  # mid-job: the queue is never empty under this load
            await asyncio.sleep(2)
            running.start_worker()
            restarted = time.monotonic()
            worker_back = await _next_job_done(running.base, headers, restarted)
            await asyncio.sleep(4)
            running.kill("server")  # mid-write: a quarter of the requests are creates
            await asyncio.sleep(1)
            restarted = time.monotonic()
            await asyncio.to_thread(running.start_server)
            server_back = time.monotonic() - restarted
            await load
            return server_back, worker_back

        server_back, worker_back = asyncio.run(scenario())
        lost, duplicated = _audit(running.base, headers, tally)
        return FaultReport(tally, lost, duplicated, server_back, worker_back)


async def _next_job_done(base: str, headers: dict[str, str], since: float) -> float:
    """Seconds from `since` until the worker finishes a job again."""

    def finished() -> int:
        with httpx.Client(base_url=base, headers=headers, timeout=30) as client:
            jobs = client.get("/api/jobs?limit=1000").json()
        return sum(1 for j in jobs if j["status"] == "succeeded")

    before = await asyncio.to_thread(finished)
    while time.monotonic() - since < 120:
        await asyncio.sleep(0.5)
        with contextlib.suppress(httpx.HTTPError):
            if await asyncio.to_thread(finished) > before:
                return time.monotonic() - since
    return float("inf")


def _audit(base: str, headers: dict[str, str], tally: Tally) -> tuple[list[int], int]:
    """Plans a client was told about that are missing or never built; keys with two plans."""
    with httpx.Client(base_url=base, headers=headers, timeout=60) as client:
        deadline = time.monotonic() + 600
        while True:
            plans = {p["id"]: p for p in _all(client, "/api/plans")}
            waiting = [i for i in tally.created.values()
                       if plans.get(i, {}).get("status") in ("queued", "running")]  # fmt: skip
            if not waiting or time.monotonic() > deadline:
                break
            time.sleep(2)
    lost = [i for i in tally.created.values() if plans.get(i, {}).get("status") != "succeeded"]
    made = len(plans) - PLANS  # plans made during the run
    duplicated = max(0, made - len(set(tally.created.values())))
    return lost, duplicated


def _all(client: httpx.Client, path: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    while True:
        page = client.get(f"{path}?limit=1000&offset={len(rows)}").json()
        rows += page
        if len(page) < 1000:
            return rows


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.1f}"


def run() -> Section:
    section = Section(
        f"Mixed load and faults ({DURATION_S:.0f} s per run; SQLite and PostgreSQL)",
        ["database", "clients", "requests", "429", "errors", "GET plan p50 / p99 ms",
         "GET plans p99 ms", "POST plan p99 ms", "server 500s"],
    )  # fmt: skip
    for database in ("sqlite", "postgresql"):
        for clients in CLIENT_COUNTS:
            tally, server_errors = load_run(database, clients)
            section.rows.append([
                database, str(clients), str(sum(tally.statuses.values())),
                str(tally.count(lambda s: s == 429)), str(len(tally.errors)),
                f"{_ms(tally.p('GET plan', 50))} / {_ms(tally.p('GET plan', 99))}",
                _ms(tally.p("GET plans", 99)), _ms(tally.p("POST plan", 99)),
                str(server_errors),
            ])  # fmt: skip
    for database in ("sqlite", "postgresql"):
        report = fault_run(database)
        section.notes.append(
            f"Faults on {database} ({FAULT_CLIENTS} clients, 40 s): worker killed mid-job, "
            f"then the server mid-write; {len(report.tally.created)} plans created, "
            f"{len(report.lost)} lost, {report.duplicated} duplicated; the server answered "
            f"{report.server_recovery_s:.1f} s after its restart, the restarted worker "
            f"finished a job {report.worker_recovery_s:.1f} s after it started; "
            f"{len(report.tally.errors)} requests failed while a process was down."
        )
    section.notes.append(
        "Each run: `shardlab serve --no-worker` and one `shardlab worker` on a fresh database "
        f"with {PLANS} built plans of one team (a tiny llama: 2 layers, hidden 64), loopback. "
        "Half the requests read one plan, a quarter list 50 plans, a quarter create a plan "
        "(the worker builds them meanwhile, on the same 2 cores). 429 is the service refusing "
        "on purpose (a team's queue or request rate; with Retry-After); errors are any other "
        "non-2xx answer or no answer in 30 s. Goal: no errors, GET plan p99 <= 50 ms at 50 "
        "clients on PostgreSQL; faults lose and duplicate nothing."
    )
    return section
