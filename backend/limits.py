"""Request size limit: a pure ASGI middleware answering 413 for bodies over the limit.

A request whose `Content-Length` is over `max_bytes` is answered at once, before the
application sees it. A body without (or lying about) its length is counted as it streams in;
when it grows past the limit, reading it raises inside the application, and whatever the
application would answer then is replaced by the 413 (so nothing is stored from it).
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class RequestTooLarge(Exception):
    """Raised from `receive` when a streamed body passes the limit."""


def _too_large_body(limit: int, size: int, declared: bool) -> bytes:
    """The `{code, message, detail}` answer of a request of `size` bytes (or more)."""
    if declared:
        message = f"request body of {size} bytes exceeds the limit of {limit} bytes"
    else:
        message = f"request body exceeds the limit of {limit} bytes (over {size} bytes received)"
    detail = {"limit_bytes": limit, "size_bytes": size, "declared": declared}
    body = {"code": "request_too_large", "message": message, "detail": detail}
    return json.dumps(body).encode()


async def _answer_413(send: Send, body: bytes) -> None:
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class BodyLimitMiddleware:
    """Answer 413 `request_too_large` to HTTP requests whose body exceeds `max_bytes`."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await _answer_413(send, _too_large_body(self.max_bytes, declared, declared=True))
            return
        state: dict[str, Any] = {"received": 0, "over": False, "started": False}

        async def limited_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                state["received"] += len(message.get("body", b""))
                if state["received"] > self.max_bytes:
                    state["over"] = True
                    raise RequestTooLarge()
            return message

        async def guarded_send(message: Message) -> None:
            if state["over"]:
                # the application answered its own error to the aborted read: ours replaces it
                if message["type"] == "http.response.start" and not state["started"]:
                    state["started"] = True
                    await _answer_413(send, self._streamed_body(state))
                return
            if message["type"] == "http.response.start":
                state["started"] = True
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except RequestTooLarge:
            if not state["started"]:
                state["started"] = True
                await _answer_413(send, self._streamed_body(state))

    def _streamed_body(self, state: dict[str, Any]) -> bytes:
        return _too_large_body(self.max_bytes, int(state["received"]), declared=False)


def _content_length(scope: Scope) -> int | None:
    """The declared body size, or None when absent or malformed."""
    for name, value in scope.get("headers", []):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
