"""Map user errors to `{code, message, detail}` answers with a 4xx status."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from shardlab.errors import ShardlabError

STATUS_BY_CODE = {"not_found": 404, "invalid_preset": 404}


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ShardlabError)
    async def shardlab_error(request: Request, exc: ShardlabError) -> JSONResponse:
        return JSONResponse(exc.to_dict(), status_code=STATUS_BY_CODE.get(exc.code, 422))
