"""`Idempotency-Key` on the POSTs that create: a retried request gets the first answer again.

A create POST (`IDEMPOTENT_PATHS`) sent with the header `Idempotency-Key: <key>` (1 to 200
characters, unique per team) is handled by `IdempotencyMiddleware`:

1. the key is reserved: a row of `idempotency_keys` (team, key, route, SHA-256 of the query
   string and body) with status 0, "in progress", committed before the request runs. The
   unique constraint on (team, key) decides between two concurrent first uses;
2. the request runs; a 2xx JSON answer is stored on the row (status and body) and only then
   sent; any other answer (or an exception) frees the key for another try;
3. a later request with the key and the same route and body gets the stored answer again,
   with the header `Idempotent-Replayed: true`, and creates nothing. One that arrives while
   the first is still running waits for it (up to `WAIT_S`, then 409).

The same key with another body or route is a 409 `idempotency_conflict`; an empty key or one
over 200 characters a 422. Requests without the header, or not authenticated (the
application answers those 401), pass through untouched. Keys are kept `KEEP_S` (a day); a
reservation older than `STALE_S` (its server died mid-request) may be taken over.

Token creation is left out on purpose: replaying it would mean storing the token's secret.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from backend.db import transaction
from backend.errors import ApiError, error_body
from backend.json_response import SafeJSONResponse
from backend.orm import IdempotencyKey

HEADER = "idempotency-key"
REPLAYED_HEADER = "Idempotent-Replayed"
MAX_KEY_LENGTH = 200
#: the POSTs that create something and honour the header
IDEMPOTENT_PATHS = frozenset(
    {
        "/api/models",
        "/api/models/upload",
        "/api/strategies",
        "/api/clusters",
        "/api/plans",
        "/api/verifications",
        "/api/comparisons",
        "/api/searches",
        "/api/checks",
    }
)
#: status of a reserved key whose request is still running
PENDING = 0
#: how long a retry waits for the first request with its key to finish
WAIT_S = 10.0
POLL_S = 0.05
#: a reservation this old belongs to a request that will never finish
STALE_S = 300.0
#: how long a key (and its answer) is kept
KEEP_S = 24 * 3600.0


@dataclass(frozen=True, slots=True)
class Stored:
    """The row already holding a key: the request it was used for and its answer."""

    route: str
    request_hash: str
    status_code: int
    response: dict[str, Any] | None


def request_hash(query_string: bytes, body: bytes) -> str:
    """SHA-256 of what makes two requests to one route the same request."""
    return hashlib.sha256(query_string + b"\n" + body).hexdigest()


def _aware(moment: datetime) -> datetime:
    """SQLite returns naive datetimes; they are stored in UTC."""
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _try_claim(session: Session, team_id: int, key: str, route: str, digest: str) -> Stored | None:
    """Reserve `key` in this transaction (None), or the row holding it."""
    now = datetime.now(UTC)
    session.execute(
        delete(IdempotencyKey).where(
            IdempotencyKey.team_id == team_id,
            IdempotencyKey.created_at < now - timedelta(seconds=KEEP_S),
        )
    )
    row = session.scalar(
        select(IdempotencyKey).where(IdempotencyKey.team_id == team_id, IdempotencyKey.key == key)
    )
    if row is None:
        session.add(
            IdempotencyKey(
                team_id=team_id,
                key=key,
                route=route,
                request_hash=digest,
                status_code=PENDING,
                created_at=now,
            )
        )
        session.flush()
        return None
    stale = now - _aware(row.created_at) > timedelta(seconds=STALE_S)
    if row.status_code == PENDING and stale:
        row.route, row.request_hash, row.created_at = route, digest, now
        return None
    return Stored(row.route, row.request_hash, row.status_code, row.response)


def claim(
    factory: sessionmaker[Session], team_id: int, key: str, route: str, digest: str
) -> Stored | None:
    """Reserve `key` for this request (None), or the row holding it: the finished answer of
    the same request, another request's row (a conflict), or, after waiting `WAIT_S` for
    the same request to finish, its reservation."""
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            with transaction(factory, immediate=True) as session:
                found = _try_claim(session, team_id, key, route, digest)
        except IntegrityError:  # a concurrent first use won the unique constraint: read it
            if time.monotonic() > deadline:
                raise
            continue
        if found is None or found.status_code != PENDING:
            return found
        if (found.route, found.request_hash) != (route, digest) or time.monotonic() > deadline:
            return found
        time.sleep(POLL_S)


def finish(
    factory: sessionmaker[Session], team_id: int, key: str, status: int, body: dict[str, Any]
) -> None:
    """Store the answer of the request holding `key`."""
    with transaction(factory, immediate=True) as session:
        session.execute(
            update(IdempotencyKey)
            .where(IdempotencyKey.team_id == team_id, IdempotencyKey.key == key)
            .values(status_code=status, response=body)
        )


def release(factory: sessionmaker[Session], team_id: int, key: str) -> None:
    """Free `key` after its request failed, so that it may be tried again."""
    with transaction(factory, immediate=True) as session:
        session.execute(
            delete(IdempotencyKey).where(
                IdempotencyKey.team_id == team_id,
                IdempotencyKey.key == key,
                IdempotencyKey.status_code == PENDING,
            )
        )


def team_of(scope: Scope) -> int | None:
    """The caller's team as the application would authenticate it (None: it will be a 401)."""
    from backend.deps import principal_of

    app_state = scope["app"].state
    with app_state.sessions() as session:
        try:
            return principal_of(Request(scope), session).team_id
        except ApiError:
            return None


