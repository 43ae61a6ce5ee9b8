"""Pieces every router's schemas share: the base of request bodies, the error body, bounded
row ids, error docs."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from fastapi import Path
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from shardlab.user_json import json_problem


class StrictRequest(BaseModel):
    """Base of every request body. Unknown fields are refused (a typo is a 422 naming it);
    types are strict (`"4"` is no id, `"true"` no flag; an int still does for a float); and
    before validation the whole input is walked (`shardlab.user_json`): a control character
    in any string or dict key, at any depth, or nesting deeper than `MAX_JSON_DEPTH`, is a
    422 naming where. `free_text` lists the fields (of this model, not of models nested in
    it) that may hold tab, newline and carriage return. A field JSON gives as text but that
    is no string (a datetime) says `Field(strict=False)`.

    Every string field has a `max_length` at most its column's (`backend.orm`): a longer one
    would be a database error on PostgreSQL (tests/api/test_strict_input.py checks them)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    free_text: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="before")
    @classmethod
    def _refuse_control_characters(cls, data: Any) -> Any:
        problem = json_problem(data, cls.free_text)
        if problem is None:
            return data
        message = problem.message
        if problem.kind == "too_deep":
            message = f"the JSON body is {message}"
        # `at` extends the error's location (`backend.errors` shows it: body.options.a)
        raise PydanticCustomError(
            problem.kind, "{problem}", {"problem": message, "at": problem.path}
        )


class ApiErrorBody(BaseModel):
    """Every 4xx answer: a stable `code`, a human `message`, and structured `detail`."""

    code: str
    message: str
    detail: dict[str, Any]


#: a row id (positive, fits the databases' 32-bit integer columns)
RowId = Annotated[int, Field(ge=1, le=2**31 - 1)]
#: a row id in a URL path: larger numbers are a 422, never a database overflow
PathId = Annotated[int, Path(ge=1, le=2**31 - 1)]
#: the largest row id (the databases' 32-bit INTEGER): query filters bound ids by it
MAX_ROW_ID = 2**31 - 1


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI documentation of error answers (`{code, message, detail}`)."""
    return {status: {"model": ApiErrorBody} for status in statuses}
