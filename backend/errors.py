"""Every error the API returns has the body `{code, message, detail}` and a 4xx status.

- `ApiError`: raised by routers for user mistakes (not found, conflict, forbidden, ...).
- `ShardlabError` from the engine (a bad mesh axis, placement, preset, graph): 422 unless its
  code maps to another status (`not_found` -> 404).
- FastAPI's request validation: 422 `invalid_request`, the message naming the first bad field
  by its location (`body.mesh`, `query.limit`; an error whose context holds `at`, a path
  inside the field, is located there: `body.options.passes`). A JSON body too deeply nested
  for the parser is a 422 `invalid_request` too (`shardlab.user_json.MAX_JSON_DEPTH`).
- Any other HTTP error keeps its status with code `http_<status>`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from backend.json_response import SafeJSONResponse
from shardlab.errors import ShardlabError
from shardlab.user_json import path_text, too_deep

STATUS_BY_CODE = {"not_found": 404, "invalid_preset": 404}


class ApiError(Exception):
    """A user mistake the API answers with `status` and `{code, message, detail}`; `headers`
    go on the answer too (a 429's `Retry-After`)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        **detail: Any,
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.detail = status, code, message, detail
        self.headers = headers

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "detail": self.detail}


def not_found(what: str, ident: object) -> ApiError:
    """404 for a resource that does not exist or belongs to another team (indistinguishable)."""
    return ApiError(404, "not_found", f"{what} {ident} not found", resource=what, id=ident)


@contextmanager
def user_input(code: str, what: str, **detail: Any) -> Iterator[None]:
    """Turn a parsing error on user data (ValueError, KeyError, ...) into a 422 naming `what`."""
    try:
        yield
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise ApiError(422, code, f"{what}: {exc}", **detail) from None


def error_body(code: str, message: str, **detail: Any) -> dict[str, Any]:
    return {"code": code, "message": message, "detail": detail}


def _location(error: Any) -> str:
    """`body.options.passes`: the error's location, extended by its context's `at`."""
    where = ".".join(str(part) for part in error.get("loc", ()))
    inside = path_text(tuple((error.get("ctx") or {}).get("at", ())))
    return ".".join(part for part in (where, inside) if part)


def _too_deep() -> SafeJSONResponse:
    """The answer to a body the JSON parser gave up on (RecursionError)."""
    message = f"the JSON body is {too_deep().message}"
    errors = [{"loc": "body", "msg": message, "type": "too_deep"}]
    return SafeJSONResponse(error_body("invalid_request", f"body: {message}", errors=errors), 422)


def install_error_handlers(app: FastAPI) -> None:
    """Route every error type to a `{code, message, detail}` JSON answer."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> SafeJSONResponse:
        return SafeJSONResponse(exc.to_dict(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(ShardlabError)
    async def shardlab_error(request: Request, exc: ShardlabError) -> SafeJSONResponse:
        return SafeJSONResponse(exc.to_dict(), status_code=STATUS_BY_CODE.get(exc.code, 422))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> SafeJSONResponse:
        errors = [
            {
                "loc": _location(e),
                "msg": str(e.get("msg", "")),
                "type": e.get("type"),
            }
            for e in exc.errors()
        ]
        first = errors[0] if errors else {"loc": "request", "msg": "invalid"}
        message = f"{first['loc']}: {first['msg']}"
        return SafeJSONResponse(error_body("invalid_request", message, errors=errors), 422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> SafeJSONResponse:
        if exc.status_code == 400 and isinstance(exc.__cause__, RecursionError):
            return _too_deep()  # FastAPI's "There was an error parsing the body"
        body = error_body(f"http_{exc.status_code}", str(exc.detail))
        return SafeJSONResponse(body, status_code=exc.status_code, headers=exc.headers)
