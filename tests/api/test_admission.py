"""Admission control (`backend/admission.py`): requests beyond the slots wait in the event
loop, writes also for a write slot; one that cannot get a slot in time is a 503 with
Retry-After in the API's error form, never a stall. The app here is a stand-in that holds
its slot for a while, so the test needs no database."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from backend.admission import AdmissionMiddleware, Slots


async def _slow_app(scope: Any, receive: Any, send: Any) -> None:
    await asyncio.sleep(0.2)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


async def _call(app: Any, method: str, path: str) -> tuple[int, dict[str, str], bytes]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app({"type": "http", "method": method, "path": path, "headers": []}, receive, send)
    headers = {k.decode(): v.decode() for k, v in sent[0].get("headers", [])}
    return sent[0]["status"], headers, sent[1]["body"]


def _run(slots: Slots, calls: list[tuple[str, str]]) -> list[tuple[int, dict[str, str], bytes]]:
    app = AdmissionMiddleware(_slow_app, slots)

    async def main() -> list[tuple[int, dict[str, str], bytes]]:
        return await asyncio.gather(*(_call(app, m, p) for m, p in calls))

    return asyncio.run(main())


def test_requests_beyond_the_slots_wait_then_get_503_with_retry_after() -> None:
    start = time.monotonic()
    answers = _run(Slots(total=2, writes=1, wait_s=0.1), [("GET", "/api/plans/1")] * 5)
    assert time.monotonic() - start < 1.0  # refused at the wait limit: no stall
    statuses = sorted(status for status, _, _ in answers)
    assert statuses == [200, 200, 503, 503, 503]
    refused = next(a for a in answers if a[0] == 503)
    assert refused[1]["retry-after"] == "1"
    body = json.loads(refused[2])
    assert body["code"] == "overloaded" and "0.1 s" in body["message"]


def test_waiting_requests_are_served_when_a_slot_frees() -> None:
    answers = _run(Slots(total=2, writes=1, wait_s=5.0), [("GET", "/api/plans/1")] * 5)
    assert [status for status, _, _ in answers] == [200] * 5


def test_writes_share_fewer_slots_and_leave_reads_room() -> None:
    calls = [("POST", "/api/plans")] * 3 + [("GET", "/api/plans/1")] * 2
    answers = _run(Slots(total=3, writes=1, wait_s=0.15), calls)
    writes, reads = answers[:3], answers[3:]
    assert sorted(s for s, _, _ in writes) == [200, 503, 503]  # one write slot, 0.2 s each
    assert [s for s, _, _ in reads] == [200, 200]  # reads were not stuck behind writes


def test_a_full_queue_is_refused_at_once_and_other_paths_pass() -> None:
    start = time.monotonic()
    others = [("GET", "/index.html"), ("GET", "/api/jobs/1/events")]
    answers = _run(Slots(total=1, writes=1, wait_s=5.0, queue=1), [("GET", "/api/a")] * 3 + others)
    assert time.monotonic() - start < 1.0  # the refused ones did not wait out the 5 s
    api = [s for s, _, _ in answers[:3]]
    assert 200 in api and 503 in api
    assert [s for s, _, _ in answers[3:]] == [200, 200]  # not admitted here: never refused
