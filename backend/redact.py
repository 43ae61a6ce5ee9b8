"""Secrets out of the server's logs: uvicorn's access log writes each request's path with its
query string, and the one-time login link (`GET /api/auth/login?link=SECRET`) carries its
secret there. `RedactSecrets` replaces the values of `SECRET_PARAMS` in the arguments of every
record with `[REDACTED]`; `uvicorn_log_config` is uvicorn's default logging configuration
with that filter on its handlers (`shardlab serve` passes it to uvicorn).

The first admin's link, printed once on stderr at the first start, is not a log record and is
meant for the operator: it stays.
"""

from __future__ import annotations

import copy
import logging
import re
from typing import Any

#: query parameters whose values are secrets
SECRET_PARAMS = ("link", "token", "access_token", "secret", "password")
REDACTED = "[REDACTED]"
_SECRET_VALUE = re.compile(
    r"(?i)([?&](?:" + "|".join(re.escape(p) for p in SECRET_PARAMS) + r")=)[^&#\s\"]*"
)


def redact(text: str) -> str:
    """`text` with the values of secret query parameters replaced by `[REDACTED]`."""
    return _SECRET_VALUE.sub(lambda m: m.group(1) + REDACTED, text)


class RedactSecrets(logging.Filter):
    """Redact secret query parameters in a record's message and arguments (it keeps them
    arguments: uvicorn's access formatter unpacks them)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        elif isinstance(record.args, dict):
            args = record.args.items()
            record.args = {k: redact(v) if isinstance(v, str) else v for k, v in args}
        return True


def uvicorn_log_config() -> dict[str, Any]:
    """uvicorn's default logging configuration with `RedactSecrets` on every handler."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config.setdefault("filters", {})["redact_secrets"] = {"()": f"{__name__}.RedactSecrets"}
    for handler in config["handlers"].values():
        handler.setdefault("filters", []).append("redact_secrets")
    return config
