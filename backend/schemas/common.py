"""Pieces every router's schemas share: the error body, bounded row ids, error docs."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path
from pydantic import BaseModel, Field


class ApiErrorBody(BaseModel):
    """Every 4xx answer: a stable `code`, a human `message`, and structured `detail`."""

    code: str
    message: str
    detail: dict[str, Any]


#: a row id (positive, fits the databases' 32-bit integer columns)
RowId = Annotated[int, Field(ge=1, le=2**31 - 1)]
#: a row id in a URL path: larger numbers are a 422, never a database overflow
PathId = Annotated[int, Path(ge=1, le=2**31 - 1)]


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI documentation of error answers (`{code, message, detail}`)."""
    return {status: {"model": ApiErrorBody} for status in statuses}
