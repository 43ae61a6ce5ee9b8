"""Control characters in path parameters and query strings: a 422 before anything reads them.

`refuse_control_characters` is a dependency of every route (`backend.app`): a path parameter
or a query parameter (name or value, known to the route or not) holding a C0 control
character or DEL is answered 422 `invalid_request` naming it (`path.name`, `query.name`),
as request bodies are (`backend.schemas.common.StrictRequest`). PostgreSQL cannot compare
or store text with NUL, and no name in Shardlab holds a control character.
"""

from __future__ import annotations

from fastapi import Request

from backend.errors import ApiError
from shardlab.user_json import JsonProblem, string_problem


def _problem(where: str, key: str, value: str) -> JsonProblem | None:
    """A control character in a parameter's name (a query's) or value, located there."""
    bad_key = string_problem(key) if where == "query" else None
    if bad_key is not None:
        return JsonProblem(bad_key.kind, (where,), f"the parameter name {bad_key.message}")
    return string_problem(value, (where, key))


def _invalid(problem: JsonProblem) -> ApiError:
    loc = ".".join(str(part) for part in problem.path)
    error = {"loc": loc, "msg": problem.message, "type": problem.kind}
    return ApiError(422, "invalid_request", f"{loc}: {problem.message}", errors=[error])


async def refuse_control_characters(request: Request) -> None:
    """422 for a control character in any path or query parameter of the request (`async`:
    no I/O, so it runs in the event loop, not in a thread)."""
    params = [("path", k, v) for k, v in request.path_params.items() if isinstance(v, str)]
    params += [("query", k, v) for k, v in request.query_params.multi_items()]
    for where, key, value in params:
        problem = _problem(where, key, value)
        if problem is not None:
            raise _invalid(problem)
