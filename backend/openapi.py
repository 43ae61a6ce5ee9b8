"""The OpenAPI document as the API really answers: every error is `{code, message, detail}`.

FastAPI documents request-validation failures as `{detail: [ValidationError]}`, but
`backend.errors` answers those (and every other 4xx) with `ApiErrorBody`. This module rewrites
the generated document once so that clients and the contract test see the real bodies:

- every documented 422 refers to `ApiErrorBody`;
- every operation under `/api` documents 401 (no or a bad token), every operation with a path
  parameter documents 404 (absent, or another team's), and a body-taking one 413 (too large).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from backend.schemas.common import ApiErrorBody

ERROR_REF = {"$ref": "#/components/schemas/ApiErrorBody"}
ERROR_DESCRIPTIONS = {
    "401": "Not authenticated: no, an unknown or a revoked token or session.",
    "404": "Not found, or it belongs to another team.",
    "413": "The request body is larger than the service accepts.",
    "422": "Invalid input: the message names the field, value, dim or mesh axis.",
}
#: answer without authentication (the preset catalog is public)
PUBLIC_PATHS = ("/api/presets", "/api/openapi.json")


def _error_response(status: str) -> dict[str, Any]:
    return {
        "description": ERROR_DESCRIPTIONS[status],
        "content": {"application/json": {"schema": ERROR_REF}},
    }


def _document_errors(path: str, operation: dict[str, Any]) -> None:
    responses: dict[str, Any] = operation.setdefault("responses", {})
    if "422" in responses:
        responses["422"] = _error_response("422")
    if path.startswith("/api/") and not path.startswith(PUBLIC_PATHS):
        responses.setdefault("401", _error_response("401"))
    if "{" in path:
        responses.setdefault("404", _error_response("404"))
    if "requestBody" in operation:
        responses.setdefault("413", _error_response("413"))


def install_openapi(app: FastAPI) -> None:
    """Replace `app.openapi` by a generator of the corrected document (built once, cached)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec = get_openapi(
                title=app.title, version=app.version, routes=app.routes, description=app.description
            )
            for path, item in spec.get("paths", {}).items():
                for method, operation in item.items():
                    if method in {"get", "put", "post", "delete", "patch"}:
                        _document_errors(path, operation)
            schemas = spec.setdefault("components", {}).setdefault("schemas", {})
            schemas["ApiErrorBody"] = ApiErrorBody.model_json_schema()
            for unused in ("HTTPValidationError", "ValidationError"):
                schemas.pop(unused, None)
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
