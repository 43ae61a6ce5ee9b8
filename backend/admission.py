"""Admission control: at most as many API requests run at once as the database pool has
connections, so no request ever waits for a connection while holding a thread.

Why: FastAPI runs the request's session dependency and the endpoint in a thread pool (40
threads). With more requests in flight than pooled connections, threads holding no
connection wait for one while the requests that hold connections wait for a thread to
finish in: under 50 clients the service froze for the pool's 30 s timeout and answered 500.

Here a request waits for a slot in the event loop, holding neither a thread nor a
connection. Writes also take one of the fewer write slots first (on SQLite, where writes are
serialized by the database anyway, so a burst of writes cannot fill every slot and stall the
reads behind them). A request that cannot get a slot within `wait_s`, or arrives while
`queue` requests are already waiting, is answered 503 with `Retry-After` at once: overload
is refused, never a stall. Event streams (`.../events`) hold a slot only per poll (they open
short sessions), so they are not admitted here.
"""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass, field
from typing import Any

import anyio.to_thread
from sqlalchemy import Engine
from starlette.types import ASGIApp, Receive, Scope, Send

from backend.settings import Settings

WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})


@dataclass
class Slots:
    """The limits: `total` requests at once, `writes` of them writing; `wait_s` the longest
    wait for a slot; `queue` the most requests waiting."""

    total: int
    writes: int
    wait_s: float = 10.0
    queue: int = 500
    #: created in the event loop on first use
    _all: asyncio.Semaphore | None = field(default=None, repr=False)
    _writes: asyncio.Semaphore | None = field(default=None, repr=False)
    waiting: int = 0

    def semaphores(self) -> tuple[asyncio.Semaphore, asyncio.Semaphore]:
        """The two semaphores, made in the running loop on first use; the loop's thread pool
        is widened then so that every admitted request can run its session dependency and
        its endpoint at once (two threads each)."""
        if self._all is None or self._writes is None:
            self._all, self._writes = asyncio.Semaphore(self.total), asyncio.Semaphore(self.writes)
            limiter = anyio.to_thread.current_default_thread_limiter()
            limiter.total_tokens = max(limiter.total_tokens, 2 * self.total + 8)
        return self._all, self._writes


class AdmissionMiddleware:
    """Admit `/api/` requests within `slots` (see the module docstring)."""

    def __init__(self, app: ASGIApp, slots: Slots) -> None:
        self.app, self.slots = app, slots

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith("/api/") or path.endswith("/events"):
            await self.app(scope, receive, send)
            return
        slots = self.slots
        if slots.waiting >= slots.queue:
            await _busy(send, slots, "too many requests are waiting")
            return
        everything, writes = slots.semaphores()
        held: list[asyncio.Semaphore] = []
        slots.waiting += 1
        try:
            deadline = asyncio.get_running_loop().time() + slots.wait_s
            for semaphore in (writes, everything) if scope["method"] in WRITES else (everything,):
                if semaphore.locked():  # wait, within the deadline (a task and a timer)
                    left = deadline - asyncio.get_running_loop().time()
                    await asyncio.wait_for(semaphore.acquire(), max(left, 0.0))
                else:  # a free slot: taken at once, without the cost of `wait_for`
                    await semaphore.acquire()
                held.append(semaphore)
        except TimeoutError:
            for semaphore in held:
                semaphore.release()
            await _busy(send, slots, f"no request slot freed within {slots.wait_s:g} s")
            return
        finally:
            slots.waiting -= 1
        try:
            await self.app(scope, receive, send)
        finally:
            for semaphore in held:
                semaphore.release()


async def _busy(send: Send, slots: Slots, why: str) -> None:
    """503 `overloaded` with Retry-After, in the API's error form."""
    body: dict[str, Any] = {
        "code": "overloaded",
        "message": f"the service is busy ({why}); retry after the Retry-After seconds",
        "detail": {"slots": slots.total, "waiting": slots.waiting},
    }
    data = json.dumps(body).encode()
    retry = str(max(1, math.ceil(slots.wait_s / 5)))
    await send({
        "type": "http.response.start",
        "status": 503,
        "headers": [(b"content-type", b"application/json"), (b"retry-after", retry.encode()),
                    (b"content-length", str(len(data)).encode())],
    })  # fmt: skip
    await send({"type": "http.response.body", "body": data})


def admission_slots(settings: Settings, engine: Engine) -> Slots:
    """The service's slots: `api_slots` in all; writes 2 on SQLite, half on PostgreSQL,
    unless `api_write_slots` says."""
    writes = settings.api_write_slots or (2 if engine.dialect.name == "sqlite" else 0)
    writes = writes or max(1, settings.api_slots // 2)
    return Slots(settings.api_slots, min(writes, settings.api_slots), settings.api_wait_s)
