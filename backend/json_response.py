"""The service's JSON answers: `SafeJSONResponse` is every route's response class.

Starlette's JSONResponse raises while rendering content that holds a lone surrogate (UTF-8
cannot encode it) or a non-finite float (JSON has no form for it), which turns a read into
a 500 for as long as the record exists. The door refuses both (`shardlab.user_json`); this
class is the other half: what got stored anyway (before the door existed, or computed by
the engine) is answered with U+FFFD and null in their place (`user_json.readable`), on the
slow path only, so clean answers cost what they always did.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi.responses import JSONResponse

from shardlab.user_json import readable


def render_json(content: Any) -> bytes:
    """`content` as compact UTF-8 JSON, as Starlette writes it; never fails on surrogates or
    non-finite numbers."""
    try:
        text = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        return text.encode("utf-8")
    except (UnicodeEncodeError, ValueError):
        text = json.dumps(readable(content), ensure_ascii=False, separators=(",", ":"))
        return text.encode("utf-8")


class SafeJSONResponse(JSONResponse):
    """A JSONResponse that renders whatever a stored record holds (module docstring)."""

    def render(self, content: Any) -> bytes:
        return render_json(content)
