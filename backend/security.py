"""Browser-facing protections: security headers on every answer, and an Origin check on writes
made with the session cookie.

- Every HTTP answer (UI, API, errors) gets a Content-Security-Policy (`CSP`: scripts, workers
  and connections only from the service itself, no inline scripts; inline styles allowed, as
  the UI and Plotly set `style` attributes and inject <style>; not framed), `X-Frame-Options:
  DENY`, `X-Content-Type-Options: nosniff` and `Referrer-Policy: same-origin`. The API docs
  page (`/api/docs`, FastAPI's Swagger UI from its CDN with an inline bootstrap script) gets
  `DOCS_CSP` instead.
- A write (POST, PUT, PATCH, DELETE) authenticated by the session cookie alone (no
  `Authorization` header) whose `Origin` names another site is refused with 403
  `forbidden_origin` before the application sees it: a page elsewhere cannot act with a
  logged-in browser's cookie. Requests with a bearer token and requests without `Origin`
  (curl, scripts) are not concerned; an `Authorization` header without a token (empty) does
  not make a cookie request a token request (and is refused 401 by `deps.principal_of`).
- An unexpected error (a bug) is answered here, inside Starlette's own last resort (which
  answers `text/plain` without these headers): a JSON 500 `internal_error` with a short
  reference, the traceback logged under it, the headers on it like on every answer.
"""

from __future__ import annotations

import logging
import secrets
from urllib.parse import urlsplit

from fastapi import FastAPI
from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from backend.auth import SESSION_COOKIE, bearer_secret
from backend.errors import error_body
from backend.json_response import SafeJSONResponse

CSP = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data:",
        "font-src 'self'",
        "connect-src 'self'",
        "worker-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    )
)
#: FastAPI's Swagger UI loads from jsDelivr and starts with an inline script
DOCS_CSP = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self' 'unsafe-inline' https://cdn.jsdelivr.net",
        "style-src 'self' 'unsafe-inline' https://cdn.jsdelivr.net",
        "img-src 'self' data: https://fastapi.tiangolo.com",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "frame-ancestors 'none'",
    )
)
DOCS_PATH = "/api/docs"
SECURITY_HEADERS = {
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}
log = logging.getLogger("shardlab.api")

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def security_headers(path: str) -> dict[str, str]:
    """The headers every answer to a request for `path` carries."""
    csp = DOCS_CSP if path == DOCS_PATH else CSP
    return {"Content-Security-Policy": csp, **SECURITY_HEADERS}


def foreign_origin(scope: Scope) -> str | None:
    """The `Origin` of a cookie-authenticated write from another site, else None.

    The origin is compared by host and port with the request's `Host` (not by scheme, so
    that a TLS-terminating proxy in front of plain HTTP does not refuse the UI's own writes).
    """
    if scope["method"] not in WRITE_METHODS:
        return None
    headers = Headers(scope=scope)
    origin = headers.get("origin")
    if origin is None or bearer_secret(headers.get("authorization", "")) is not None:
        return None
    if not _has_session_cookie(headers.get("cookie", "")):
        return None
    host = headers.get("host", "").lower()
    if origin.lower() == "null" or urlsplit(origin).netloc.lower() != host:
        return origin
    return None


def _has_session_cookie(cookie_header: str) -> bool:
    names = (part.split("=", 1)[0].strip() for part in cookie_header.split(";"))
    return SESSION_COOKIE in names


def forbidden_origin_response(origin: str) -> SafeJSONResponse:
    """403 `forbidden_origin`: the write came from a page of another site."""
    body = error_body(
        "forbidden_origin",
        f"cross-site request refused: origin {origin!r} is not this server's",
        origin=origin,
    )
    return SafeJSONResponse(body, status_code=403)


def internal_error_response(scope: Scope) -> SafeJSONResponse:
    """500 `internal_error` for a bug met while answering `scope` (call it in the `except`:
    the traceback is logged under the reference the answer gives)."""
    reference = secrets.token_hex(4)
    log.exception("%s %s: unexpected error, reference %s", scope["method"], scope["path"],
                  reference)  # fmt: skip
    body = error_body(
        "internal_error",
        f"the service failed unexpectedly; report reference {reference} (the server log has "
        "the details)",
        reference=reference,
    )
    return SafeJSONResponse(body, status_code=500)


class SecurityMiddleware:
    """Pure ASGI: adds `security_headers` to every answer; refuses foreign-origin writes."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        extra = security_headers(scope["path"])

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in extra.items():
                    headers.setdefault(name, value)
            await send(message)

        origin = foreign_origin(scope)
        if origin is not None:
            await forbidden_origin_response(origin)(scope, receive, send_with_headers)
            return
        started = False

        async def send_tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send_with_headers(message)

        try:
            await self.app(scope, receive, send_tracked)
        except Exception:
            if started:  # part of the answer is out: nothing left to say but the log's
                raise
            await internal_error_response(scope)(scope, receive, send_with_headers)


def install_security(app: FastAPI) -> None:
    """Add the middleware; call it last so that it wraps every other answer (413s too)."""
    app.add_middleware(SecurityMiddleware)