def stored_answer(stored: Stored, route: str, digest: str) -> SafeJSONResponse:
    """The answer to a request whose key is taken: the replay, or a 409."""
    if (stored.route, stored.request_hash) != (route, digest):
        body = error_body(
            "idempotency_conflict",
            "this Idempotency-Key was already used for another request "
            f"({stored.route}, another body)",
            route=stored.route,
        )
        return SafeJSONResponse(body, status_code=409)
    if stored.status_code == PENDING:
        body = error_body(
            "idempotency_conflict",
            "a request with this Idempotency-Key is still being processed; retry later",
            in_progress=True,
        )
        return SafeJSONResponse(body, status_code=409, headers={"Retry-After": "1"})
    return SafeJSONResponse(
        stored.response, status_code=stored.status_code, headers={REPLAYED_HEADER: "true"}
    )


def invalid_key(key: str) -> SafeJSONResponse | None:
    """422 for a key that is empty or too long, else None."""
    if 1 <= len(key) <= MAX_KEY_LENGTH:
        return None
    msg = f"must be 1 to {MAX_KEY_LENGTH} characters (got {len(key)})"
    loc = "header.Idempotency-Key"
    errors = [{"loc": loc, "msg": msg, "type": "string_length"}]
    return SafeJSONResponse(error_body("invalid_request", f"{loc}: {msg}", errors=errors), 422)


async def read_body(receive: Receive) -> bytes:
    """The whole request body (a size limit outside this middleware still applies)."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def replay_receive(body: bytes, receive: Receive) -> Receive:
    """A `receive` that hands the already-read body to the application once."""
    sent = False

    async def again() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


def json_object(body: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class IdempotencyMiddleware:
    """Pure ASGI: applies `Idempotency-Key` to POSTs of `IDEMPOTENT_PATHS` (see the module)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        key = Headers(scope=scope).get(HEADER) if scope["type"] == "http" else None
        path = str(scope.get("path", "")).rstrip("/")
        if key is None or scope["method"] != "POST" or path not in IDEMPOTENT_PATHS:
            await self.app(scope, receive, send)
            return
        refusal = invalid_key(key)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        body = await read_body(receive)
        receive = replay_receive(body, receive)
        team_id = await run_in_threadpool(team_of, scope)
        if team_id is None:
            await self.app(scope, receive, send)
            return
        factory = scope["app"].state.sessions
        route, digest = f"POST {path}", request_hash(scope.get("query_string", b""), body)
        stored = await run_in_threadpool(claim, factory, team_id, key, route, digest)
        if stored is not None:
            await stored_answer(stored, route, digest)(scope, receive, send)
            return
        await self._run_and_store(scope, receive, send, factory, team_id, key)

    async def _run_and_store(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        factory: sessionmaker[Session],
        team_id: int,
        key: str,
    ) -> None:
        """Run the request holding the reservation; store a 2xx JSON answer before sending it."""
        messages: list[Message] = []

        async def keep(message: Message) -> None:
            messages.append(message)

        try:
            await self.app(scope, receive, keep)
        except BaseException:
            await run_in_threadpool(release, factory, team_id, key)
            raise
        start = next((m for m in messages if m["type"] == "http.response.start"), None)
        status = int(start["status"]) if start is not None else 500
        body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
        answer = json_object(body) if 200 <= status < 300 else None
        if answer is None:
            await run_in_threadpool(release, factory, team_id, key)
        else:
            await run_in_threadpool(finish, factory, team_id, key, status, answer)
        for message in messages:
            await send(message)
