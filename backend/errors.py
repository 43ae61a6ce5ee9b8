"""Every error the API returns has the body `{code, message, detail}` and a 4xx status.

- `ApiError`: raised by routers for user mistakes (not found, conflict, forbidden, ...).
- `ShardlabError` from the engine (a bad mesh axis, placement, preset, graph): 422 unless its
  code maps to another status (`not_found` -> 404).
- FastAPI's request validation: 422 `invalid_request`, the message naming the first bad field
  by its location (`body.mesh`, `query.limit`).
- Any other HTTP error keeps its status with code `http_<status>`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from shardlab.errors import ShardlabError

STATUS_BY_CODE = {"not_found": 404, "invalid_preset": 404}


class ApiError(Exception):
    """A user mistake the API answers with `status` and `{code, message, detail}`."""

    def __init__(self, status: int, code: str, message: str, **detail: Any) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.detail = status, code, message, detail

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


def _location(loc: Any) -> str:
    return ".".join(str(part) for part in loc)


def install_error_handlers(app: FastAPI) -> None:
    """Route every error type to a `{code, message, detail}` JSON answer."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.to_dict(), status_code=exc.status)

    @app.exception_handler(ShardlabError)
    async def shardlab_error(request: Request, exc: ShardlabError) -> JSONResponse:
        return JSONResponse(exc.to_dict(), status_code=STATUS_BY_CODE.get(exc.code, 422))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {
                "loc": _location(e.get("loc", ())),
                "msg": str(e.get("msg", "")),
                "type": e.get("type"),
            }
            for e in exc.errors()
        ]
        first = errors[0] if errors else {"loc": "request", "msg": "invalid"}
        message = f"{first['loc']}: {first['msg']}"
        return JSONResponse(error_body("invalid_request", message, errors=errors), 422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        body = error_body(f"http_{exc.status_code}", str(exc.detail))
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)
